"""producer.testing.FakeWorker on fakeredis: answers stored exactly as the real worker stores them
(every kind, errors, chunks, duplicates, expiry, queue items that are no message), answer
functions, the thread mode, pause and run_until_empty, a take or a drain interrupted by Redis."""

from __future__ import annotations

import asyncio
import gc
import json
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery
from fastapi.testclient import TestClient

from producer import Client, ModelMismatch
from producer.http.app import create_app
from producer.testing import FAKE_META_KEY, Drained, FakeWorker, assert_ok
from vela2.api.schemas import Status, parse_row
from vela2.errors import ModelError
from vela2.wire import keys
from vela2.wire.messages import build_message
from vela2.wire.results import ANSWERED

MODEL = "vela2-demo"
QUEUE = keys.online_queue(MODEL)
ROW = {"id": "r-1", "task": "choice:boolq", "text": "The sky is green.",
       "questions": [{"question": "Is the sky green?", "options": ["yes", "no"]}]}
S1 = {"model": MODEL, "id": "s-1", "input": {"user": "Hi, I am Ann (ann@example.com).", "assistant": "Hello Ann."},
      "tasks": [{"name": "intent", "kind": "choice", "options": ["greet", "ask"]},
                {"name": "quality", "kind": "score", "options": ["1", "2", "3", "4"]},
                {"name": "policy", "kind": "set", "options": ["violence", "self-harm"]},
                {"name": "pii", "kind": "span", "labels": ["person", "email"], "fields": ["user"]},
                {"name": "topic", "kind": "classify", "labels": ["sports", "politics"]},
                {"name": "ents", "kind": "extract", "labels": ["company"]}]}


def _meta(redis, rid: str) -> dict:
    raw = redis.get(keys.result_key(rid))
    assert raw is not None, f"no result stored for {rid!r}"
    return json.loads(raw)


@pytest.mark.vela2(thread=False)
def test_stub_answers_every_kind_deterministically(vela2_client, vela2_fake_worker):
    rows = [ROW,
            {"id": "r-score", "task": "score:q", "text": "x", "questions": [{"options": ["1", "2", "4"]}]},
            {"id": "r-text-score", "task": "score:q", "text": "x", "questions": [{"options": ["low", "high"]}]},
            {"id": "r-set", "task": "set:s", "text": "x", "questions": [{"options": ["a", "b"]}]},
            {"id": "r-span", "task": "span:s", "text": "x", "questions": [{"labels": ["person"]}]}]
    ids = vela2_client.submit_many([*rows, S1])
    assert vela2_fake_worker.drain().answered == 6
    got = vela2_client.answers_many(ids, timeout_s=0)
    assert got["r-1"]["answers"][0] == {"question": 0, "task": "choice:boolq", "probs": {"yes": 0.5, "no": 0.5},
                                               "decision": "yes", "abstain_probability": 0.0}
    assert got["r-score"]["answers"][0]["expected"] == pytest.approx(7 / 3)
    assert "expected" not in got["r-text-score"]["answers"][0]
    assert got["r-set"]["answers"][0]["decision"] == ["a"]
    assert got["r-set"]["answers"][0]["probs"] == {"a": 0.5, "b": 0.5}
    assert got["r-span"]["answers"][0]["spans"] == [] and got["r-span"]["answers"][0]["probs"] == {"person": 0.0}
    tasks = got["s-1"]["tasks"]
    assert got["s-1"]["status"] == "ok" and list(tasks) == ["intent", "quality", "policy", "pii", "topic", "ents"]
    assert [t["kind"] for t in tasks.values()] == ["choice", "score", "set", "span", "classify", "extract"]
    assert tasks["topic"]["decision"] == "sports" and tasks["ents"]["spans"] == []
    meta = _meta(vela2_client.redis, "s-1")
    assert meta[FAKE_META_KEY] == "stub" and meta["status"] == "SUCCESS" and meta["result"] == got["s-1"]
    # the same request answered twice gives the same numbers (nothing random)
    assert vela2_fake_worker.drain().messages == 0


