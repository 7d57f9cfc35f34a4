"""bench.queue_bench end to end on this CPU: the cpu subcommand (ours vs plain Celery), and the gpu
and multi subcommands with tiny shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # bench/ is not an installed package; run from the repository
    sys.path.insert(0, str(ROOT))


RUN_TIMEOUT_S = 280
TINY = ["--device", "cpu", "--layers", "2", "--hidden", "128", "--copies", "1", "--tokenizer", "demo",
        "--max-batch-tokens", "8192", "--queue-warmup-rows", "8"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Run cpu, gpu (tiny) and multi (tiny, two workers sharing the CPU) at once; name -> JSON."""
    tmp = tmp_path_factory.mktemp("queue-bench")
    commands = {
        "cpu": ["cpu", "--rows", "120", "--repeats", "1", "--models", "null", "--cache-dir", str(tmp / "cache")],
        "gpu": ["gpu", *TINY, "--max-rows", "24", "--engine-warmup-rows", "8", "--latency-s", "2"],
        "multi": ["multi", *TINY, "--max-rows", "24", "--share-gpu", "--workers", "1,2", "--settle-s", "0.2"],
    }
    procs = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("VELA2_")}
    for name, args in commands.items():
        out = tmp / f"{name}.json"
        log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed below, after the process exits)
        cmd = [sys.executable, "-m", "bench.queue_bench", *args, "--out", str(out)]
        procs[name] = (subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log, out)
    docs = {}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        for name, (proc, log, out) in procs.items():
            try:
                code = proc.wait(max(1.0, deadline - time.monotonic()))
            finally:
                log.close()
            text = (tmp / f"{name}.log").read_text(errors="replace")
            assert code == 0, f"{name} exited with {code}:\n{text[-4000:]}"
            docs[name] = json.loads(out.read_text())
    finally:
        for proc, _, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return docs


@pytest.mark.integration
def test_cpu_compares_ours_with_plain_celery(runs):
    doc = runs["cpu"]
    assert doc["command"].startswith("python -m bench.queue_bench cpu --rows 120")
    assert {"platform", "cpu_count", "python"} <= set(doc["machine"])
    for side in ("ours", "plain_celery"):
        assert doc[side]["rows"] == 120
        assert doc[side]["answered"] == 120 and doc[side]["lost"] == 0, doc[side]
        assert doc[side]["seconds"] > 0 and doc[side]["rows_per_s"] > 0
    assert doc["ours"]["ok"] == 120
    assert doc["ours"]["kind"] == "null" and doc["ours"]["model"] == "vela2-null"
    assert doc["plain_celery"]["pool"] == "solo"
    assert doc["ratio_vs_plain_celery"] == pytest.approx(
        doc["ours"]["rows_per_s"] / doc["plain_celery"]["rows_per_s"], rel=1e-2)
    assert isinstance(doc["meets_target"], bool) and doc["notes"]
    # the worker scored the warm-up and the timed round, each row once
    assert doc["ours"]["worker_engine"]["answered"] == 240
    assert doc["ours"]["worker_engine"]["duplicates_skipped"] == 0
    assert [st["messages_acked"] > 0 for st in doc["ours"]["worker_engine"]["stats"]] == [True]


@pytest.mark.integration
def test_gpu_subcommand_runs_tiny_on_cpu(runs):
    doc = runs["gpu"]
    q = doc["queue_path"]
    assert q["rows"] == 24 and q["ok"] == 24 and q["lost"] == 0, q
    assert q["rows_per_s"] > 0 and doc["engine"]["rows_per_s"] > 0 and doc["engine"]["errors"] == 0
    assert q["ratio_vs_engine"] == pytest.approx(q["rows_per_s"] / q["engine_rows_per_s"], rel=1e-2)
    lat = doc["latency"]
    assert lat["requests"] > 0 and lat["answered"] == lat["requests"] and lat["lost"] == 0
    assert lat["statuses"] == {"ok": lat["requests"]}
    assert 0 < lat["latency_p50_ms"] <= lat["latency_p99_ms"]
    assert q["latency_p50_ms"] == lat["latency_p50_ms"] and q["max_wait_ms"] == 20.0
    assert lat["queue_ms_p50"] is not None and lat["model_ms_p50"] > 0
    assert doc["settings"]["random_weights"] == "1" and doc["settings"]["row_tokens"] == "2048"
    assert doc["model"]["layers"] == 2 and doc["model"]["hidden"] == 128
    assert doc["gpu"]["device"] == "cpu" and doc["command"].startswith("python -m bench.queue_bench gpu")
    assert [st["answered"] for st in doc["workers"]["engine_stats"]] == [8 + 24 + lat["requests"]]


@pytest.mark.integration
def test_multi_share_gpu_loses_nothing(runs):
    doc = runs["multi"]
    assert [r["workers"] for r in doc["runs"]] == [1, 2]
    for run in doc["runs"]:
        assert run["rows"] == 24 and run["ok"] == 24 and run["lost"] == 0, run
        assert run["answers_changed"] == 0
        assert all(d["device"] == "cpu" for d in run["devices"])
    assert doc["scaling_2x"] == pytest.approx(doc["runs"][1]["rows_per_s"] / doc["runs"][0]["rows_per_s"], rel=1e-2)
    assert doc["lost_total"] == 0 and doc["answers_changed_total"] == 0
    workers = doc["workers"]
    assert len(workers["engine_stats"]) == 2
    assert all(st["results"]["ok"] == st["answered"] and st["duplicates"] == 0 for st in workers["engine_stats"])
    assert workers["scored_total"] == workers["submitted_total"] == 8 + 24 + 16 + 24
    assert workers["answered_twice"] == 0
    assert doc["placement"] == "all workers share cpu"


