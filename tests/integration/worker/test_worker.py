"""The worker for real: redis-server + `celery -A worker.app worker` processes on the demo checkpoint.

Covers: answers equal predict() (all four types, bundles, windows, SystemOne, bulk chunks);
AsyncResult / plain GET readers; duplicates and deadlines; a batch that raises; malformed, unknown
and non-Celery messages; the start-up check; SIGKILL with requests buffered and mid-batch, then a
second worker; warm shutdown.
"""

from __future__ import annotations

import base64
import gc
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery

from producer.client import Client
from stack.faults import Faults
from vela2.api.schemas import RowResult, Status
from vela2.api.systemone import parse_request, to_answer, to_row
from vela2.train.demo_model import sample_rows
from vela2.wire.keys import UNACKED_KEY, online_queue, result_key
from vela2.wire.messages import build_message
from vela2.wire.results import read_results

pytestmark = pytest.mark.integration

MODEL = "vela2-demo"
QUEUE = online_queue(MODEL)
TEXT = (
    "Alice Smith from Acme wrote to bob@globex.com on Monday. She asked whether the refund "
    "for order 4471 was sent, and said the support team was very helpful."
)


def mixed_rows() -> list[dict]:
    """Rows of all four types, bundles (mixed types in one row) and windowed long texts."""
    rows = sample_rows()
    long_text = " ".join([TEXT] * 30)
    rows += [
        {
            "id": "long-choice",
            "task": "choice:oasst1",
            "text": long_text,
            "questions": [{"question": "Is it polite?", "options": ["yes", "no"]}],
        },
        {
            "id": "long-set",
            "task": "set:shield",
            "text": long_text,
            "questions": [{"options": ["violence", "hate", "privacy"]}],
        },
        {
            "id": "bundle-all",
            "task": "score:helpsteer2",
            "text": TEXT,
            "units": True,
            "questions": [
                {"options": ["0", "1", "2", "3", "4"]},
                {"task": "set:shield", "options": ["violence", "privacy"]},
                {"task": "choice:boolq", "question": "Is it a complaint?", "options": ["yes", "no"]},
                {"task": "span:pii_dev", "labels": ["person", "email", "company"]},
            ],
        },
        {"id": "bad-row", "task": "choice:boolq", "text": "x", "questions": [{"options": ["only-one"]}]},
    ]
    return rows


SYSTEM_ONE = {
    "model": MODEL,
    "id": "s1-req",
    "input": {"user": "I am Carol Diaz, email carol@initech.com, where is my refund?", "assistant": "It was sent."},
    "tasks": [
        {"name": "intent", "kind": "choice", "options": ["refund", "other"]},
        {"name": "pii", "kind": "span", "labels": ["person", "email"], "fields": ["user"]},
        {"name": "topic", "kind": "classify", "labels": ["finance", "support"]},
    ],
}


def assert_same_answers(got: RowResult, want: RowResult) -> None:
    """No decision or span-set difference; probabilities equal up to batch-shape float noise."""
    assert got.status == want.status, (got, want)
    if want.status != Status.ok:
        assert got.error == want.error
        return
    assert len(got.answers) == len(want.answers)
    for a, b in zip(got.answers, want.answers, strict=True):
        assert (a.question, a.task, a.decision, a.gate_fired) == (b.question, b.task, b.decision, b.gate_fired)
        assert a.probs.keys() == b.probs.keys()
        for k in a.probs:
            assert a.probs[k] == pytest.approx(b.probs[k], abs=1e-4)
        if b.abstain_probability is not None:
            assert a.abstain_probability == pytest.approx(b.abstain_probability, abs=1e-4)
        if b.spans is not None:
            assert {(s.label, s.start, s.end, s.text) for s in a.spans} == {
                (s.label, s.start, s.end, s.text) for s in b.spans
            }
        if b.units is not None:
            assert a.units.offsets == b.units.offsets


def _raw(redis, rid: str) -> dict | None:
    raw = redis.get(result_key(rid))
    return None if raw is None else json.loads(raw)