@pytest.mark.vela2(thread=False)
def test_invalid_requests_get_the_workers_error_results(vela2_client, vela2_fake_worker):
    bad_row = {**ROW, "id": "bad-row", "questions": [{"options": ["only one"]}]}
    other_model = {**S1, "id": "bad-model", "model": "another-model"}
    vela2_client.submit(bad_row, validate=False)
    vela2_client.redis.lpush(QUEUE, build_message([other_model], QUEUE).payload)  # what a client would refuse
    vela2_fake_worker.drain()
    with pytest.raises(ValueError) as refused:  # the message the validator gives: the worker's
        parse_row(bad_row)
    row = vela2_client.result("bad-row", timeout_s=0)
    assert row.status == Status.error and row.error.type == "invalid_request"
    assert row.error.message == str(refused.value)
    meta = _meta(vela2_client.redis, "bad-row")
    assert meta["status"] == "FAILURE" and meta["result"] == {
        "exc_type": "InvalidRequest", "exc_message": [str(refused.value)], "exc_module": "builtins"}
    answer = vela2_client.answer("bad-model", timeout_s=0)
    assert answer["status"] == "error" and answer["error"] == {
        "type": ModelMismatch.code,
        "message": "request names model 'another-model'; this worker serves 'vela2-demo'"}
    with pytest.raises(AssertionError, match="'bad-model' is 'error', not 'ok': model_mismatch: request names model"):
        assert_ok(answer)


@pytest.mark.vela2(thread=False, result_expires_s=120)
def test_write_once_chunks_duplicates_expiry_and_ttl(vela2_client, vela2_fake_worker):
    redis = vela2_client.redis
    rows = [{**ROW, "id": f"c-{i}"} for i in range(3)]
    vela2_client.submit(rows[0])
    assert vela2_fake_worker.drain().answered == 1
    first = redis.get(keys.result_key("c-0"))
    chunk = build_message([*rows, rows[1]], QUEUE, chunk=True)  # c-0 answered already, c-1 twice
    redis.lpush(QUEUE, chunk.payload)
    assert vela2_fake_worker.drain() == Drained(messages=1, answered=2, duplicates=1, dead_lettered=0)
    assert redis.get(keys.result_key("c-0")) == first  # write-once: the duplicate changed nothing
    summary = _meta(redis, chunk.id)
    assert summary["result"] == {"chunk": chunk.id, "ok": 2, "duplicate": 1, "repeated": 1}
    assert 0 < redis.ttl(keys.result_key("c-1")) <= 120
    assert redis.get(keys.submitted_key("c-0")).decode() == ANSWERED  # the tracked submission is answered
    late = build_message([{**S1, "id": "late"}], QUEUE, expires=datetime.now(UTC) - timedelta(seconds=1))
    redis.lpush(QUEUE, late.payload)
    vela2_fake_worker.drain()
    answer = vela2_client.answer("late", timeout_s=0)
    assert answer["status"] == "expired" and answer["error"]["type"] == "expired"
    assert vela2_client.status("late") == "answered"


@pytest.mark.vela2(thread=False, result_expires_s=600, online_result_expires_s=60)
def test_online_results_live_the_online_ttl_and_a_jobs_lines_the_jobs_as_on_the_worker(vela2_client,
                                                                                       vela2_fake_worker):
    from producer.jobs import job_lines, submit_job

    redis = vela2_client.redis
    vela2_client.submit({**ROW, "id": "on-1"})
    vela2_client.submit({**ROW, "id": "bf-1"}, backfill=True)
    job = submit_job(vela2_client, [json.dumps({**ROW, "id": "line-row"}).encode() + b"\n"])
    vela2_fake_worker.drain()
    line = f"{job.id}#0"
    assert 0 < redis.ttl(keys.result_key("on-1")) <= 60 and 0 < redis.ttl(keys.result_key("bf-1")) <= 60
    assert 60 < redis.ttl(keys.result_key(line)) <= 600
    assert 86_400 < redis.ttl(keys.submitted_key("on-1")) <= 86_460  # the answered marker: the result's + a day
    assert [(line["id"], ok) for line, ok in job_lines(vela2_client, job.id)] == [("line-row", True)]
    redis.delete(keys.result_key("on-1"))  # expired: the marker says so
    assert vela2_client.status("on-1") == "expired"


