"""The Grafana dashboard and the alert rules of deploy/, checked by a real Prometheus (Debian's
`prometheus` package): promtool accepts the rules and the config, every alert fires in its scenario
of alert_scenarios.yml and none in a healthy one, and a Prometheus on loopback scraping a real
worker answers every dashboard query and every selector of every alert with data.

A CPU has no GPU memory to report: a second target, the worker's own Metrics in this process with
the GPU figures given, serves vela2_gpu_memory_bytes; every other selector must have series from
the real worker. Without prometheus installed these tests fail when CI is set (.ci/run installs it)
and are skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from producer.client import Client
from stack.faults import Faults
from stack.harness import die_with_parent, free_port
from tests.support import promql
from vela2.train.demo_model import sample_rows
from vela2.wire import keys
from vela2.wire.messages import build_message
from worker.obs.metrics import Metrics

MODEL = "vela2-demo"
HERE = Path(__file__).resolve().parent
DEPLOY_CONFIG = promql.ROOT / "deploy" / "prometheus.yml"
WORKER_JOB = "vela2-worker"  # deploy/prometheus.yml's job of the compose workers
GPU_JOB = "vela2-gpu-sample"  # the in-process target with GPU figures
CUDA_ONLY = {"vela2_gpu_memory_bytes"}  # what only a worker on a CUDA device exports
GPU_FIGURES = {"allocated": 24e9, "reserved": 30e9, "peak": 28e9, "total": 80e9}
DATA_DEADLINE_S = 240.0  # scrapes every second; generous for a loaded 2-core CI machine


def _binaries() -> tuple[str, str]:
    """(prometheus, promtool); fails when CI is set and they are missing, else skips."""
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus and promtool:
        return prometheus, promtool
    msg = "prometheus / promtool are not installed (apt-get install prometheus); these tests need them"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def _run(argv: list[str]) -> str:
    """Run a promtool command; its output, the test failing with it unless it exits 0."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{out}"
    return out


class Prometheus:
    """A prometheus server on a free loopback port with its own config and storage under `workdir`."""

    def __init__(self, binary: str, workdir: Path, config: dict[str, Any]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        argv = [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)

    def wait_ready(self, timeout_s: float = 60.0) -> Prometheus:
        """Block until /-/ready answers 200; fails with its log if it exits or takes longer."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log_path.read_text()}"
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready after {timeout_s} s:\n{self.log_path.read_text()}")

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>: its `data`; fails unless Prometheus says success (a bad query, say)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=30) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return list(data["result"])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL past 30 s."""
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Prometheus]]:
    """start_prometheus(config) -> a started (not yet ready) Prometheus, stopped after the test."""
    started: list[Prometheus] = []

    def start(config: dict[str, Any]) -> Prometheus:
        binary, _ = _binaries()
        workdir = tmp_path / f"prometheus{len(started)}"
        workdir.mkdir()
        started.append(Prometheus(binary, workdir, config))
        return started[-1]

    yield start
    for p in started:
        p.stop()


def _poll(what: str, missing: Callable[[], list[str]], timeout_s: float = DATA_DEADLINE_S) -> None:
    """Poll until `missing()` is empty; fails naming what is still missing at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (left := missing()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"{what} after {timeout_s:.0f} s:\n" + "\n".join(left)


# ---------------------------------------------------------------------------------------------
# promtool


def test_promtool_accepts_the_rules_and_the_config():
    _, promtool = _binaries()
    out = _run([promtool, "check", "rules", str(promql.ALERTS)])
    assert f"SUCCESS: {len(promql.alert_rules())} rules found" in out
    out = _run([promtool, "check", "config", str(DEPLOY_CONFIG)])
    assert "SUCCESS: 1 rule files found" in out and str(promql.ALERTS.relative_to(promql.ROOT)) in out


def test_every_alert_fires_in_its_scenario_and_none_in_a_healthy_fleet(tmp_path):
    _, promtool = _binaries()
    rules = {r["alert"]: r for r in promql.alert_rules()}
    doc = yaml.safe_load((HERE / "alert_scenarios.yml").read_text())
    healthy = doc["tests"][0]
    assert [c["alertname"] for c in healthy["alert_rule_test"]] == list(rules)  # every alert, none expected
    assert not any(c.get("exp_alerts") for c in healthy["alert_rule_test"])
    fired = {c["alertname"] for t in doc["tests"] for c in t["alert_rule_test"] if c.get("exp_alerts")}
    assert fired == set(rules), f"alerts no scenario fires: {sorted(set(rules) - fired)}"
    doc["rule_files"] = [str(promql.ALERTS)]
    for t in doc["tests"]:
        for case in t["alert_rule_test"]:
            for exp in case.get("exp_alerts", []):
                labels = {**exp["exp_labels"], "alertname": case["alertname"]}
                exp["exp_annotations"] = {k: promql.render(v, labels)
                                          for k, v in rules[case["alertname"]]["annotations"].items()}
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    assert "SUCCESS" in _run([promtool, "test", "rules", str(tmp_path / "alerts_test.yml")])


# ---------------------------------------------------------------------------------------------
# a Prometheus scraping a worker


def _gpu_sample(redis_url: str) -> Metrics:
    """The worker's Metrics as a CUDA worker's would be (the GPU figures given), served on loopback."""
    m = Metrics()
    m.describe_worker(model=MODEL, device="cuda:0", precision="bf16", redis=redis.Redis.from_url(redis_url),
                      queues=keys.queues(MODEL), gpu_memory_source=lambda: dict(GPU_FIGURES))
    m.serve(free_port())
    return m


def _answers(redis_url: str, rows: list[dict[str, Any]], *, invalid: bool = False) -> dict[str, str]:
    """Send `rows` (and, with `invalid`, a schema-invalid request "m-bad") and wait for their results:
    "ok" or the error type, by id."""
    client = Client(redis_url, model=MODEL)
    ids = [client.submit(r) for r in rows]
    if invalid:
        bad = {"id": "m-bad", "task": "choice:x", "text": "hi", "questions": [{"options": ["a", "b"]}], "extra": 1}
        client.redis.lpush(keys.online_queue(MODEL), build_message([bad], keys.online_queue(MODEL)).payload)
        ids.append("m-bad")
    answers = client.results_many(ids, timeout_s=180)
    assert all(a is not None for a in answers.values()), f"no result within 180 s: {answers}"
    return {i: a.status.value if a.status.value == "ok" or a.error is None else a.error.type
            for i, a in answers.items() if a is not None}


def _selector_has_series(prom: Prometheus, sel: promql.Selector) -> bool:
    """Whether `sel` selects series of the real worker (of the GPU sample for CUDA-only metrics; `up`
    of either)."""
    jobs = {s["metric"].get("job") for s in prom.query(str(sel))}
    return (GPU_JOB if sel.name in CUDA_ONLY else WORKER_JOB) in jobs


def _expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard query (variables filled) and every alert expression."""
    board = promql.dashboard()
    return ([(f"panel {title}", promql.fill(expr, {"model": MODEL})) for title, expr in promql.queries(board)]
            + [(f"alert {r['alert']}", r["expr"]) for r in promql.alert_rules()])