def wait_for(redis, ids: list[str], timeout_s: float) -> dict[str, RowResult | None]:
    deadline = time.monotonic() + timeout_s
    while True:
        got = read_results(redis, ids)
        if all(v is not None for v in got.values()) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@pytest.mark.parametrize(("cpu_processes", "device_process"), [(0, 0), (2, 0), (2, 1)],
                         ids=["render-threads", "render-processes", "device-process"])
def test_worker_answers_equal_predict(redis_url, start_worker, demo_model, cpu_processes, device_process):
    from vela2.scoring.predict import predict

    worker = start_worker(redis_url, cpu_processes=cpu_processes, device_process=device_process).wait_ready()
    assert (f"render / decode in {cpu_processes} processes" in worker.log()) == bool(cpu_processes)
    assert ("the model in a process of its own" in worker.log()) == bool(device_process)
    client = Client(redis_url, model=MODEL)
    rows = mixed_rows()
    singles, bulk = rows[::2], rows[1::2]
    ids = [client.submit(r, validate=False) for r in singles]  # bad rows reach the worker
    ids += client.submit_many(bulk, backfill=True, chunk_size=3, validate=False)
    s1_id = client.submit(SYSTEM_ONE)
    got = client.results_many([*ids, s1_id], timeout_s=120)
    assert all(v is not None for v in got.values()), [k for k, v in got.items() if v is None]

    want = predict(demo_model, singles + bulk, precision="fp32", max_batch_tokens=2048)
    for rid, w in zip(ids, want, strict=True):
        assert_same_answers(got[rid], w)
    assert got["bad-row"].status == Status.error and got["bad-row"].error.type == "invalid_request"

    parsed = parse_request(SYSTEM_ONE)
    (s1_want,) = predict(demo_model, [to_row(parsed, demo_model.calibration)], precision="fp32")
    assert_same_answers(got[s1_id], s1_want)
    stored = _raw(client.redis, s1_id)
    assert set(stored["result"]["tasks"]) == {"intent", "pii", "topic"}
    assert stored["result"]["tasks"]["intent"]["decision"] == to_answer(parsed, s1_want)["tasks"]["intent"]["decision"]

    # Any Celery client reads the same keys: AsyncResult.get() returns the row dict or raises.
    _celery_readers(redis_url, got, rows[0])

    # A duplicate delivery (the same message again) never changes the stored answer.
    before = client.redis.get(result_key("demo-choice"))
    client.redis.lpush(QUEUE, build_message([rows[0]], QUEUE).payload)
    # A request past its deadline is answered `expired`, not scored.
    late = client.submit({**rows[0], "id": "late"}, deadline_s=1e-6)  # past before any worker sees it
    assert client.result(late, timeout_s=30).status == Status.expired
    _wait_drained(client.redis)
    assert client.redis.get(result_key("demo-choice")) == before
    assert worker.terminate() == 0
    assert "skipped 1 duplicates" in worker.log()
    client.close()


def _celery_readers(redis_url: str, got: dict[str, RowResult], first_row: dict) -> None:
    app = Celery(broker=redis_url, backend=redis_url, set_as_current=False)
    try:
        assert app.AsyncResult("demo-choice").get(timeout=10) == got["demo-choice"].to_json_dict()
        failed = app.AsyncResult("bad-row")
        with pytest.raises(Exception, match="choice questions need at least 2 options") as e:
            failed.get(timeout=10)
        assert type(e.value).__name__ == "InvalidRequest"
        # The raised exception's traceback keeps `failed` alive past this test; its __del__ would
        # then unsubscribe from a Redis that is gone. Detach it from the backend now.
        failed.backend = None
        # ...and a message written by celery.send_task is answered like ours.
        sent = app.send_task("vela2.score", args=[{**first_row, "id": "via-celery"}], task_id="via-celery", queue=QUEUE)
        assert sent.get(timeout=30)["answers"][0]["decision"] == got[first_row["id"]].answers[0].decision
        del failed, sent, e
    finally:
        gc.collect()  # AsyncResult.__del__ talks to Redis: let it run while the server is up
        app.close()


def _wait_drained(redis, timeout_s: float = 30.0) -> None:
    """Until the online queue is empty and nothing is unacked."""
    deadline = time.monotonic() + timeout_s
    while redis.llen(QUEUE) or redis.hlen(UNACKED_KEY):
        assert time.monotonic() < deadline, (redis.llen(QUEUE), redis.hlen(UNACKED_KEY))
        time.sleep(0.05)