@pytest.mark.vela2(thread=False)
def test_queue_items_that_are_no_message_are_answered_or_dead_lettered(vela2_client, vela2_fake_worker):
    redis = vela2_client.redis
    redis.lpush(QUEUE, b"not json at all")
    protocol1 = {"body": json.dumps({"task": "vela2.score", "id": "p1-id", "args": [ROW]}), "headers": None,
                 "properties": {}, "content-type": "application/json"}
    redis.lpush(QUEUE, json.dumps(protocol1))
    done = vela2_fake_worker.drain()
    assert (done.messages, done.answered, done.dead_lettered) == (2, 1, 1)
    assert "protocol 1" in vela2_client.result("p1-id", timeout_s=0).error.message
    [dead] = [json.loads(x) for x in redis.lrange(keys.dead_letter(MODEL), 0, -1)]
    assert dead["item"] == "not json at all" and "not valid JSON" in dead["reason"]


def test_an_answer_function_and_its_failures(vela2_redis):
    def answer(row):
        if row.text == "boom":
            raise KeyError("no such thing")
        if row.text == "refuse":
            raise ModelError("the model failed")
        return [{"probs": {"yes": 0.9, "no": 0.1}, "decision": "yes", "abstain_probability": 0.01}]

    client = Client(redis=vela2_redis.client(), model=MODEL)
    worker = FakeWorker(vela2_redis.client(), answer=answer)
    ids = client.submit_many([ROW, {**ROW, "id": "boom", "text": "boom"}, {**ROW, "id": "refuse", "text": "refuse"}])
    worker.drain()
    got = client.results_many(ids, timeout_s=0)
    assert assert_ok(got["r-1"]).answers[0].probs == {"yes": 0.9, "no": 0.1}
    assert got["boom"].error.type == "model_error"
    assert got["boom"].error.message == "the answer function raised KeyError: 'no such thing'"
    assert (got["refuse"].error.type, got["refuse"].error.message) == ("model_error", "the model failed")
    assert _meta(client.redis, "r-1")[FAKE_META_KEY] == "answer"
    with pytest.raises(ValueError, match="answer must be 'stub', 'model' or a callable; got 'smart'"):
        FakeWorker(vela2_redis.client(), answer="smart")
    with pytest.raises(ValueError, match="needs checkpoint=DIR"):
        FakeWorker(vela2_redis.client(), answer="model")


def test_the_thread_answers_the_asyncio_client(vela2_async_client, vela2_fake_worker):
    async def main():
        rid = await vela2_async_client.submit(S1)
        answer = await vela2_async_client.answer(rid, timeout_s=5)
        await vela2_async_client.aclose()
        return answer

    assert assert_ok(asyncio.run(main()))["tasks"]["intent"]["decision"] == "greet"
    vela2_fake_worker.run_until_empty()
    assert vela2_fake_worker.requests == 1


def test_pause_and_run_until_empty(vela2_client, vela2_fake_worker):
    vela2_fake_worker.pause()
    ids = vela2_client.submit_many([{**ROW, "id": f"p-{i}"} for i in range(5)])
    left = r"5 messages queued, 0 taken and not stored, and 0 requests held after 0.2 s \(paused: True\)"
    with pytest.raises(TimeoutError, match=left):
        vela2_fake_worker.run_until_empty(timeout_s=0.2)
    vela2_fake_worker.resume()
    vela2_fake_worker.run_until_empty()
    assert all(r is not None for r in vela2_client.results_many(ids, timeout_s=0).values())


