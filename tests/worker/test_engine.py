"""The engine with a fake model pipeline and fakeredis: every rule without a device or a broker."""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest

from vela2.calibration import Calibration
from vela2.schemas import Answer, RowResult, Status, parse_row
from vela2.wire.keys import result_key
from vela2.wire.messages import build_message
from vela2.wire.results import ResultStore, read_results, row_meta
from worker.engine import Delivery, Engine, EngineSettings

QUEUE = "vela2.fake"


@dataclass
class FakeSeq:
    row_id: str
    window: int
    num_tokens: int


@dataclass
class FakePrep:
    row: Any
    sequences: list[FakeSeq]
    render_ms: float = 0.1


@dataclass
class FakePipeline:
    """prepare / run_batch / finish / pack with the real signatures; windows = ceil(words / 50)."""

    fail_ids: set[str] = field(default_factory=set)  # a batch holding one of these raises
    delay_s: float = 0.0
    batches: list[list[tuple[str, int]]] = field(default_factory=list)

    def prepare(self, model, obj):
        row = parse_row(obj)
        words = len(row.text.split())
        n = max(1, -(-words // 50))
        return FakePrep(row, [FakeSeq(row.id, w, min(50, words - 50 * w) + 10) for w in range(n)])

    def run_batch(self, model, sequences, precision, row_tokens=None):
        self.batches.append([(s.row_id, s.window) for s in sequences])
        if self.delay_s:
            time.sleep(self.delay_s)
        if any(s.row_id in self.fail_ids for s in sequences):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [("out", s.row_id, s.window) for s in sequences]

    def finish(self, model, prep, outputs, timings):
        assert [o[2] for o in outputs] == list(range(len(prep.sequences)))  # every window, in order
        row = prep.row
        answers = [
            Answer(question=q, task=row.question_task(q), probs={"windows": float(len(outputs))})
            for q in range(len(row.questions))
        ]
        return RowResult(
            id=row.id,
            task=row.task,
            status=Status.ok,
            answers=answers,
            timings={**timings, "render_ms": prep.render_ms, "decode_ms": 0.01},
        )


class Broker:
    """Deliveries with recorded acks / rejects; an ack checks the message's results are stored."""

    def __init__(self, redis):
        self.redis = redis
        self.acked: list[str] = []
        self.rejected: list[tuple[str, bool]] = []
        self.lock = threading.Lock()

    def delivery(self, requests, *, chunk=False, expires=None, body=None, headers=None) -> Delivery:
        msg = build_message(requests, QUEUE, chunk=chunk, expires=expires)
        env = json.loads(msg.payload)
        hdrs = {**env["headers"], **(headers or {})}
        raw = base64.b64decode(env["body"]) if body is None else body

        def ack():
            missing = [i for i in msg.request_ids if not self.redis.exists(result_key(i))]
            assert not missing, f"acked {msg.id} before results of {missing} were stored"
            with self.lock:
                self.acked.append(msg.id)

        def reject(requeue):
            with self.lock:
                self.rejected.append((msg.id, requeue))

        d = Delivery(headers=hdrs, body=raw, ack=ack, reject=reject)
        d.message_id = msg.id  # type: ignore[attr-defined]
        return d

    def wait(self, n: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.acked) + len(self.rejected) < n:
            assert time.monotonic() < deadline, f"only {self.acked} acked, {self.rejected} rejected of {n}"
            time.sleep(0.005)


def row(rid: str, words: int = 8, task: str = "choice:boolq", **kw) -> dict:
    text = " ".join(f"w{i}" for i in range(words))
    return {"id": rid, "task": task, "text": text, "questions": [{"options": ["yes", "no"]}], **kw}


@pytest.fixture
def redis():
    r = fakeredis.FakeRedis()
    yield r
    r.flushall()


def make_engine(redis, pipeline=None, **kw) -> tuple[Engine, FakePipeline, Broker]:
    pipeline = pipeline or FakePipeline()
    settings = EngineSettings(**{"max_batch_tokens": 1024, "max_wait_ms": 5.0, **kw})
    model = SimpleNamespace(name="fake", calibration=Calibration())
    engine = Engine(model, ResultStore(redis, ttl_s=600), settings, pipeline=pipeline)
    engine.start()
    return engine, pipeline, Broker(redis)


def test_rows_are_batched_answered_and_acked_after_storing(redis):
    engine, pipe, broker = make_engine(redis)
    ids = [f"r{i}" for i in range(12)]
    for rid in ids:
        engine.submit(broker.delivery([row(rid)]))
    broker.wait(12)
    engine.stop(5)
    assert sorted(broker.acked) == sorted(ids) and not broker.rejected
    results = read_results(redis, ids)
    assert all(r is not None and r.status == Status.ok for r in results.values())
    assert len(pipe.batches) < 12  # batched, not one by one
    t = results["r0"].timings
    assert set(t) == {"queue_ms", "render_ms", "model_ms", "decode_ms"}
    assert t["queue_ms"] >= 0 and t["model_ms"] >= 0
    assert 0 < redis.ttl(result_key("r0")) <= 600


def test_a_bad_request_gets_an_error_and_its_chunk_still_runs(redis):
    engine, pipe, broker = make_engine(redis)
    d = broker.delivery([row("ok-1"), {"id": "bad-1", "task": "choice:boolq", "text": "x"}, row("ok-2")], chunk=True)
    engine.submit(d)
    broker.wait(1)
    engine.stop(5)
    res = read_results(redis, ["ok-1", "bad-1", "ok-2"])
    assert res["ok-1"].status == res["ok-2"].status == Status.ok
    assert res["bad-1"].status == Status.error and res["bad-1"].error.type == "invalid_request"
    assert "questions" in res["bad-1"].error.message
    meta = json.loads(redis.get(result_key("bad-1")))
    assert meta["status"] == "FAILURE" and meta["result"]["exc_type"] == "InvalidRequest"
    summary = json.loads(redis.get(result_key(d.message_id)))  # the chunk id is not left PENDING
    assert summary["status"] == "SUCCESS"
    assert summary["result"]["ok"] == 2 and summary["result"]["error"] == 1
    assert broker.acked == [d.message_id]


def test_a_batch_that_raises_is_split_and_only_the_failing_request_fails(redis):
    pipe = FakePipeline(fail_ids={"poison"})
    engine, _, broker = make_engine(redis, pipe, max_wait_ms=50.0)
    ids = ["a", "b", "poison", "c", "d", "e"]
    for rid in ids:
        engine.submit(broker.delivery([row(rid)]))
    broker.wait(len(ids))
    engine.stop(5)
    res = read_results(redis, ids)
    assert res["poison"].status == Status.error
    assert res["poison"].error.type == "model_error"
    assert "RuntimeError: CUDA out of memory" in res["poison"].error.message
    assert all(res[i].status == Status.ok for i in ids if i != "poison")
    assert sorted(broker.acked) == sorted(ids)  # every message acked, none PENDING
    first = pipe.batches[0]
    assert len(first) == 6  # one batch first, then halves down to the poison alone
    assert [("poison", 0)] in pipe.batches
    assert engine.stats.batches_raised >= 2


def test_a_duplicate_delivery_never_changes_the_stored_answer(redis):
    engine, pipe, broker = make_engine(redis)
    store = ResultStore(redis)
    first = RowResult(id="dup", task="choice:boolq", status=Status.ok, answers=[])
    store.store([("dup", row_meta("dup", first))])
    before = redis.get(result_key("dup"))
    engine.submit(broker.delivery([row("dup")]))
    broker.wait(1)
    engine.stop(5)
    assert redis.get(result_key("dup")) == before
    assert broker.acked == ["dup"] and pipe.batches == []
    assert engine.stats.duplicates == 1


def test_an_expired_request_is_answered_expired_without_scoring(redis):
    engine, pipe, broker = make_engine(redis)
    engine.submit(broker.delivery([row("late")], expires=datetime.now(UTC) - timedelta(seconds=1)))
    engine.submit(broker.delivery([row("in-time")], expires=datetime.now(UTC) + timedelta(minutes=5)))
    broker.wait(2)
    engine.stop(5)
    res = read_results(redis, ["late", "in-time"])
    assert res["late"].status == Status.expired and "deadline" in res["late"].error.message
    assert json.loads(redis.get(result_key("late")))["status"] == "SUCCESS"
    assert res["in-time"].status == Status.ok
    assert all(rid != "late" for b in pipe.batches for rid, _ in b)


def test_a_malformed_body_gets_an_error_result_for_its_id(redis):
    engine, _, broker = make_engine(redis)
    engine.submit(broker.delivery([row("mangled")], body=b"{not json"))
    engine.submit(broker.delivery([row("wrong-shape")], body=b'{"args": 1}'))
    broker.wait(2)
    engine.stop(5)
    res = read_results(redis, ["mangled", "wrong-shape"])
    assert res["mangled"].error.type == "invalid_request" and "not valid JSON" in res["mangled"].error.message
    assert "[args, kwargs, embed]" in res["wrong-shape"].error.message
    assert sorted(broker.acked) == ["mangled", "wrong-shape"]


def test_an_oversized_message_is_refused_for_every_row_it_carries(redis):
    engine, pipe, broker = make_engine(redis, max_message_bytes=2000)
    big = broker.delivery([row("big-1", words=400), row("big-2")], chunk=True)
    engine.submit(big)
    broker.wait(1)
    engine.stop(5)
    res = read_results(redis, ["big-1", "big-2"])
    for r in res.values():
        assert r.status == Status.error and r.error.type == "limit_exceeded"
        assert "limit 2,000" in r.error.message
    assert pipe.batches == [] and broker.acked == [big.message_id]


def test_windows_of_one_row_may_run_in_different_batches(redis):
    # 4 windows of 60 tokens; a budget of 128 fits two per batch
    engine, pipe, broker = make_engine(redis, max_batch_tokens=128)
    engine.submit(broker.delivery([row("long", words=200)]))
    broker.wait(1)
    engine.stop(5)
    assert len(pipe.batches) >= 2
    res = read_results(redis, ["long"])["long"]
    assert res.status == Status.ok and res.answers[0].probs == {"windows": 4.0}


def test_a_system_one_request_is_answered_with_its_answer_and_row_result(redis):
    engine, _, broker = make_engine(redis)
    req = {
        "model": "fake",
        "id": "s1",
        "input": {"user": "hello there", "assistant": "hi"},
        "tasks": [
            {"name": "intent", "kind": "choice", "options": ["a", "b"]},
            {"name": "pii", "kind": "span", "labels": ["person"]},
        ],
    }
    wrong = {**req, "id": "s1-wrong", "model": "other"}
    engine.submit(broker.delivery([req]))
    engine.submit(broker.delivery([wrong]))
    broker.wait(2)
    engine.stop(5)
    meta = json.loads(redis.get(result_key("s1")))
    assert meta["status"] == "SUCCESS" and set(meta["result"]["tasks"]) == {"intent", "pii"}
    assert meta["vela2"]["status"] == "ok" and meta["vela2_answer"] == meta["result"]
    bad = json.loads(redis.get(result_key("s1-wrong")))
    assert bad["status"] == "FAILURE" and bad["result"]["exc_type"] == "ModelMismatch"
    assert bad["vela2_answer"]["error"]["type"] == "model_mismatch"


def test_warm_stop_finishes_or_returns_every_message(redis):
    pipe = FakePipeline(delay_s=0.3)
    engine, _, broker = make_engine(redis, pipe, max_batch_tokens=40)  # 18-token rows: two per batch
    n = 12
    for i in range(n):
        engine.submit(broker.delivery([row(f"s{i}")]))
    broker.wait(1)
    engine.stop(0.0)  # no time left: the batch in flight finishes, the rest goes back
    engine.submit(broker.delivery([row("after-stop")]))  # intake closed: straight back to the queue
    acked, rejected = set(broker.acked), {m for m, _ in broker.rejected}
    assert all(requeue for _, requeue in broker.rejected)
    assert not acked & rejected
    assert acked | rejected == {f"s{i}" for i in range(n)} | {"after-stop"}
    assert acked and len(rejected) > 1
    stored = {k for k, v in read_results(redis, [f"s{i}" for i in range(n)]).items() if v is not None}
    assert acked <= stored  # acked means stored
    assert engine.stats.messages_returned == len(rejected) - 1


def test_a_failing_store_delays_the_ack(redis):
    engine, _, broker = make_engine(redis)
    real_store = engine.store.store
    calls = {"n": 0}

    def flaky(items):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("redis away")
        return real_store(items)

    engine.store.store = flaky  # type: ignore[method-assign]
    engine.submit(broker.delivery([row("x")]))
    broker.wait(1, timeout_s=10)
    engine.stop(5)
    assert calls["n"] >= 2 and broker.acked == ["x"]