def test_bad_input_never_harms_a_batch_or_the_worker(redis_url, start_worker):
    # A long max_wait: the six rows pushed together surely share one batch, however busy the runner.
    worker = start_worker(redis_url, faults=Faults(fail_prefix="poison"), max_wait_ms=1000).wait_ready()
    client = Client(redis_url, model=MODEL)
    r = client.redis
    base = {"task": "choice:boolq", "text": TEXT, "questions": [{"options": ["yes", "no"]}]}
    # Same length, one bucket, one batch: it raises, is split, and only the poisoned row fails.
    ids = client.submit_many([{**base, "id": f"batch-{i}"} for i in range(5)] + [{**base, "id": "poison-1"}])
    # Messages the worker cannot score: body not JSON, unknown task, not a Celery message at all.
    env = json.loads(build_message([{**base, "id": "mangled"}], QUEUE).payload)
    env["body"] = base64.b64encode(b"{not json").decode()
    r.lpush(QUEUE, json.dumps(env))
    env = json.loads(build_message([{**base, "id": "unknown-task"}], QUEUE).payload)
    env["headers"]["task"] = "vela2.no_such_task"
    r.lpush(QUEUE, json.dumps(env))
    r.lpush(QUEUE, "this is not a message")
    r.lpush(QUEUE, json.dumps({"no": "envelope"}))
    after = client.submit({**base, "id": "after-garbage"})

    got = wait_for(r, [*ids, after], timeout_s=60)
    assert got["poison-1"].status == Status.error and got["poison-1"].error.type == "model_error"
    assert "simulated CUDA out of memory" in got["poison-1"].error.message
    assert all(got[i].status == Status.ok for i in ids if i != "poison-1")
    assert got["after-garbage"].status == Status.ok  # the worker survived the garbage
    mangled = _raw(r, "mangled")
    assert mangled["status"] == "FAILURE" and mangled["result"]["exc_type"] == "InvalidRequest"
    assert "not valid JSON" in mangled["result"]["exc_message"][0]
    unknown = _raw(r, "unknown-task")  # refused by name: no other task ever runs here
    assert unknown["status"] == "FAILURE"
    assert "'vela2.no_such_task' is not served here" in unknown["result"]["exc_message"][0]
    _wait_drained(r)
    dead = [json.loads(x) for x in r.lrange(f"{QUEUE}.dead", 0, -1)]  # the items without an id, kept
    assert sorted(d["item"] for d in dead) == ["this is not a message", '{"no": "envelope"}']
    log = worker.log()
    assert "splitting" in log and "queue item on vela2.vela2-demo refused" in log
    assert worker.terminate() == 0
    client.close()


def test_worker_refuses_a_visibility_timeout_shorter_than_its_worst_case(redis_url, start_worker):
    worker = start_worker(redis_url, visibility_timeout_s=0.5)
    assert worker.wait_exit(120) == 2  # never 0: a supervisor restarting on failure sees it
    log = worker.log()
    assert "vela2 worker: cannot start: visibility timeout 0.5 s is too short" in log
    assert "4 x worst batch" in log and "max(5 s" in log


def test_sigkill_with_requests_buffered_and_mid_batch_then_another_worker_answers_all(redis_url, start_worker):
    # Worker 1: a slow device (0.6 s per batch of two rows), a buffer of 3, a short visibility
    # timeout: when its first batch is done it holds two rows mid-batch and one buffered.
    slow = Faults(delay_s=0.6)
    w1 = start_worker(redis_url, faults=slow, visibility_timeout_s=20, max_buffered=3, max_batch_tokens=128)
    w1.wait_ready()
    client = Client(redis_url, model=MODEL)
    r = client.redis
    rows = [
        {"id": f"k-{i}", "task": "choice:boolq", "text": f"{TEXT} {i}", "questions": [{"options": ["yes", "no"]}]}
        for i in range(16)
    ]
    ids = client.submit_many(rows)
    deadline = time.monotonic() + 60
    while not any(read_results(r, ids).values()):  # the first batch is done, the next one running
        assert time.monotonic() < deadline, w1.log()[-3000:]
        time.sleep(0.02)
    held = r.hlen(UNACKED_KEY)
    w1.kill()
    answered_by_w1 = {k: r.get(result_key(k)) for k, v in read_results(r, ids).items() if v is not None}
    assert held > 0 and len(answered_by_w1) < len(ids)  # it died holding requests

    w2 = start_worker(redis_url, visibility_timeout_s=20, max_buffered=4).wait_ready()
    got = wait_for(r, ids, timeout_s=90)
    missing = [k for k, v in got.items() if v is None]
    assert not missing, f"{missing} still PENDING\n{w2.log()[-3000:]}"
    assert all(v.status == Status.ok for v in got.values())
    for k, raw in answered_by_w1.items():  # a redelivered, already answered request keeps its answer
        assert r.get(result_key(k)) == raw
    _wait_drained(r, timeout_s=30)
    assert w2.terminate() == 0
    client.close()