def test_the_http_route_and_celery_read_what_the_fake_worker_stored(vela2_redis, vela2_fake_worker):
    with TestClient(create_app(vela2_redis.url, MODEL, keys=None)) as http:
        posted = http.post("/v1/system_one", json=S1)
        assert posted.status_code == 200 and assert_ok(posted.json())["id"] == "s-1"
        assert http.get("/v1/results/s-1").json() == posted.json()
        empty_set = {**S1, "id": "s-2", "tasks": [{"name": "t", "kind": "set", "options": []}]}
        bad = http.post("/v1/system_one", json=empty_set)
        assert bad.status_code == 422  # refused by the route itself, before the queue
    client = Client(redis=vela2_redis.client(), model=MODEL)
    client.submit(ROW)
    client.submit({**ROW, "id": "bad", "text": " "}, validate=False)
    vela2_fake_worker.run_until_empty()
    app = Celery(broker=vela2_redis.url, backend=vela2_redis.url, set_as_current=False)
    try:
        assert app.AsyncResult("r-1").get(timeout=5) == client.answer("r-1", timeout_s=0)
        assert app.AsyncResult("s-1").get(timeout=5) == posted.json()
        failed = app.AsyncResult("bad")
        with pytest.raises(Exception, match="text is empty") as e:
            failed.get(timeout=5)
        assert type(e.value).__name__ == "InvalidRequest"
        failed.backend = None  # its __del__ must not talk to a Redis that is gone
        del failed, e
    finally:
        gc.collect()
        app.close()


def test_an_item_whose_take_reply_was_lost_is_still_answered(vela2_client, vela2_fake_worker):
    # a Redis restart can drop the reply of a take the server carried out: the item left its queue, the
    # thread never saw it (a BRPOP lost such items: the backfill restart test lost a 10-row chunk)
    import redis as redis_lib

    r = vela2_fake_worker.redis
    real_lmove, lost = r.lmove, []

    def lmove_reply_lost(src, dst, *args):
        item = real_lmove(src, dst, *args)
        if item is not None and not lost and src in vela2_fake_worker.queues:
            lost.append(item)
            raise redis_lib.exceptions.ConnectionError("connection lost while reading the reply")
        return item

    r.lmove = lmove_reply_lost
    rid = vela2_client.submit(ROW)
    vela2_fake_worker.run_until_empty(timeout_s=10)
    assert lost and vela2_fake_worker.redis_errors >= 1
    assert vela2_client.status(rid) == "answered" and vela2_fake_worker.requests == 1
    assert not r.keys("*fake-taking*")  # released once stored


def test_a_drain_a_redis_restart_interrupted_loses_nothing(vela2_client, vela2_redis):
    """drain() takes as the thread does (onto a taking list): a Redis error while it stores raises out of
    drain() and leaves the item taken; the next drain() answers it before anything else."""
    import redis as redis_lib

    worker = FakeWorker(vela2_redis.client())
    real, calls = worker.store.store, []

    def flaky(items, **kw):
        calls.append(items)
        if len(calls) == 1:
            raise redis_lib.exceptions.ConnectionError("Redis restarting")
        return real(items, **kw)

    worker.store.store = flaky
    first, second = vela2_client.submit_many([{**ROW, "id": "r-1"}, {**ROW, "id": "r-2"}])
    with pytest.raises(redis_lib.exceptions.ConnectionError):
        worker.drain()
    assert vela2_client.status(first) == "pending" and worker.queued() == 1
    assert worker._on_taking_lists() == 1  # the interrupted item: off its queue, not lost
    got = worker.drain()
    assert got.messages == 2 and got.answered == 2
    assert [x[0][0] for x in calls] == [first, first, second]  # the left item answered first
    assert vela2_client.status(first) == vela2_client.status(second) == "answered"
    assert worker._on_taking_lists() == 0 and worker.queued() == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_that_died_is_said_at_once_not_waited_on(vela2_client, vela2_fake_worker):
    def broken_store(items, **kw):
        raise ValueError("a bug in the fake")

    vela2_fake_worker.store.store = broken_store
    vela2_client.submit(ROW)
    with pytest.raises(RuntimeError, match=r"the fake worker's thread died: ValueError\('a bug in the fake'\)"):
        vela2_fake_worker.run_until_empty(timeout_s=30)