def test_a_real_prometheus_scraping_a_real_worker_answers_every_query(redis_url, start_worker, start_prometheus):
    assert WORKER_JOB in [j["job_name"] for j in yaml.safe_load(DEPLOY_CONFIG.read_text())["scrape_configs"]]
    port = free_port()
    worker = start_worker(redis_url, metrics_port=port, faults=Faults(fail_prefix="boom-"))
    gpu = _gpu_sample(redis_url)
    try:
        prom = start_prometheus({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(promql.ALERTS)],
            "scrape_configs": [
                {"job_name": WORKER_JOB, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
                {"job_name": GPU_JOB, "static_configs": [{"targets": [f"127.0.0.1:{gpu.server.server_port}"]}]},
            ],
        }).wait_ready()
        worker.wait_ready()
        # answers of every kind the panels and alerts read: ok, the caller's error (schema-invalid),
        # the worker's (a request whose batches raise, test fault, until it fails alone)
        rows = sample_rows()
        answers = _answers(redis_url, [*rows, dict(rows[0], id="boom-1")], invalid=True)
        assert answers == {**dict.fromkeys([r["id"] for r in rows], "ok"), "boom-1": "model_error",
                           "m-bad": "invalid_request"}
        _check_data(prom)
        # a counter's first sample is no increase: fail one more once Prometheus has seen the counters,
        # and the alerts on the rate of worker errors and of raising batches go pending
        assert _answers(redis_url, [dict(rows[0], id="boom-2")]) == {"boom-2": "model_error"}
        _poll("alerts the worker's errors should make pending", partial(_alerts_not_active, prom))
    finally:
        gpu.server.shutdown()
        gpu.server.server_close()


def _check_data(prom: Prometheus) -> None:
    """Every selector and dashboard query has data, the model variable lists the model, and every
    rule evaluates without error."""
    exprs = _expressions()
    selectors = {sel for _, expr in exprs for sel in promql.selectors(expr)}
    _poll("selectors without series of the worker",
          lambda: [str(s) for s in sorted(selectors, key=str) if not _selector_has_series(prom, s)])
    panels = [(where, expr) for where, expr in exprs if where.startswith("panel ")]
    _poll("dashboard queries without data", lambda: [f"{w}: {e}" for w, e in panels if not prom.query(e)])
    for _, expr in exprs:  # the alert conditions are normally false: they must evaluate, not hold
        prom.query(expr)
    # the $model variable: label_values(vela2_worker_info, model) (tests/unit/test_deploy.py)
    assert MODEL in prom.api("label/model/values", **{"match[]": "vela2_worker_info"})

    names = [r["alert"] for r in promql.alert_rules()]

    def rules_not_evaluated() -> list[str]:
        got = {r["name"]: r for g in prom.api("rules")["groups"] for r in g["rules"]}
        assert sorted(got) == sorted(names)
        return [f"{n}: {got[n]['health']} {got[n].get('lastError', '')}" for n in names if got[n]["health"] != "ok"]

    _poll("rules not evaluated cleanly", rules_not_evaluated)


def _alerts_not_active(prom: Prometheus) -> list[str]:
    """Which of the two alerts a worker error calls for are not pending or firing (their `for:` is
    minutes: pending); fails at once if an alert of a broken fleet is."""
    active = {a["labels"]["alertname"] for a in prom.api("alerts")["alerts"]}
    assert not active & {"Vela2NoLiveWorker", "Vela2WorkerTargetDown", "Vela2WorkerRestarting"}, active
    return sorted({"Vela2ServerErrors", "Vela2BatchesRaising"} - active)
