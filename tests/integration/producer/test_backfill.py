"""producer.backfill: OUT scanning and whole-line writes, bad lines and duplicates, timeouts and
deadlines, answers that expired before the backfill read them, the in-flight window checked against
Redis (10^4 rows), a Redis restart mid-run (and a Redis that never comes back), and resume after
SIGKILL of a real `python -m producer.backfill` process against a real worker."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from producer.backfill import EXIT_REDIS_UNAVAILABLE, run_backfill
from producer.backfill.lines import line_id
from producer.backfill.output import LineWriter, scan_out
from producer.backfill.run import count_lines
from vela2.api.schemas import content_id
from vela2.wire.keys import backfill_queue, result_key, submitted_key, tenant_list
from vela2.wire.messages import decode_body, decode_envelope

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
MODEL = "vela2-demo"
QUEUE = backfill_queue(MODEL)


def row(i: int, **kw) -> dict:
    base = {
        "id": f"row-{i}",
        "task": "choice:boolq",
        "text": f"Row {i}: the sky is green today.",
        "questions": [{"options": ["yes", "no"]}],
    }
    return {**base, **kw}


def write_jsonl(path: Path, lines: list) -> Path:
    with open(path, "w") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def read_out(path: Path) -> list[dict]:
    text = path.read_text()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_scan_out_truncates_only_a_torn_last_line(tmp_path):
    out = tmp_path / "out.jsonl"
    w = LineWriter(out)
    w.write({"id": "a", "status": "ok"})
    w.write({"id": "b", "status": "error"})
    w.close()
    whole = out.read_bytes()
    with open(out, "ab") as f:
        f.write(b'{"id": "c", "sta')  # a kill in the middle of a write
    done, torn = scan_out(out)
    assert done == {"a", "b"} and torn == len(b'{"id": "c", "sta')
    assert out.read_bytes() == whole
    assert scan_out(out) == ({"a", "b"}, 0)
    assert scan_out(tmp_path / "missing.jsonl") == (set(), 0)
    assert count_lines(out) == 2
    write_jsonl(tmp_path / "n.jsonl", ["x", "y"])
    (tmp_path / "m.jsonl").write_text("x\ny")
    assert count_lines(tmp_path / "n.jsonl") == 2 == count_lines(tmp_path / "m.jsonl")


def test_bad_lines_duplicates_and_system_one_requests(tmp_path, redis_url, fake_worker):
    fake_worker()
    s1 = {"model": MODEL, "input": "hello", "tasks": [{"name": "t", "kind": "set", "options": ["a"]}]}
    no_id = {k: v for k, v in row(99).items() if k != "id"}
    lines = [
        row(0),
        "{not json",
        row(1, questions=[{"options": ["yes"]}]),  # invalid: one option
        "[1, 2]",  # valid JSON, not an object
        row(0, text="a later duplicate of row-0"),
        s1,
        {**s1, "model": "other-model", "id": "s1-wrong"},
        no_id,
        "",
        row(2),
    ]
    inp = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    s = run_backfill(inp, out, redis_url=redis_url, model=MODEL, window=4, chunk_size=2, poll_s=0.01)
    got = {r["id"]: r for r in read_out(out)}
    assert list(Counter(r["id"] for r in read_out(out)).values()) == [1] * len(got)
    assert got["row-0"]["status"] == "ok" and got["row-0"]["answers"][0]["task"] == "choice:boolq"
    line2, line4 = line_id(2, b"{not json", None), line_id(4, b"[1, 2]", None)  # line-<N>-<hash of the line>
    assert line2.startswith("line-2-") and len(line2) == len("line-2-") + 12
    got["line-2"], got["line-4"] = got.pop(line2), got.pop(line4)
    assert got["line-2"]["error"]["type"] == "invalid_request"
    assert got["line-2"]["error"]["message"].startswith("line 2 is not valid JSON: Expecting")
    assert got["row-1"]["error"] == {
        "type": "invalid_request",
        "message": "line 3: questions[0]: choice questions need at least 2 options; got 1",
    }
    assert got["line-4"]["error"]["message"] == "line 4: a request must be a JSON object; got list"
    assert got[content_id(s1)]["status"] == "ok" and "tasks" in got[content_id(s1)]  # the SystemOne answer
    assert got["s1-wrong"]["error"]["type"] == "model_mismatch" and got["s1-wrong"]["version"] == "1"
    assert got[content_id(no_id)]["status"] == "ok"
    assert set(got) == {"row-0", "line-2", "row-1", "line-4", content_id(s1), "s1-wrong", content_id(no_id), "row-2"}
    assert (s.rows, s.blank, s.ok, s.error, s.invalid, s.duplicates, s.submitted) == (9, 1, 4, 4, 4, 1, 4)
    assert s.duplicate_ids == ["row-0"] and s.written == 8 and s.max_in_flight <= 4
    assert "duplicates 1 ['row-0']" in s.line() and "invalid 4" in s.line()

    again = run_backfill(inp, out, redis_url=redis_url, model=MODEL, window=4, chunk_size=2, poll_s=0.01)
    assert (again.skipped, again.written, again.duplicates) == (8, 0, 1)


def test_rows_without_a_result_become_timeout_errors_and_expired_rows_are_reported(tmp_path, redis_url, fake_worker):
    inp = write_jsonl(tmp_path / "in.jsonl", [row(i) for i in range(5)])
    out = tmp_path / "out.jsonl"
    s = run_backfill(inp, out, redis_url=redis_url, model=MODEL, window=2, chunk_size=1, timeout_s=0.2, poll_s=0.02)
    assert (s.timeout, s.error, s.ok) == (5, 5, 0)
    assert {r["error"]["type"] for r in read_out(out)} == {"timeout"} and len(read_out(out)) == 5
    assert "timeout 5" in s.line()

    # (the 5 timed-out messages are still queued: the rows below are new ones, behind them)
    inp2 = write_jsonl(tmp_path / "in2.jsonl", [row(i) for i in range(10, 15)])
    worker = fake_worker()
    worker.pause()  # the deadline passes before the worker takes anything
    out2 = tmp_path / "out2.jsonl"
    threading.Timer(0.4, worker.resume).start()
    s2 = run_backfill(
        inp2, out2, redis_url=redis_url, model=MODEL, window=10, chunk_size=5, deadline_s=0.1, poll_s=0.02
    )
    assert (s2.expired, s2.ok) == (5, 0)
    assert {r["status"] for r in read_out(out2)} == {"expired"}


class _HeldReads:
    """A redis client for the backfill whose MGETs after the first `free` ones wait until `go` is set
    (the test decides when the backfill reads results); everything else goes straight through."""

    def __init__(self, real, free: int):
        self.real = real
        self.free = free
        self.mgets = 0
        self.go = threading.Event()

    def __getattr__(self, name):
        return getattr(self.real, name)

    def mget(self, *args, **kw):
        self.mgets += 1
        if self.mgets > self.free:
            assert self.go.wait(60), "the test never released the reads"
        return self.real.mget(*args, **kw)


def _wait(cond, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_an_answer_that_expired_before_the_backfill_read_it_is_a_result_expired_line(
    tmp_path, redis_url, redis_server, fake_worker
):
    worker = fake_worker(result_expires_s=1)  # result_expires of 1 s
    s1 = {"model": MODEL, "id": "s1-gone", "input": "hello", "tasks": [{"name": "t", "kind": "set", "options": ["a"]}]}
    lines = [row(0), row(1), s1]
    inp = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    r = redis_server.client()
    held = _HeldReads(r, free=1)  # the recovery read before the push passes; the polls wait
    ids = ["row-0", "row-1", "s1-gone"]
    result: dict = {}
    job = threading.Thread(
        target=lambda: result.update(
            s=run_backfill(inp, out, model=MODEL, window=3, chunk_size=3, poll_s=0.01, timeout_s=60, redis=held)
        )
    )
    job.start()
    try:
        _wait(lambda: worker.requests == 3, "the worker to answer")
        _wait(lambda: not any(r.exists(result_key(i)) for i in ids), "the results to expire")
        assert {r.get(submitted_key(i)) for i in ids} == {b"answered"}
        held.go.set()
        job.join(60)
    finally:
        held.go.set()
        job.join(60)
    s = result["s"]
    got = {line["id"]: line for line in read_out(out)}
    assert set(got) == set(ids)
    for rid in ids:
        assert got[rid]["status"] == "error" and got[rid]["error"]["type"] == "result_expired"
        assert f"{rid!r} expired from the result store" in got[rid]["error"]["message"]
    assert got["row-0"]["task"] == "choice:boolq" and got["s1-gone"]["version"] == "1"  # each in its shape
    assert (s.result_expired, s.error, s.timeout, s.ok, s.written) == (3, 3, 0, 0, 3)
    assert "result_expired 3" in s.line()

    # A later run (into a new OUT) finds those answers expired: it scores them anew.
    worker.stop()
    fake_worker()  # results live the default online TTL (an hour) now
    out2 = tmp_path / "out2.jsonl"
    s2 = run_backfill(inp, out2, redis_url=redis_url, model=MODEL, window=3, chunk_size=3, poll_s=0.01, timeout_s=60)
    assert (s2.rescored, s2.submitted, s2.ok, s2.result_expired) == (3, 3, 3, 0)
    assert {line["status"] for line in read_out(out2)} == {"ok"}
    r.close()


def test_backfill_rides_out_a_redis_restart_mid_run(tmp_path, redis_server_factory, fake_worker, caplog):
    server = redis_server_factory(aof=True)  # appendonly: the restart keeps queue, markers and results
    worker = fake_worker(url=server.url(), delay_s=0.02)
    n_rows = 2000
    inp = write_jsonl(tmp_path / "in.jsonl", [row(i) for i in range(n_rows)])
    out = tmp_path / "out.jsonl"
    caplog.set_level(logging.INFO, logger="producer.backfill")
    result: dict = {}

    def run() -> None:
        try:
            result["s"] = run_backfill(
                inp, out, redis_url=server.url(), model=MODEL, window=40, chunk_size=10, poll_s=0.01,
                timeout_s=120, redis_timeout_s=90,
            )  # fmt: skip
        except BaseException as e:  # surfaced below
            result["error"] = e

    job = threading.Thread(target=run)
    job.start()
    try:
        _wait(lambda: out.exists() and out.read_bytes().count(b"\n") >= 200, "200 lines written", 60)
        server.stop()
        written_at_stop = out.read_bytes().count(b"\n")
        _wait(lambda: any("redis unreachable" in m for m in caplog.messages), "the backfill to hit the outage")
        server.start()
        job.join(180)
    finally:
        if not server.alive():
            server.start()
        job.join(180)
    assert "error" not in result, repr(result.get("error"))
    s = result["s"]
    assert written_at_stop < n_rows  # stopped mid-run
    assert s.redis_outages >= 1 and "redis outages" in s.line()
    assert any("redis is back" in m for m in caplog.messages)
    results = read_out(out)
    assert Counter(line["id"] for line in results) == Counter(f"row-{i}" for i in range(n_rows))  # each once
    assert all(line["status"] == "ok" for line in results) and s.ok == n_rows and s.timeout == 0
    assert worker.redis_errors > 0  # the worker saw the outage too, and carried on


def test_cli_exits_with_one_line_when_redis_never_comes_back(tmp_path):
    import socket

    with socket.socket() as sock:  # a free port: nothing listens there
        sock.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"
    inp = write_jsonl(tmp_path / "in.jsonl", [row(i) for i in range(3)])
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "vela2.cli", "backfill", str(inp), str(out), "--redis", dead]
    cmd += ["--redis-timeout-s", "1", "--no-progress", "--chunk-size", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_REDIS_UNAVAILABLE, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("vela2 backfill: redis unreachable for ") and "rerun the same command" in lines[0]
    assert proc.stdout == ""
    assert out.read_text() == ""  # nothing half-written


def _queued_rows(r) -> int:
    """Rows inside the messages waiting on the backfill queue (one LRANGE: an atomic snapshot)."""
    n = 0
    for payload in r.lrange(QUEUE, 0, -1):
        env = decode_envelope(payload)
        n += len(decode_body(env.body).requests)
    return n


def test_ten_thousand_rows_never_more_than_the_window_in_flight(tmp_path, redis_url, redis_server, fake_worker):
    n_rows, window, chunk = 10_000, 100, 20
    inp = write_jsonl(tmp_path / "in.jsonl", [row(i) for i in range(n_rows)])
    out = tmp_path / "out.jsonl"
    worker = fake_worker()
    worker.pause()
    r = redis_server.client()
    result: dict = {}
    job = threading.Thread(
        target=lambda: result.update(
            s=run_backfill(inp, out, redis_url=redis_url, model=MODEL, window=window, chunk_size=chunk, poll_s=0.005)
        )
    )
    job.start()
    try:
        # Worker stopped: the backfill fills the window and then holds; Redis shows exactly the window.
        deadline = time.monotonic() + 30
        while _queued_rows(r) < window and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        assert _queued_rows(r) == window
        # Worker running: rows queued + rows held by the worker never exceed the window.
        worker.resume()
        peak = 0
        while job.is_alive():
            with worker.lock:  # a consistent snapshot: nothing is popped or answered meanwhile
                peak = max(peak, _queued_rows(r) + worker.held)
            time.sleep(0.002)
        job.join()
    finally:
        worker.resume()
        job.join(60)
        r.close()
    s = result["s"]
    assert peak <= window
    assert s.max_in_flight == window and s.submitted == n_rows and s.ok == n_rows
    assert worker.requests == n_rows and worker.max_chunk == chunk
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert len(ids) == n_rows and set(ids) == {f"row-{i}" for i in range(n_rows)}


def test_resume_after_sigkill_writes_every_id_exactly_once(tmp_path, redis_url, real_worker):
    from vela2.train.demo_model import sample_rows

    real_worker(redis_url)
    templates = sample_rows()[:5]  # choice, score, set, pii span, bundle
    n_rows = 400
    rows = [
        {**templates[i % 5], "id": f"k-{i}", "text": templates[i % 5]["text"] + f" Case {i}."} for i in range(n_rows)
    ]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "producer.backfill", str(inp), str(out), "--redis", redis_url, "--model", MODEL]
    cmd += ["--window", "16", "--chunk-size", "4", "--poll-s", "0.02", "--no-progress", "--json"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while (not out.exists() or out.read_bytes().count(b"\n") < 60) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    done_before = out.read_bytes().count(b"\n")
    assert 60 <= done_before < n_rows, done_before  # killed midway
    with open(out, "ab") as f:
        f.write(b'{"id":"k-399","task":"choi')  # and, as a kill mid-write would leave it, a torn line

    rerun = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180, check=True)
    summary = json.loads(rerun.stdout.strip().splitlines()[-1])
    results = read_out(out)  # every line parses
    ids = Counter(r["id"] for r in results)
    assert ids == Counter(f"k-{i}" for i in range(n_rows))  # every id exactly once
    assert all(r["status"] == "ok" for r in results)
    assert summary["skipped"] == done_before and summary["written"] == n_rows - done_before
    assert summary["torn_bytes"] == len(b'{"id":"k-399","task":"choi')
    assert summary["submitted"] + summary["recovered"] == n_rows - done_before
    assert summary["max_in_flight"] <= 16


def test_a_deadline_out_of_bounds_exits_2_before_anything_is_queued(tmp_path, capsys):
    """Refused before Redis is even reached (none answers on port 1: that would exit 3)."""
    from producer.backfill import main

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    row = {"id": "a", "task": "choice:x", "text": "t", "questions": [{"options": ["a", "b"]}]}
    inp.write_text(json.dumps(row) + "\n")
    assert main([str(inp), str(out), "--redis", "redis://127.0.0.1:1/0", "--deadline-s", "1e12"]) == 2
    assert "deadline_s is 1000000000000.0; it must be > 0 and at most 2,592,000 s" in capsys.readouterr().err
    assert not out.exists() or out.read_text() == ""


@pytest.mark.parametrize(("args", "why"), [
    (["--wait-replicas", "-1"], "wait_replicas must be a whole number, 0 or more; got -1"),
    (["--broker", "amqp://guest:guest@127.0.0.1:1//", "--wait-replicas", "2"],
     "wait_replicas 2 counts replicas of a Redis broker; the broker is RabbitMQ"),
])
def test_wait_replicas_it_cannot_honour_exits_2_before_anything_is_queued(tmp_path, capsys, args, why):
    from producer.backfill import main

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    row = {"id": "a", "task": "choice:x", "text": "t", "questions": [{"options": ["a", "b"]}]}
    inp.write_text(json.dumps(row) + "\n")
    assert main([str(inp), str(out), "--redis", "redis://127.0.0.1:1/0", *args]) == 2
    assert why in capsys.readouterr().err
    assert not out.exists() or out.read_text() == ""


def test_a_row_whose_id_names_other_content_gets_an_id_conflict_line(tmp_path, redis_server, redis_url):
    """Never the other request's answer: an error line of type id_conflict; the same content under
    a stored id is recovered as before."""
    from vela2.api.schemas import RowResult, Status
    from vela2.wire.messages import request_digest
    from vela2.wire.results import ResultStore, row_meta

    base = {"task": "choice:x", "text": "first", "questions": [{"options": ["a", "b"]}]}
    client = redis_server.client()
    try:
        store = ResultStore(client)
        for rid in ("a", "b"):
            obj = {**base, "id": rid}
            res = RowResult(id=rid, task="choice:x", status=Status.ok, answers=[])
            store.store([(rid, row_meta(rid, res, digest=request_digest(obj)))])
        inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        lines_in = [{**base, "id": "a", "text": "second"}, {**base, "id": "b"}]
        inp.write_text("".join(json.dumps(r) + "\n" for r in lines_in))
        summary = run_backfill(inp, out, redis_url=redis_url, model="m", window=10, chunk_size=2, timeout_s=5)
        lines = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
        assert lines["a"]["status"] == "error" and lines["a"]["error"]["type"] == "id_conflict"
        assert lines["b"]["status"] == "ok"
        assert (summary.id_conflict, summary.recovered, summary.error, summary.submitted) == (1, 1, 1, 0)
        assert client.llen(backfill_queue("m")) == 0
    finally:
        client.close()


def test_a_tenants_backfill_queues_and_reads_its_own_ids(tmp_path, redis_server, redis_url):
    from vela2.api.schemas import RowResult, Status
    from vela2.wire.messages import request_digest
    from vela2.wire.results import ResultStore, row_meta

    base = {"task": "choice:x", "text": "t", "questions": [{"options": ["a", "b"]}]}
    client = redis_server.client()
    try:
        res = RowResult(id="acme/b", task="choice:x", status=Status.ok, answers=[])
        ResultStore(client).store([("acme/b", row_meta("acme/b", res, digest=request_digest({**base, "id": "b"})))])
        inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        inp.write_text("".join(json.dumps({**base, "id": i}) + "\n" for i in ("b", "c")))
        summary = run_backfill(inp, out, redis_url=redis_url, model="m", window=10, chunk_size=1, timeout_s=1,
                               tenant="acme")
        lines = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
        assert lines["b"]["status"] == "ok" and summary.recovered == 1  # its own stored answer, under "b"
        assert lines["c"]["error"]["type"] == "timeout"  # queued (no worker here) under acme/c
        (raw,) = client.lrange(tenant_list(backfill_queue("m"), "acme"), 0, -1)  # on acme's own list
        assert decode_body(decode_envelope(raw).body).requests[0]["id"] == "acme/c"
    finally:
        client.close()


def test_retry_timeouts_scores_again_the_rows_that_no_worker_answered(tmp_path, redis_url, fake_worker, caplog):
    caplog.set_level(logging.WARNING, logger="producer.backfill")
    inp = write_jsonl(tmp_path / "in.jsonl", [row(i) for i in range(6)])
    out = tmp_path / "out.jsonl"
    # no worker: every row times out, and the stall is reported once (the queue does not shrink)
    s = run_backfill(inp, out, redis_url=redis_url, model=MODEL, window=6, chunk_size=2, timeout_s=1.0,
                     poll_s=0.02, stall_warn_s=0.2)
    assert s.timeout == 6 and s.stall_warnings == 1
    warned = [m for m in caplog.messages if "is a worker running for model 'vela2-demo'" in m]
    assert len(warned) == 1 and "(0 live workers)" in warned[0] and f"queue {QUEUE} is not shrinking" in warned[0]
    assert run_backfill(inp, out, redis_url=redis_url, model=MODEL).skipped == 6  # a plain rerun skips them

    fake_worker()
    s2 = run_backfill(inp, out, redis_url=redis_url, model=MODEL, retry="timeouts", poll_s=0.02, stall_warn_s=0.2)
    assert s2.retried == 6 and s2.ok == 6 and s2.stall_warnings == 0
    lines = read_out(out)
    assert sorted(x["id"] for x in lines) == sorted(row(i)["id"] for i in range(6))  # each id once
    assert {x["status"] for x in lines} == {"ok"}


def test_retry_errors_drops_the_stored_failures_and_keeps_the_ok_lines(tmp_path, redis_url, fake_worker):
    from vela2.errors import ModelError

    def flaky(r):
        if r.id.endswith(("1", "3")):
            raise ModelError("the device fell over")
        return [{"probs": {"yes": 0.5, "no": 0.5}, "decision": "yes"}]

    inp = write_jsonl(tmp_path / "in.jsonl", [row(i) for i in range(4)])
    out = tmp_path / "out.jsonl"
    worker = fake_worker(answer=flaky)
    s = run_backfill(inp, out, redis_url=redis_url, model=MODEL, poll_s=0.02)
    assert (s.ok, s.error) == (2, 2)
    worker.stop()
    assert run_backfill(inp, out, redis_url=redis_url, model=MODEL, retry="timeouts").retried == 0  # no timeouts
    fake_worker()  # answers every row
    s2 = run_backfill(inp, out, redis_url=redis_url, model=MODEL, retry="errors", poll_s=0.02)
    assert (s2.retried, s2.skipped, s2.ok, s2.recovered) == (2, 2, 2, 0)
    by_id = {x["id"]: x for x in read_out(out)}
    assert len(read_out(out)) == 4 and {x["status"] for x in by_id.values()} == {"ok"}


def test_a_bad_retry_value_is_refused_by_name(tmp_path):
    from producer.backfill import main

    inp = write_jsonl(tmp_path / "in.jsonl", [row(0)])
    with pytest.raises(SystemExit):  # argparse: invalid choice
        main([str(inp), str(tmp_path / "out.jsonl"), "--retry", "everything"])
    from vela2.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="retry must be one of errors, timeouts; got 'all'"):
        run_backfill(inp, tmp_path / "out.jsonl", retry="all")


def test_a_real_row_called_line_n_is_never_shadowed_by_a_bad_lines_id(tmp_path, redis_url, fake_worker):
    """A bad line used to get the id `line-<N>`: a real row called `line-1` after a bad line 1 was then
    counted a duplicate and never scored, and a rerun skipped it as already in OUT (also after a kill
    that had written only the bad line's error)."""
    fake_worker()
    inp = write_jsonl(tmp_path / "in.jsonl", [
        "{not json",  # line 1: bad
        row(0, id="line-1"),  # a real row whose id happens to read like a line number
        row(0, id="line-4"),  # before the bad line 4
        "[1, 2]",  # line 4: bad
    ])
    out = tmp_path / "out.jsonl"
    s = run_backfill(inp, out, redis_url=redis_url, model=MODEL, poll_s=0.01)
    by_id = {r["id"]: r for r in read_out(out)}
    assert by_id["line-1"]["status"] == "ok" and by_id["line-4"]["status"] == "ok"
    bad = {line_id(1, b"{not json", None), line_id(4, b"[1, 2]", None)}
    assert {r["status"] for i, r in by_id.items() if i in bad} == {"error"} and len(by_id) == 4
    assert (s.ok, s.invalid, s.duplicates) == (2, 2, 0)

    # a run killed after the bad lines' errors were written, before the rows' answers: the rerun scores them
    out.write_text("".join(json.dumps(r) + "\n" for i, r in by_id.items() if i in bad))
    again = run_backfill(inp, out, redis_url=redis_url, model=MODEL, poll_s=0.01)
    assert (again.skipped, again.ok, again.duplicates) == (2, 2, 0)
    assert sorted(r["id"] for r in read_out(out)) == sorted(by_id)


def test_a_lone_surrogate_in_an_id_or_task_is_an_error_line_not_a_crash(tmp_path, redis_url, fake_worker):
    """Valid JSON ("\\ud800") that UTF-8 cannot write: the line used to crash the run in LineWriter (nothing
    written, every rerun crashing on it). Now an invalid_request line naming the problem, under a
    `line-<N>-…` id (the id as given cannot be written); the rest goes through and a rerun skips it."""
    fake_worker()
    bad_id = '{"id": "bad\\ud800", "task": "choice:x", "text": "t", "questions": [{"options": ["a", "b"]}]}'
    bad_task = '{"id": "t-1", "task": "choice:x\\udc00", "text": "t", "questions": [{"options": ["a", "b"]}]}'
    bad_s1 = ('{"id": "s\\ud800", "model": "vela2-demo", "input": "x", '
              '"tasks": [{"name": "t", "kind": "set", "options": ["a"]}]}')
    inp = write_jsonl(tmp_path / "in.jsonl", [row(0), bad_id, bad_task, bad_s1, row(1)])
    out = tmp_path / "out.jsonl"
    s = run_backfill(inp, out, redis_url=redis_url, model=MODEL, poll_s=0.01)
    by_id = {r["id"]: r for r in read_out(out)}
    assert by_id["row-0"]["status"] == "ok" and by_id["row-1"]["status"] == "ok"
    refused = by_id[line_id(2, bad_id.encode(), None)]["error"]
    assert refused == {"type": "invalid_request",
                       "message": "line 2: id is not valid Unicode (lone surrogate at index 3)"}
    assert by_id["t-1"]["task"] == "choice:x\\udc00"  # escaped, as predict() gives it
    assert "task is not valid Unicode" in by_id["t-1"]["error"]["message"]
    s1 = by_id[line_id(4, bad_s1.encode(), None)]
    assert s1["version"] == "1" and "id is not valid Unicode" in s1["error"]["message"]
    assert (s.ok, s.invalid, s.written) == (2, 3, 5)
    again = run_backfill(inp, out, redis_url=redis_url, model=MODEL, poll_s=0.01)
    assert (again.skipped, again.written) == (5, 0)


def test_json_nested_too_deeply_or_not_utf8_is_an_error_line(tmp_path, redis_url, fake_worker):
    """5,000 levels of [ raised RecursionError (no ValueError) out of the run; 990 levels decoded and
    then overflowed in content_id. Both are an invalid_request line now, as is a byte that is not UTF-8."""
    fake_worker()
    s1_deep = ('{"model": "vela2-demo", "tasks": [{"name": "t", "kind": "set", "options": ["a"]}], "input": '
               + '{"a": ' * 990 + '"x"' + "}" * 990 + "}")
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"\n".join([json.dumps(row(0)).encode(), b"[" * 5000 + b"]" * 5000, s1_deep.encode(),
                                b'{"id": "x\xff"}', json.dumps(row(1)).encode()]) + b"\n")
    out = tmp_path / "out.jsonl"
    s = run_backfill(inp, out, redis_url=redis_url, model=MODEL, poll_s=0.01)
    lines = read_out(out)
    assert sorted(r["id"] for r in lines if r["status"] == "ok") == ["row-0", "row-1"]
    errors = sorted(r["error"]["message"] for r in lines if r["status"] == "error")
    assert errors[:2] == [f"line {n} is nested deeper than 64 levels" for n in (2, 3)]
    assert errors[2].startswith("line 4 is not valid JSON: 'utf-8' codec can't decode byte 0xff")
    assert (s.ok, s.invalid) == (2, 3)


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("--poll-s", "-1", "--poll-s must be a finite number of seconds > 0; got -1"),
    ("--timeout-s", "nan", "--timeout-s must be a finite number of seconds > 0; got nan"),
    ("--stall-warn-s", "inf", "--stall-warn-s must be a finite number of seconds > 0; got inf"),
    ("--redis-timeout-s", "-0.5", "--redis-timeout-s must be a finite number of seconds >= 0; got -0.5"),
])
def test_a_duration_flag_out_of_bounds_exits_2_naming_the_flag(tmp_path, capsys, flag, value, why):
    """A negative --poll-s crashed in time.sleep mid-run; --timeout-s nan never timed out. Refused before
    Redis is reached (none answers on port 1: that would exit 3), in one line."""
    from producer.backfill import main
    from vela2.errors import InvalidRequest

    inp, out = write_jsonl(tmp_path / "in.jsonl", [row(0)]), tmp_path / "out.jsonl"
    assert main([str(inp), str(out), "--redis", "redis://127.0.0.1:1/0", flag, value]) == 2
    assert capsys.readouterr().err == f"vela2 backfill: {why}\n"
    assert not out.exists()
    name = flag[2:].replace("-", "_")
    with pytest.raises(InvalidRequest, match=f"^{name} must be a finite number of seconds"):
        run_backfill(inp, out, redis_url="redis://127.0.0.1:1/0", **{name: float(value)})