def test_a_model_answer_checks_the_checkpoints_name_as_the_worker_does(vela2_redis, demo_dir):
    """The worker checks a SystemOne request's model against its checkpoint's name, whatever its
    queues are called (--model); so does FakeWorker(answer="model")."""
    worker = FakeWorker(vela2_redis.client(), "queue-name", answer="model", checkpoint=demo_dir)
    client = Client(redis=vela2_redis.client(), model="queue-name")
    client.submit({**S1, "model": "vela2-demo"}, validate=False)
    worker.drain()
    assert assert_ok(client.answer("s-1", timeout_s=0))["model"] == "vela2-demo"


def test_a_redis_restart_between_taking_and_answering_loses_nothing(vela2_client, vela2_redis):
    """The thread took an item, then Redis went away while it read the duplicate / cancel state: the
    item is answered once Redis is back (a bare BRPOP had already removed it from the queue)."""
    import redis as redis_lib

    worker = FakeWorker(vela2_redis.client())
    real, calls = worker.store.admission, []

    def flaky(items):
        calls.append(items)
        if len(calls) == 1:
            raise redis_lib.exceptions.ConnectionError("Redis restarting")
        return real(items)

    worker.store.admission = flaky
    ids = vela2_client.submit_many([{**ROW, "id": f"r-{i}"} for i in range(3)])
    with worker:
        results = vela2_client.results_many(ids, timeout_s=10)
    assert all(r is not None and r.status == "ok" for r in results.values())
    assert worker.redis_errors == 1 and len(calls) == 4  # the interrupted item read again, then answered


