"""Bulk jobs for real: redis-server, a `celery -A worker.app worker` process on the demo checkpoint, and
the `vela2 jobs` command line in processes of its own.

Submit (the submitting process follows the job, then is killed: the job goes on), status while it
runs, cancel halfway (ok + error + cancelled add up to N, and nothing the worker took after the
cancel is scored), results in input order, OpenAI-batch lines in and out.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import redis as redis_lib
from prometheus_client.parser import text_string_to_metric_families

from producer.client import Client
from producer.jobs import job_info
from stack.faults import Faults
from stack.harness import ROOT, child_env, free_port

pytestmark = pytest.mark.integration

MODEL = "vela2-demo"
MAX_BUFFERED = 2  # messages the worker holds at once
CHUNK = 2  # rows per message: the worker holds at most MAX_BUFFERED * CHUNK rows of a job


def row(i: int) -> dict:
    return {"id": f"r-{i}", "task": "choice:boolq", "text": f"The parcel {i} arrived late and damaged.",
            "questions": [{"question": "Is it a complaint?", "options": ["yes", "no"]}]}


def jobs_cli(redis_url: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vela2.cli", "jobs", *args, "--redis", redis_url], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=timeout_s)


def samples(port: int) -> dict[tuple[str, tuple], float]:
    """The worker's metrics: (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def wait_for(what: str, check, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def test_a_job_outlives_its_submitter_is_cancelled_halfway_and_reads_back_in_order(redis_url, start_worker,
                                                                                  tmp_path: Path):
    port = free_port()
    worker = start_worker(redis_url, faults=Faults(delay_s=0.3), max_buffered=MAX_BUFFERED,
                          metrics_port=port).wait_ready()
    n_rows = 80
    objs: list = [row(i) for i in range(n_rows)]
    objs[5] = {"custom_id": "oa-5", "body": row(5)}  # an OpenAI-batch line among rows
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(o) for o in objs) + "\n{not json\n")  # + one bad line
    n = n_rows + 1

    submitter = subprocess.Popen(
        [sys.executable, "-m", "vela2.cli", "jobs", "submit", str(src), "--redis", redis_url, "--chunk-size",
         str(CHUNK), "--wait"], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert submitter.stdout is not None
        job = submitter.stdout.readline().strip()  # the id comes first, before the input is read
        assert job.startswith("batch_"), job
        client = Client(redis_url, model=MODEL)
        running = wait_for("answers while running", lambda: (i := job_info(client, job)).counts["ok"] > 0 and i)
        assert running.status == "in_progress" and running.total == n and running.counts["error"] == 1
        status = jobs_cli(redis_url, "status", job)
        assert status.returncode == 0 and f"{job} in_progress: {n} lines" in status.stdout, status.stderr
        assert "rows/s, ETA" in status.stdout
    finally:
        submitter.kill()  # the submitting process goes: the job does not
        submitter.wait(10)
    before = job_info(client, job).counts["ok"]
    wait_for("the job to go on without its submitter", lambda: job_info(client, job).counts["ok"] >= before + 4)
    assert job_info(client, job).counts["ok"] < n_rows // 2  # still halfway

    cancel = jobs_cli(redis_url, "cancel", job)
    assert cancel.returncode == 0 and "cancelling" in cancel.stdout, cancel.stdout + cancel.stderr
    ok_at_cancel = int(cancel.stdout.split("ok ")[1].split(",")[0])
    info = wait_for("the job to end", lambda: (i := job_info(client, job)).ended and i)
    c = info.counts
    assert info.status == "cancelled" and info.total == n
    assert c["ok"] + c["error"] + c["cancelled"] == n and c["queued"] == 0 and c["expired"] == 0
    assert c["error"] == 1 and c["cancelled"] > 0
    # what the worker held when the cancel came finishes; nothing it takes after the cancel is scored
    assert c["ok"] - ok_at_cancel <= MAX_BUFFERED * CHUNK, (c, ok_at_cancel)
    # the job counts which model answered its ok lines (issue 23): one identity, every ok line
    assert list(info.served.values()) == [c["ok"]] and list(info.served)[0].startswith("vela2-demo ")

    out, err = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    res = jobs_cli(redis_url, "results", job, str(out), "--errors", str(err))
    assert res.returncode == 0, res.stderr
    ok_lines = [json.loads(x) for x in out.read_text().splitlines()]
    bad_lines = [json.loads(x) for x in err.read_text().splitlines()]
    assert len(ok_lines) == c["ok"] and len(bad_lines) == c["error"] + c["cancelled"]
    ids = [x.get("custom_id") or x["id"] for x in ok_lines + bad_lines]
    assert sorted(ids) == sorted([f"r-{i}" for i in range(n_rows) if i != 5] + ["oa-5", "line-81"])
    in_order = [f"r-{i}" if i != 5 else "oa-5" for i in range(n_rows)] + ["line-81"]
    for got in (ok_lines, bad_lines):  # each file in input order
        order = [x.get("custom_id") or x["id"] for x in got]
        assert order == [i for i in in_order if i in set(order)]
    assert all(x["status"] == "ok" and x["answers"][0]["decision"] in ("yes", "no")
               for x in ok_lines if "custom_id" not in x)
    assert bad_lines[-1]["id"] == "line-81" and bad_lines[-1]["error"]["type"] == "invalid_request"
    cancelled = [x for x in bad_lines if x.get("status") == "cancelled"]
    assert len(cancelled) == c["cancelled"] and all(x["error"]["type"] == "cancelled" for x in cancelled)
    # the worker's metrics: every cancelled request counted, and the job by its status
    got = samples(port)
    assert got[("vela2_requests_total", (("status", "cancelled"),))] == c["cancelled"]
    assert got[("vela2_jobs", (("status", "cancelled"),))] == 1
    assert got[("vela2_jobs", (("status", "in_progress"),))] == 0
    listing = jobs_cli(redis_url, "list", "--json")
    assert json.loads(listing.stdout.splitlines()[0])["id"] == job
    r = redis_lib.Redis.from_url(redis_url)
    assert r.llen("vela2.vela2-demo.backfill") == 0  # every message taken and acked
    worker.terminate()
    assert f"cancelled {c['cancelled']}" in worker.log()  # the worker's shutdown summary


def test_an_openai_batch_file_gives_openai_shaped_lines_in_input_order(redis_url, start_worker, tmp_path: Path):
    start_worker(redis_url).wait_ready()
    objs = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/system_one", "body": row(i)} for i in range(6)]
    objs.insert(3, {"custom_id": "bad", "body": {**row(9), "questions": []}})
    src = tmp_path / "batch.jsonl"
    src.write_text("".join(json.dumps(o) + "\n" for o in objs))
    sub = jobs_cli(redis_url, "submit", str(src), "--window-s", "600", "--metadata", '{"team": "x"}')
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    out = tmp_path / "out.jsonl"
    res = jobs_cli(redis_url, "results", job, str(out), "--timeout-s", "100")
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == [o["custom_id"] for o in objs]
    assert [x["response"]["status_code"] for x in lines] == [200, 200, 200, 422, 200, 200, 200]
    assert lines[0]["response"]["body"]["id"] == "req-0" and lines[0]["error"] is None
    assert lines[3]["error"]["code"] == "invalid_request"
    status = json.loads(jobs_cli(redis_url, "status", job, "--json").stdout)
    assert status["status"] == "completed" and status["metadata"] == {"team": "x"}
    assert status["request_counts"] == {"total": 7, "completed": 6, "failed": 1}
    assert status["completion_window"] == "10m"  # as OpenAI writes a window
    ((who, n),) = status["served_by"].items()
    assert n == 6 and who.split()[0] == "vela2-demo" and who.split()[2] == "fp32" and len(who.split()[1]) == 12
