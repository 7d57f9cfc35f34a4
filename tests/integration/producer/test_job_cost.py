"""Bad input costs what it weighs (issue 38): a bulk job of invalid lines stores no result per line.
Each invalid line's error answer lives in its job's ids entry, in full for the submission's first
JOB_ERROR_BYTES, then as a bare entry no bigger than a valid line's; the job ends, every line has its
error in the output, and Redis grows by a fixed cap plus a few dozen bytes a line (it was ~720 bytes
of stored result a line, kept a day)."""

from __future__ import annotations

import json

import redis as redis_lib

from producer.client import Client
from producer.jobs.output import job_lines
from producer.jobs.records import job_info
from producer.jobs.submit import submit_job
from vela2.wire.jobs import JOB_ERROR_BYTES

MODEL = "vela2-demo"
LINES = 30_000


def test_invalid_lines_cost_a_fixed_cap_not_a_result_each(redis_server_factory):
    server = redis_server_factory()
    r = redis_lib.Redis.from_url(server.url())
    client = Client(server.url(), model=MODEL)
    before_keys, before = r.dbsize(), r.info("memory")["used_memory"]
    done = submit_job(client, (b"{}\n" for _ in range(LINES)))  # 3 bytes a line: no text, no task
    assert (done.lines, done.invalid, done.queued) == (LINES, LINES, 0)
    grown = r.info("memory")["used_memory"] - before
    assert r.dbsize() - before_keys <= 3  # the job's hash, its ids list, the jobs index: no result keys
    assert grown <= JOB_ERROR_BYTES * 1.5 + 64 * LINES, f"{grown:,} bytes for {LINES:,} invalid lines"
    info = job_info(client, done.id)
    assert info.status == "completed" and info.counts["error"] == LINES
    out = [line for line, ok in job_lines(client, done.id, timeout_s=30)]
    assert len(out) == LINES and all(o["status"] == "error" for o in out)
    assert out[0]["error"]["type"] == "invalid_request" and "line 1" in out[0]["error"]["message"]
    assert "its error message was not kept" in out[-1]["error"]["message"]  # past the job's budget
    kept = sum("not kept" not in o["error"]["message"] for o in out)
    assert 0 < kept < LINES and json.dumps(out[0])  # the first lines keep their messages
    client.close()
    r.close()