def _assert_same_shape(a, b, path="answer"):
    """`a` and `b` have the same keys and value types, recursively (timings: the same keys): what code
    reading an answer relies on. Lists (spans, a set's decision) may differ in length; their items may not."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            if k != "timings":
                _assert_same_shape(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        pairs = zip(a, b, strict=True) if len(a) == len(b) else ((x, y) for x in a for y in b)
        for i, (x, y) in enumerate(pairs):
            _assert_same_shape(x, y, f"{path}[{i}]")
    else:
        assert type(a) is type(b), f"{path}: {type(a).__name__} {a!r} != {type(b).__name__} {b!r}"


def test_stub_answers_have_the_fields_and_types_of_the_models(vela2_redis, untrained_demo_dir):
    """For the same requests the stub's answers have every key the model's have (predict(), which the
    real worker's answers equal: test above), with the same types and the lengths the request fixes: served_by,
    gate_fired on PII spans, units and logits when asked, render with logits; and the stub's numbers are consistent."""
    import numpy as np

    from vela2.model.calibration import Calibration, choice_probs, sigmoid
    from vela2.text.rendering import split_words

    requests = [{**ROW, "logits": True},
                {"id": "r-score", "task": "score:q", "text": "x y", "logits": True,
                 "questions": [{"options": ["1", "2", "4"]}, {"options": ["a", "b"], "task": "set:s"}]},
                {"id": "r-pii", "task": "span:pii", "text": "I am Ann Lee, ann@example.com", "units": True,
                 "questions": [{"labels": ["person", "email"]}]},
                {"id": "r-pii-logits", "task": "span:pii", "text": "Café Müller, 東京 ok", "units": True,
                 "logits": True, "questions": [{"labels": ["person"]}, {"labels": ["place"], "task": "span:places"}]},
                {**S1, "units": True}]
    got = {}
    for kind in ("stub", "model"):
        redis = vela2_redis.client()
        redis.flushdb()
        client = Client(redis=redis, model=MODEL)
        worker = FakeWorker(redis, answer=kind, **({"checkpoint": untrained_demo_dir} if kind == "model" else {}))
        ids = client.submit_many(requests)
        assert worker.drain().answered == len(requests)
        got[kind] = client.answers_many(ids, timeout_s=0)
    stub, model = got["stub"], got["model"]
    for rid in stub:
        _assert_same_shape(assert_ok(stub[rid]), assert_ok(model[rid]), rid)
        mine_all, want_all = (r.get("answers") or list(r["tasks"].values()) for r in (stub[rid], model[rid]))
        # the lists whose length the request fixes: one logit per option, units per word
        for mine, want in zip(mine_all, want_all, strict=True):
            assert len(mine.get("logits", [])) == len(want.get("logits", [])), rid
            if "units" in want:
                assert mine["units"]["offsets"] == want["units"]["offsets"], rid  # the worker's word split
                for part in ("probs", "logits"):
                    lengths = [{k: len(v) for k, v in (x["units"].get(part) or {}).items()} for x in (mine, want)]
                    assert lengths[0] == lengths[1], (rid, part)
        assert stub[rid]["served_by"]["precision"] == model[rid]["served_by"]["precision"] == "fp32"
    assert stub["r-pii"]["answers"][0]["gate_fired"] is False and "gate_fired" not in stub["r-pii-logits"]["answers"][1]
    assert stub["r-1"]["render"]["offsets"] == model["r-1"]["render"]["offsets"]  # the worker's word split
    cal = Calibration()  # the stub's probabilities are its logits, calibrated as the worker calibrates them
    for rid in ("r-1", "r-score"):
        answer = stub[rid]["answers"][0]
        probs, abstain = choice_probs(np.array(answer["logits"]), cal.temperature(answer["task"]), len(answer["probs"]))
        assert list(answer["probs"].values()) == probs.tolist() and answer["abstain_probability"] == abstain == 0.0
    assert stub["r-score"]["answers"][1]["probs"] == {"a": 0.5, "b": 0.5}
    assert stub["r-score"]["answers"][1]["logits"] == [0.0, 0.0]
    for answer in stub["r-pii-logits"]["answers"]:
        units = answer["units"]
        assert units["offsets"] == split_words("Café Müller, 東京 ok").tolist()
        for label, logits in units["logits"].items():
            assert units["probs"][label] == sigmoid(np.array(logits) / cal.T_span).tolist() == [0.0] * 6
    assert stub["s-1"]["tasks"]["pii"]["units"]["offsets"] == model["s-1"]["tasks"]["pii"]["units"]["offsets"]


def test_a_started_fake_beats_as_a_live_worker_and_stop_takes_its_beat_away(vela2_redis):
    import time

    from producer.liveness import Liveness
    from vela2.wire import fleet

    vela2_redis = vela2_redis.client()
    on_demand = FakeWorker(vela2_redis, model=MODEL)
    on_demand.drain()
    assert fleet.live_workers(vela2_redis, MODEL) == []  # drain() alone is no running worker
    worker = FakeWorker(vela2_redis, model=MODEL).start()
    try:
        deadline = time.monotonic() + 10
        while not fleet.live_workers(vela2_redis, MODEL):
            assert time.monotonic() < deadline, "the started fake never beat"
            time.sleep(0.01)
        assert fleet.live_workers(vela2_redis, MODEL) == [{"worker": worker.worker_id}]
        worker.pause()  # a paused (busy) worker still beats: its last beat stays on record
        assert not Liveness(MODEL).absent(vela2_redis)
    finally:
        worker.stop()
    assert fleet.live_workers(vela2_redis, MODEL) == []