@pytest.mark.parametrize("device_process", [0, 1], ids=["device-thread", "device-process"])
def test_warm_shutdown_finishes_or_returns_everything_it_holds(redis_url, start_worker, device_process):
    slow = Faults(delay_s=0.5)
    # One row per batch, 0.5 s each: 8 held rows need 4 s; the shutdown timeout is 1 s.
    w1 = start_worker(redis_url, faults=slow, max_buffered=8, max_batch_tokens=64, shutdown_timeout_s=1,
                      device_process=device_process)
    w1.wait_ready()
    client = Client(redis_url, model=MODEL)
    r = client.redis
    rows = [
        {"id": f"t-{i}", "task": "choice:boolq", "text": f"{TEXT} {i}", "questions": [{"options": ["yes", "no"]}]}
        for i in range(12)
    ]
    ids = client.submit_many(rows, deadline_s=600)
    deadline = time.monotonic() + 60
    while r.hlen(UNACKED_KEY) < 8:  # the worker holds a full buffer
        assert time.monotonic() < deadline, w1.log()[-3000:]
        time.sleep(0.02)
    assert w1.terminate(60) == 0
    assert r.hlen(UNACKED_KEY) == 0  # nothing left in limbo
    answered = [k for k, v in read_results(r, ids).items() if v is not None]
    assert 0 < len(answered) < len(ids)
    assert r.llen(QUEUE) == len(ids) - len(answered)  # the rest is back in the queue
    line = next(x for x in w1.log().splitlines() if "engine stopped" in x)
    assert "returned" in line and "returned 0 " not in line

    w2 = start_worker(redis_url).wait_ready()
    got = wait_for(r, ids, timeout_s=60)
    assert all(v is not None and v.status == Status.ok for v in got.values())
    assert w2.terminate() == 0
    client.close()


def test_the_deadline_header_is_an_iso_time():
    msg = build_message([{"id": "d"}], QUEUE, expires=datetime.now(UTC) + timedelta(seconds=30))
    assert datetime.fromisoformat(json.loads(msg.payload)["headers"]["expires"]).tzinfo is not None


def test_a_live_worker_keeps_what_it_holds_past_the_visibility_timeout(redis_url, start_worker):
    # one row per 0.5 s batch and 44 held: the last waits ~22 s, past a 12 s visibility timeout and the
    # restore sweep kombu runs every 10 s, which without renewals would hand the held ones out again.
    # 12 s, not less: the worker refuses a timeout under 4 x its warm-up batch, which a loaded CI
    # machine has measured at 1.5 s
    worker = start_worker(redis_url, faults=Faults(delay_s=0.5), visibility_timeout_s=12, max_buffered=48,
                          max_batch_tokens=64, max_wait_ms=0).wait_ready()
    client = Client(redis_url, model=MODEL)
    base = {"task": "choice:boolq", "text": "Held for a long time.", "questions": [{"options": ["yes", "no"]}]}
    ids = client.submit_many([{**base, "id": f"held-{i}"} for i in range(44)])
    got = client.results_many(ids, timeout_s=120)
    assert all(v is not None and v.status == Status.ok for v in got.values())
    _wait_drained(client.redis)
    assert worker.terminate() == 0
    stats = worker.engine_stats()
    assert stats is not None and stats["answered"] == 44 and stats["duplicates"] == 0  # nothing came back twice
    client.close()
