"""`vela2 loadtest` against running deployments: a fake worker with a known pause per message (the
counts and the percentiles must show it), and a real worker on the demo checkpoint through the
command line, as a user runs it (nothing lost)."""

from __future__ import annotations

import json
import subprocess
import sys

from producer.loadtest.openloop import Plan, Target, run_point
from producer.loadtest.report import summarize
from stack.harness import ROOT, child_env

DELAY_S = 0.05


def test_counts_and_percentiles_show_a_fake_workers_known_pause(redis_url, fake_worker):
    """Every request offered in the window is counted once and answered; none can be faster than the
    worker's pause, and at a quarter of its capacity few wait long behind another."""
    fake_worker(delay_s=DELAY_S)  # one message at a time, each held DELAY_S before its answer is stored
    rate, window = 5.0, 6.0
    plan = Plan(Target("vela2-demo", redis_url=redis_url, timeout_s=20), "rows", "lt-", 7, rate, 1, 1.0, window, 0.0)
    outcomes = run_point(plan, processes=1)
    point = summarize(outcomes, rate, window)
    assert point["sent"] == len(outcomes) and 10 <= point["sent"] <= 60  # ~30 Poisson arrivals
    assert (point["ok"], point["errors"], point["lost"]) == (point["sent"], 0, 0)
    assert len({o.due_s for o in outcomes}) == point["sent"]  # each arrival counted once
    lat = point["latency_ms"]
    assert DELAY_S * 1e3 <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert lat["p50"] < DELAY_S * 1e3 + 250  # the pause plus the round trips, not a backlog
    assert all(o.due_s < window for o in outcomes)


def test_a_run_against_a_real_worker_loses_nothing(redis_url, real_worker, tmp_path):
    real_worker(redis_url)
    out = tmp_path / "lt.json"
    run = subprocess.run([sys.executable, "-m", "producer.loadtest.cli", "--redis", redis_url, "--model", "vela2-demo",
                          "--rates", "20", "--warmup-s", "1", "--duration-s", "4", "--processes", "2",
                          "--workload", "systemone", "--out", str(out)],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    report = json.loads(out.read_text())
    (point,) = report["points"]
    assert point["sent"] > 20 and point["ok"] == point["sent"] and point["lost"] == 0
    assert point["stages_ms"]["model_ms"]["p50"] > 0  # the worker's own timings came back
    assert report["command"].startswith("vela2 loadtest --redis") and "machine" in report
    assert "lost 0" in run.stdout
