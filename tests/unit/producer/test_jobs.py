"""Bulk jobs on fakeredis with the shipped FakeWorker: the record, the counters, cancel, results in order."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import fakeredis
import pytest

from producer import jobs as jobs_mod
from producer.client import Client
from producer.jobs import (
    PUSH_LINES,
    cancel_job,
    job_info,
    job_lines,
    list_jobs,
    submit_job,
)
from producer.jobs import output as jobs_output
from producer.jobs import submit as jobs_submit
from producer.testing import FakeWorker
from vela2.errors import InvalidRequest, JobNotFound
from vela2.wire.jobs import SUBMIT_STALE_S, request_wire_id
from vela2.wire.keys import job_key, jobs_key, result_key
from vela2.wire.results import read_results

MODEL = "vela2-demo"


def row(i: int | str, **kw) -> dict:
    return {"id": f"r-{i}", "task": "choice:boolq", "text": f"text {i}",
            "questions": [{"question": "Is it?", "options": ["yes", "no"]}], **kw}


def lines(objs: list) -> list[bytes]:
    return [(o if isinstance(o, str) else json.dumps(o)).encode() + b"\n" for o in objs]


@pytest.fixture
def redis() -> Iterator[fakeredis.FakeRedis]:
    r = fakeredis.FakeRedis()
    yield r
    r.flushall()


@pytest.fixture
def client(redis) -> Client:
    return Client(redis=redis, model=MODEL)


def test_a_mixed_file_becomes_a_job_whose_counts_are_exact_and_whose_results_come_in_input_order(redis, client):
    s1 = {"model": MODEL, "id": "s-1", "input": "Where is my refund?",
          "tasks": [{"name": "intent", "kind": "choice", "options": ["refund", "other"]}]}
    objs = [
        row(1),
        "not json",
        s1,
        {"custom_id": "c-1", "method": "POST", "url": "/v1/system_one", "body": row(2)},
        {"custom_id": "c-2", "body": [1, 2]},  # a body that is no object: an error line of the job
        "",  # blank: skipped
        [1, 2],  # no object
        row(1),  # the same id twice: both lines answered
        {"custom_id": "c-3", "body": {**row(3), "questions": [{"options": ["only-one"]}]}},  # invalid
    ]
    created = []
    done = submit_job(client, lines(objs), on_created=created.append, metadata={"owner": "me"})
    assert created == [done.id] and done.id.startswith("batch_")
    assert (done.lines, done.queued, done.invalid, done.blank) == (8, 4, 4, 1)
    info = job_info(client, done.id)
    assert info.status == "in_progress" and info.total == 8 and info.input_done
    assert info.counts == {"queued": 4, "ok": 0, "error": 4, "expired": 0, "cancelled": 0}
    assert info.metadata == {"owner": "me"}

    FakeWorker(redis, MODEL).drain()
    info = job_info(client, done.id)
    assert info.status == "completed" and info.ended_at is not None
    assert info.counts == {"queued": 0, "ok": 4, "error": 4, "expired": 0, "cancelled": 0}
    out = list(job_lines(client, done.id))
    assert len(out) == 8
    assert [line.get("id") if "custom_id" not in line else line["custom_id"] for line, _ in out] == [
        "r-1", "line-2", "s-1", "c-1", "c-2", "line-7", "r-1", "c-3"]
    assert [ok for _, ok in out] == [True, False, True, True, False, False, True, False]
    assert out[2][0]["tasks"]["intent"]["decision"] == "refund"  # a SystemOne answer, under its own id
    openai_ok, openai_bad = out[3][0], out[7][0]
    assert openai_ok["response"]["status_code"] == 200 and openai_ok["error"] is None
    assert openai_ok["response"]["body"]["id"] == "c-1" and openai_ok["id"] == request_wire_id(done.id, 3)
    assert openai_bad["response"]["status_code"] == 422 and openai_bad["error"]["code"] == "invalid_request"
    assert "line 9" in openai_bad["error"]["message"]
    assert out[1][0]["error"]["message"].startswith("line 2 is not valid JSON: Expecting")


def test_results_are_counted_once_when_a_message_is_delivered_twice(redis, client):
    done = submit_job(client, lines([row(i) for i in range(5)]), chunk_size=5)
    queue = "vela2.vela2-demo.backfill"
    redis.rpush(queue, redis.lindex(queue, 0))  # a redelivery of the same message
    FakeWorker(redis, MODEL).drain()
    info = job_info(client, done.id)
    assert info.status == "completed" and info.counts["ok"] == 5 and info.total == 5


def test_a_job_cancelled_halfway_answers_the_rest_cancelled_and_ends_with_exact_counts(redis, client):
    done = submit_job(client, lines([row(i) for i in range(40)]), chunk_size=4)
    worker = FakeWorker(redis, MODEL)
    assert worker.drain(max_messages=3).answered == 12
    info = cancel_job(client, done.id)
    assert info.status == "cancelling" and info.counts["ok"] == 12
    worker.drain()
    info = job_info(client, done.id)
    assert info.status == "cancelled"
    assert info.counts == {"queued": 0, "ok": 12, "error": 0, "expired": 0, "cancelled": 28}
    results = [line for line, _ in job_lines(client, done.id)]
    assert [r["status"] for r in results] == ["ok"] * 12 + ["cancelled"] * 28
    assert results[20]["id"] == "r-20" and results[20]["error"]["type"] == "cancelled"
    assert cancel_job(client, done.id).status == "cancelled"  # an ended job stays as it is


def test_a_job_cancelled_while_its_input_streams_in_ends_cancelled_without_a_worker(redis, client):
    n = 2 * PUSH_LINES + 10
    done = submit_job(client, lines([row(i) for i in range(n)]), on_created=lambda job: cancel_job(client, job))
    # the first push (PUSH_LINES lines) is queued before the cancel is seen; the rest is answered here
    assert done.queued == PUSH_LINES and done.cancelled == n - PUSH_LINES
    assert job_info(client, done.id).status == "cancelling"
    FakeWorker(redis, MODEL).drain()  # the queued ones: answered cancelled, never scored
    info = job_info(client, done.id)
    assert info.status == "cancelled" and info.counts["cancelled"] == n and info.counts["ok"] == 0


def test_submit_streams_its_input_and_results_stream_by_pages(redis, client, monkeypatch):
    n = 3 * PUSH_LINES

    def gen():
        for i in range(n):
            if i == 2 * PUSH_LINES:  # two pushes in Redis before the rest is even read
                assert int(redis.hget(job_key(created[0]), "total")) == 2 * PUSH_LINES
            yield json.dumps(row(i)).encode() + b"\n"

    created: list[str] = []
    done = submit_job(client, gen(), on_created=created.append)
    FakeWorker(redis, MODEL).drain()
    monkeypatch.setattr(jobs_output, "READ_PAGE", 100)
    mgets = []
    real = redis.mget
    monkeypatch.setattr(redis, "mget", lambda keys: mgets.append(len(keys)) or real(keys))
    assert [line["id"] for line, _ in job_lines(client, done.id)] == [f"r-{i}" for i in range(n)]
    assert max(mgets) == 100 and len(mgets) == -(-n // 100)


def test_client_cancel_answers_a_queued_request_cancelled_and_leaves_an_answered_one(redis, client):
    worker = FakeWorker(redis, MODEL)
    client.submit(row("done"))
    worker.drain()
    client.submit(row("waiting"))
    assert client.cancel(["r-done", "r-waiting"]) == ["r-waiting"]
    worker.drain()
    got = read_results(redis, ["r-done", "r-waiting"])
    assert got["r-done"].status == "ok"
    assert got["r-waiting"].status == "cancelled" and got["r-waiting"].error.type == "cancelled"


def test_status_is_derived_in_one_place_validating_then_failed_when_the_submitter_is_gone(redis, client):
    seen = {}

    def gen():
        seen["while"] = job_info(client, created[0]).status
        yield json.dumps(row(1)).encode()

    created: list[str] = []
    done = submit_job(client, gen(), on_created=created.append)
    assert seen["while"] == "validating"
    redis.hset(job_key(done.id), mapping={"input": "reading", "beat": time.time() - SUBMIT_STALE_S + 5})
    assert job_info(client, done.id).status == "validating"  # a submitter still beating
    redis.hset(job_key(done.id), "beat", time.time() - SUBMIT_STALE_S - 1)  # as if killed mid-upload
    assert job_info(client, done.id).status == "failed"


def test_a_failed_job_stays_failed_when_cancelled(redis, client):
    """Found by review: a cancel on a job whose submitter was gone made it `cancelling` for ever
    (its input can never be done, so it could never end): it reads `failed`, and its queued lines
    are still cancelled."""
    from producer.jobs import cancel_job

    created: list[str] = []

    def gen():
        yield json.dumps(row(1)).encode()
        redis.hset(job_key(created[0]), "beat", time.time() - SUBMIT_STALE_S - 1)  # as if killed here
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        submit_job(client, gen(), on_created=created.append)
    assert job_info(client, created[0]).status == "failed"
    assert cancel_job(client, created[0]).status == "failed"
    # the cancel still reaches the lines it had queued: a worker skips them (ADMIT_SCRIPT)
    assert redis.hget(job_key(created[0]), "cancel_at") is not None
    assert job_info(client, created[0]).ended
    # a cancel asked while it was alive: once its submitter is gone it is failed too, not cancelling
    live = submit_job(client, lines([row(2)]))
    redis.hset(job_key(live.id), mapping={"input": "reading", "beat": time.time()})
    assert cancel_job(client, live.id).status == "cancelling"
    redis.hset(job_key(live.id), "beat", time.time() - SUBMIT_STALE_S - 1)
    assert job_info(client, live.id).status == "failed"


def test_a_slow_input_keeps_its_job_beating(redis, client, monkeypatch):
    """Found by review: the beat came only with each push of PUSH_LINES lines, so a live submitter
    reading a slow input read `failed` after SUBMIT_STALE_S."""
    monkeypatch.setattr(jobs_submit, "SUBMIT_BEAT_S", 0.02)
    created: list[str] = []

    def gen():
        yield json.dumps(row(1)).encode()
        first = float(redis.hget(job_key(created[0]), "beat"))
        deadline = time.monotonic() + 10
        while float(redis.hget(job_key(created[0]), "beat")) <= first:  # no push in between: the thread's beat
            assert time.monotonic() < deadline, "no beat while the input was slow"
            time.sleep(0.01)
        yield json.dumps(row(2)).encode()

    done = submit_job(client, gen(), on_created=created.append)
    assert done.lines == 2 and job_info(client, done.id).status in ("in_progress", "completed")


@pytest.mark.parametrize("metadata", [{"x": float("nan")}, {"x": float("inf")}, {"x": "\ud800"}])
def test_metadata_that_is_not_standard_json_is_refused(redis, client, metadata):
    """Found by review: NaN metadata made GET /v1/batches/{id} a 500; a lone surrogate a traceback."""
    with pytest.raises(InvalidRequest, match="metadata is not standard JSON text"):
        submit_job(client, lines([row(1)]), metadata=metadata)
    assert not redis.keys("vela2:job:*")


def test_list_and_tenants_and_unknown_jobs(redis, client):
    a = submit_job(client, lines([row(1)])).id
    b = submit_job(client, lines([row(2)])).id
    acme = Client(redis=redis, model=MODEL, tenant="acme")
    c = submit_job(acme, lines([row(3)])).id
    assert [j.id for j in list_jobs(client)] == [b, a]
    assert [j.id for j in list_jobs(acme)] == [c]
    with pytest.raises(JobNotFound):
        job_info(client, c)  # another tenant's
    redis.delete(job_key(a))  # expired: its index entry goes on the next list
    assert [j.id for j in list_jobs(client)] == [b]
    assert redis.zcard(jobs_key(MODEL)) == 2
    with pytest.raises(JobNotFound):
        cancel_job(client, "batch_nope")
    for bad in ("x" * 300, "\ud800", ""):  # ids no job can have: not found, never a raw error
        for call in (job_info, cancel_job):
            with pytest.raises(JobNotFound, match="no job"):
                call(client, bad)
    assert redis.exists(result_key(f"acme/{c}#0")) == 0  # scoped: the tenant's line ids carry it


@pytest.mark.parametrize(("kw", "message"), [
    ({"window_s": 0}, "window_s is 0; it must be > 0 and at most 2,592,000 s"),
    ({"window_s": float("nan")}, "window_s is nan"),
    ({"chunk_size": 0}, "chunk_size must be at least 1; got 0"),
    ({"metadata": {"x": "y" * 70_000}}, "metadata has 70,008 bytes of JSON; limit 65,536"),
])
def test_bad_arguments_name_the_limit_and_the_value_and_create_nothing(redis, client, kw, message):
    with pytest.raises(InvalidRequest, match=message.replace("(", r"\(")):
        submit_job(client, lines([row(1)]), **kw)
    assert redis.zcard(jobs_key(MODEL)) == 0


def test_the_worker_metrics_count_jobs_by_status(redis, client):
    from prometheus_client import generate_latest

    from worker.obs.metrics import Metrics

    a = submit_job(client, lines([row(1)])).id
    submit_job(client, lines([row(2)]))
    cancel_job(client, a)
    metrics = Metrics()
    metrics.describe_worker(model=MODEL, device="cpu", precision="fp32", redis=redis, queues=[])
    text = generate_latest(metrics.registry).decode()
    assert 'vela2_jobs{status="cancelling"} 1.0' in text and 'vela2_jobs{status="in_progress"} 1.0' in text
    FakeWorker(redis, MODEL).drain()
    text = generate_latest(metrics.registry).decode()
    assert 'vela2_jobs{status="cancelled"} 1.0' in text and 'vela2_jobs{status="completed"} 1.0' in text
    assert 'vela2_jobs{status="in_progress"} 0.0' in text


def test_a_job_whose_window_passed_ends_expired(redis, client):
    done = submit_job(client, lines([row(i) for i in range(3)]), window_s=0.001)
    FakeWorker(redis, MODEL).drain()  # past the window: answered expired, never scored
    info = job_info(client, done.id)
    assert info.status == "expired" and info.counts["expired"] == 3 and info.counts["ok"] == 0
    assert [line["status"] for line, _ in job_lines(client, done.id)] == ["expired"] * 3


def test_the_async_client_cancels_as_the_sync_one():
    import asyncio

    from producer.aio import AsyncClient

    server = fakeredis.FakeServer()
    redis = fakeredis.FakeRedis(server=server)
    Client(redis=redis, model=MODEL).submit(row("q"))

    async def go():
        a = AsyncClient(redis=fakeredis.FakeAsyncRedis(server=server), model=MODEL)
        try:
            return await a.cancel(["r-q", "r-q"])
        finally:
            await a.aclose()

    assert asyncio.run(go()) == ["r-q"]
    FakeWorker(redis, MODEL).drain()
    assert read_results(redis, ["r-q"])["r-q"].status == "cancelled"


def test_a_line_with_a_lone_surrogate_is_an_error_line_of_the_job(redis, client, tmp_path):
    """Valid JSON ("\\ud800") that UTF-8 cannot encode: its id used to make the push fail (a traceback,
    the job left half registered; HTTP 500), its task `jobs results`. Now an invalid_request line under
    the id as predict() gives it (escaped); the rest of the file goes through."""
    bad_id = '{"id": "bad\\ud800", "task": "choice:x", "text": "t", "questions": [{"options": ["a", "b"]}]}'
    bad_task = '{"id": "t-1", "task": "choice:x\\udc00", "text": "t", "questions": [{"options": ["a", "b"]}]}'
    done = submit_job(client, lines([row(1), bad_id, bad_task, row(2)]))
    assert (done.lines, done.queued, done.invalid) == (4, 2, 2)
    FakeWorker(redis, MODEL).drain()
    assert job_info(client, done.id).status == "completed"
    out = [line for line, _ in job_lines(client, done.id)]
    assert [line["id"] for line in out] == ["r-1", "bad\\ud800", "t-1", "r-2"]
    assert out[1]["error"] == {"type": "invalid_request",
                               "message": "line 2: id is not valid Unicode (lone surrogate at index 3)"}
    assert out[2]["task"] == "choice:x\\udc00" and "task is not valid Unicode" in out[2]["error"]["message"]
    assert jobs_mod.write_results(client, done.id, str(tmp_path / "out.jsonl")) == (4, 0)  # UTF-8: writable


def test_json_nested_too_deeply_is_an_error_line_of_the_job(redis, client):
    """5,000 levels of [ raised RecursionError (no ValueError) out of submit_job, the job left half registered."""
    done = submit_job(client, lines([row(1), "[" * 5000 + "]" * 5000, row(2)]) + [b'{"id": "x\xff"}\n'])
    assert (done.lines, done.queued, done.invalid) == (4, 2, 2)
    FakeWorker(redis, MODEL).drain()
    out = [line for line, _ in job_lines(client, done.id)]
    assert [line["id"] for line in out] == ["r-1", "line-2", "r-2", "line-4"]
    assert out[1]["error"]["message"] == "line 2 is nested deeper than 64 levels"
    assert out[3]["error"]["message"].startswith("line 4 is not valid JSON: 'utf-8' codec can't decode byte 0xff")


def test_results_timeout_that_is_not_a_finite_number_exits_2(tmp_path, capsys):
    """`--timeout-s nan` would wait for ever; refused before Redis is reached (port 1: that would exit 3)."""
    argv = ["results", "batch_x", str(tmp_path / "out.jsonl"), "--timeout-s", "nan", "--redis", "redis://127.0.0.1:1/0"]
    assert jobs_mod.main(argv) == 2
    assert capsys.readouterr().err == "vela2 jobs: --timeout-s must be a finite number of seconds >= 0; got nan\n"


def test_each_new_job_prunes_expired_entries_of_the_index(redis, client):
    """Found by review: entries of expired jobs left the index only when a listing of the same
    tenant walked past them, so jobs made over HTTP (no list route) grew it for ever."""
    acme = Client(redis=redis, model=MODEL, tenant="acme")
    old = [submit_job(acme, lines([row(i)])).id for i in range(40)]
    for j in old:
        redis.delete(job_key(f"acme/{j}"))  # expired
    assert redis.zcard(jobs_key(MODEL)) == 40
    submit_job(client, lines([row(99)]))  # another tenant's new job
    assert redis.zcard(jobs_key(MODEL)) == 40 - jobs_mod.PRUNE_OLDEST + 1
    submit_job(client, lines([row(98)]))
    assert redis.zcard(jobs_key(MODEL)) == 2  # only the live ones


def test_an_input_that_cannot_be_all_registered_fails_the_job_at_once_naming_why(redis, client):
    """Its reading raised, or it took longer than max_seconds: the job reads `failed` now (not after
    SUBMIT_STALE_S without a beat) with its reason, and what it queued is answered cancelled."""
    from vela2.errors import UploadTimeout

    def broken():
        yield from lines([row(1), row(2)])
        raise OSError("the upload's connection dropped")

    created: list[str] = []
    with pytest.raises(OSError, match="connection dropped"):
        submit_job(client, broken(), on_created=created.append)
    info = job_info(client, created[0])
    assert info.status == "failed" and "OSError: the upload's connection dropped" in info.failed_reason
    assert info.to_dict()["failed_reason"] == info.failed_reason

    created.clear()
    with pytest.raises(UploadTimeout, match=rf"longer than 0 s to register: 1,000 lines read, {PUSH_LINES} registered"):
        submit_job(client, lines([row(i) for i in range(2500)]), on_created=created.append, max_seconds=0.0)
    FakeWorker(redis, MODEL).drain()
    info = job_info(client, created[0])
    assert info.status == "failed" and info.failed_reason.startswith("UploadTimeout")
    assert info.total == PUSH_LINES and info.counts["cancelled"] == PUSH_LINES and info.counts["ok"] == 0
