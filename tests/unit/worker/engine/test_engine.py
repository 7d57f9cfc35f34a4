"""The engine with a fake model pipeline and fakeredis: every rule without a device or a broker."""

from __future__ import annotations

import base64
import json
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest

from vela2.api.schemas import Answer, RowResult, Status, parse_row
from vela2.model.calibration import Calibration
from vela2.wire.jobs import JOB_FIELDS, parse_job, request_wire_id
from vela2.wire.keys import attempts_key, cancel_key, job_key, result_key, submitted_key
from vela2.wire.messages import build_message
from vela2.wire.results import ResultStore, read_results, row_meta
from worker.engine.loop import Engine
from worker.engine.work import Delivery
from worker.settings import EngineSettings

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

    @property
    def task(self) -> str:
        return self.row.task


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

    def finish(self, model, prep, outputs, timings, precision):
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


def make_engine(redis, pipeline=None, *, start=True, **kw) -> tuple[Engine, FakePipeline, Broker]:
    """An engine on a fake pipeline; start=False: not started yet (deliveries submitted before
    engine.start() are all taken in its first turn, one intake)."""
    pipeline = pipeline or FakePipeline()
    settings = EngineSettings(**{"max_batch_tokens": 1024, "max_wait_ms": 5.0, **kw})
    model = SimpleNamespace(name="fake", calibration=Calibration())
    engine = Engine(model, ResultStore(redis, ttl_s=600), settings, pipeline=pipeline)
    if start:
        engine.start()
    return engine, pipeline, Broker(redis)


def test_rows_are_batched_answered_and_acked_after_storing(redis):
    engine, pipe, broker = make_engine(redis, start=False)
    ids = [f"r{i}" for i in range(12)]
    for rid in ids:
        engine.submit(broker.delivery([row(rid)]))
    engine.start()
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
    engine, _, broker = make_engine(redis, pipe, start=False, max_wait_ms=50.0)
    ids = ["a", "b", "poison", "c", "d", "e"]
    for rid in ids:
        engine.submit(broker.delivery([row(rid)]))
    engine.start()
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
    assert meta["vela2"]["status"] == "ok" and "vela2_answer" not in meta  # `result` is the answer, once
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

    def flaky(items, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("redis away")
        return real_store(items, **kw)

    engine.store.store = flaky  # type: ignore[method-assign]
    engine.submit(broker.delivery([row("x")]))
    broker.wait(1, timeout_s=10)
    engine.stop(5)
    assert calls["n"] >= 2 and broker.acked == ["x"]


def test_with_wait_replicas_an_ack_waits_until_replicas_hold_the_results(redis):
    """settings.wait_replicas: results are stored, then a write of the worker's own and WAIT in one round
    trip; a short WAIT leaves the message unacked (tried again a second later), never lost or acked early."""
    from worker.engine.outbox import WAIT_REPLICAS_TIMEOUT_MS

    replicas, waits = {"n": 0}, []
    real_pipeline = redis.pipeline

    base = type(real_pipeline(transaction=False))

    class Pipe(base):  # type: ignore[misc,valid-type]  # WAIT answered from `replicas` (fakeredis has none)
        wait: tuple | None = None

        def execute_command(self, *args, **kwargs):
            if args[0] == "WAIT":
                self.wait = args[1:]
                return self
            return super().execute_command(*args, **kwargs)

        def execute(self, *args, **kwargs):
            out = super().execute(*args, **kwargs)
            if self.wait is not None:
                waits.append(self.wait)
                out.append(replicas["n"])
            return out

    def pipeline(*args, **kwargs):
        pipe = real_pipeline(*args, **kwargs)
        pipe.__class__ = Pipe
        return pipe

    redis.pipeline = pipeline
    engine, _, broker = make_engine(redis, wait_replicas=1)
    engine.submit(broker.delivery([row("x")]))
    deadline = time.monotonic() + 10
    while len(waits) < 2:  # stored, then WAIT came back short twice (a second apart): still unacked
        assert time.monotonic() < deadline, waits
        time.sleep(0.01)
    assert redis.exists(result_key("x")) and broker.acked == [] and engine.stats.acks_deferred >= 2
    replicas["n"] = 1
    broker.wait(1, timeout_s=10)
    engine.stop(5)
    assert broker.acked == ["x"]
    assert set(waits) == {(1, WAIT_REPLICAS_TIMEOUT_MS)}


def _raw_delivery(broker, headers, body, acks):
    def ack():
        acks.append(headers.get("id"))

    return Delivery(headers=headers, body=body, ack=ack, reject=lambda requeue: broker.rejected.append(("?", requeue)))


def test_a_duplicate_in_flight_runs_once_and_is_counted(redis):
    pipe = FakePipeline(delay_s=0.2)
    engine, _, broker = make_engine(redis, pipe)
    engine.submit(broker.delivery([row("twice")]))
    deadline = time.monotonic() + 10
    while not pipe.batches:  # the first delivery is running
        assert time.monotonic() < deadline
        time.sleep(0.005)
    engine.submit(broker.delivery([row("twice")]))  # a producer retry while it runs
    broker.wait(2)
    engine.stop(5)
    assert broker.acked == ["twice", "twice"]
    assert [b for b in pipe.batches if ("twice", 0) in b] == [[("twice", 0)]]  # scored once
    assert engine.stats.duplicates == 1 and engine.metrics.duplicates._value.get() == 1
    assert engine.stats.retried_alone == 0  # no "died with its worker" suspicion


def test_a_refused_queue_item_is_answered_under_its_ids_or_dead_lettered(redis):
    from vela2.wire.messages import triage

    engine, _, broker = make_engine(redis)
    acks: list = []
    named = triage(json.dumps({"headers": {"task": "celery.backend_cleanup", "id": "other-task-1"},
                               "properties": {"delivery_tag": "t1"}, "body": ""}), QUEUE, "t1").envelope
    nameless = triage(b"\xff not json at all", QUEUE, "t2").envelope
    for env in (named, nameless):
        engine.submit(_raw_delivery(broker, env["headers"], base64.b64decode(env["body"]), acks))
    deadline = time.monotonic() + 10
    while len(acks) < 2:
        assert time.monotonic() < deadline, acks
        time.sleep(0.005)
    engine.stop(5)
    res = read_results(redis, ["other-task-1"])["other-task-1"]
    assert res.status == Status.error and "not served here" in res.error.message
    dead = [json.loads(x) for x in redis.lrange("vela2.fake.dead", 0, -1)]
    assert len(dead) == 1 and "not valid JSON" in dead[0]["reason"] and dead[0]["item"].startswith("\\xff not json")


def test_a_request_whose_id_cannot_be_a_key_never_stops_the_others(redis):
    engine, _, broker = make_engine(redis)
    acks: list = []
    body = json.dumps([[[row("fine-1"), row("\ud800"), row("fine-2")]], {"chunk": True}, {}]).encode()
    engine.submit(_raw_delivery(broker, {"id": "chunk-x", "task": "vela2.score"}, body, acks))
    for i in range(20):
        engine.submit(broker.delivery([row(f"innocent-{i}")]))
    broker.wait(20)
    deadline = time.monotonic() + 10
    while not acks:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    engine.stop(5)
    got = read_results(redis, ["fine-1", "fine-2", *[f"innocent-{i}" for i in range(20)]])
    assert all(r is not None and r.status == Status.ok for r in got.values())
    [dead] = [json.loads(x) for x in redis.lrange("vela2.fake.dead", 0, -1)]
    assert "not valid Unicode" in dead["reason"] and dead["message_id"] == "chunk-x"
    assert json.loads(redis.get(result_key("chunk-x")))["result"]["ok"] == 2


def test_a_body_nested_deeper_than_the_limit_is_answered_and_spares_its_turn(redis):
    engine, _, broker = make_engine(redis)
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    engine.submit(broker.delivery([row("deep")], body=deep))
    engine.submit(broker.delivery([row("neighbour")]))
    broker.wait(2)
    engine.stop(5)
    res = read_results(redis, ["deep", "neighbour"])
    assert res["deep"].error.type == "invalid_request" and "nested deeper" in res["deep"].error.message
    assert res["neighbour"].status == Status.ok


def test_a_result_redis_will_not_take_becomes_a_storage_error_and_full_redis_is_waited_out(redis):
    import redis as redis_lib

    engine, _, broker = make_engine(redis)
    real_store = engine.store.store
    calls = {"full": 2}

    def picky(items, **kw):
        if calls["full"]:  # Redis full for two tries: everything waits, nothing is lost
            calls["full"] -= 1
            return [redis_lib.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'")
                    for _ in items]
        too_big = [rid == "huge" and not meta.get("vela2_storage_error") for rid, meta in items]
        out = iter(real_store([item for item, big in zip(items, too_big, strict=True) if not big]))
        return [redis_lib.exceptions.ResponseError("string exceeds maximum allowed size") if big else next(out)
                for big in too_big]

    engine.store.store = picky  # type: ignore[method-assign]
    engine.submit(broker.delivery([row("huge")]))
    engine.submit(broker.delivery([row("small")]))
    broker.wait(2, timeout_s=20)
    engine.stop(5)
    res = read_results(redis, ["huge", "small"])
    assert res["small"].status == Status.ok
    assert res["huge"].status == Status.error and res["huge"].error.type == "storage_error"
    assert calls["full"] == 0


def test_the_engine_holds_a_lease_on_each_message_until_it_is_acked_or_returned(redis):
    class Leases:
        def __init__(self):
            self.held: set[str] = set()
            self.seen: list[str] = []

        def hold(self, tag):
            self.held.add(tag)
            self.seen.append(tag)

        def release(self, tag):
            self.held.discard(tag)

        def stop(self):
            pass

    leases = Leases()
    model = SimpleNamespace(name="fake", calibration=Calibration())
    pipe = FakePipeline(delay_s=0.3)
    engine = Engine(model, ResultStore(redis), EngineSettings(max_batch_tokens=40, max_wait_ms=5.0), pipeline=pipe,
                    leases=leases)
    engine.start()
    broker = Broker(redis)
    for i in range(6):
        d = broker.delivery([row(f"l{i}")])
        d.tag = f"tag-{i}"
        engine.submit(d)
    broker.wait(1)
    engine.stop(0.0)  # some acked, the rest returned: every lease released either way
    assert sorted(leases.seen) == [f"tag-{i}" for i in range(6)] and leases.held == set()
    assert engine.progress > 0


@dataclass
class GatedPipeline(FakePipeline):
    """run_batch blocks until `gate` is set, counting the batches handed to the device meanwhile."""

    gate: threading.Event = field(default_factory=threading.Event)

    def run_batch(self, model, sequences, precision, row_tokens=None):
        self.gate.wait(20)
        return super().run_batch(model, sequences, precision, row_tokens)


def test_while_a_batch_runs_at_most_one_more_goes_behind_it(redis):
    """While a batch runs, the engine hands the device one more batch, never more than MAX_IN_FLIGHT;
    all are answered once it runs (when each goes: tests/unit/worker/engine/test_scheduling.py)."""
    from worker.engine.scheduler import MAX_IN_FLIGHT

    pipe = GatedPipeline()
    # 18-token sequences, 256-token batches: 14 per full batch
    engine, _, broker = make_engine(redis, pipe, max_batch_tokens=256, max_wait_ms=1.0)
    try:
        for i in range(40):
            engine.submit(broker.delivery([row(f"g{i}")]))
        deadline = time.monotonic() + 10
        while len(engine.scheduler.in_flight) < MAX_IN_FLIGHT or len(engine.scheduler.buckets) == 0:
            assert time.monotonic() < deadline, f"{len(engine.scheduler.in_flight)} batches handed to the device"
            time.sleep(0.005)
        assert len(engine.scheduler.in_flight) == MAX_IN_FLIGHT  # and the rest waits
        pipe.gate.set()
        broker.wait(40)
    finally:
        engine.stop(5)
    assert sum(len(b) for b in pipe.batches) == 40 and max(len(b) for b in pipe.batches) <= 14
    assert len(broker.acked) == 40 and all(read_results(redis, [f"g{i}" for i in range(40)]).values())


class RecordingCpu:
    """worker.runtime.cpu_procs.CpuProcesses' engine-facing calls, recorded (no processes)."""

    def __init__(self):
        self.on_done = None
        self.rendered: list[str] = []
        self.flushed_at: list[int] = []  # renders queued when each flush() came

    def render(self, key, obj) -> None:
        self.rendered.append(obj["id"])

    def flush(self) -> None:
        self.flushed_at.append(len(self.rendered))


def test_a_flood_of_requests_is_sent_to_render_a_slice_at_a_time(redis):
    """One turn's deliveries (three 200-row messages) go to the render processes in slices of at
    least INTAKE_SLICE requests, each message whole; an id repeated in a later slice follows the
    first one instead of rendering again."""
    from worker.engine.intake import INTAKE_SLICE

    cpu = RecordingCpu()
    settings = EngineSettings(max_batch_tokens=1024, max_wait_ms=5.0)
    engine = Engine(SimpleNamespace(name="fake", calibration=Calibration()), ResultStore(redis, ttl_s=600),
                    settings, pipeline=FakePipeline(), cpu=cpu)
    broker = Broker(redis)
    assert 200 < INTAKE_SLICE < 400
    chunks = [[row(f"m{m}-{i}") for i in range(200)] for m in range(3)]
    chunks[2][0] = row("m0-0")  # a duplicate of the first message's first row
    engine.intake.backlog.extend(broker.delivery(c, chunk=True) for c in chunks)
    engine.intake.run()
    assert cpu.flushed_at == [400, 599]  # after two whole messages, then the rest
    assert len(cpu.rendered) == len(set(cpu.rendered)) == 599
    (follower,) = engine.outbox.followers["m0-0"]
    assert list(engine.outbox.followers) == ["m0-0"] and follower is not engine.outbox.working["m0-0"].msg


def test_a_turn_takes_at_most_turn_events_and_leaves_the_rest_queued(redis):
    """A flood of one-row messages is taken over several turns (a batch can launch between them):
    the first turn takes TURN_EVENTS, the next one the rest."""
    from worker.engine.loop import TURN_EVENTS

    cpu = RecordingCpu()
    engine = Engine(SimpleNamespace(name="fake", calibration=Calibration()), ResultStore(redis, ttl_s=600),
                    EngineSettings(max_batch_tokens=1024, max_wait_ms=5.0), pipeline=FakePipeline(), cpu=cpu)
    broker = Broker(redis)
    n = TURN_EVENTS + 100
    for i in range(n):
        engine.submit(broker.delivery([row(f"t{i}")]))
    engine._turn(0.0)
    assert len(cpu.rendered) == TURN_EVENTS and engine._events.qsize() == 100
    engine._turn(0.0)
    assert len(cpu.rendered) == n and engine._events.qsize() == 0


class OrderLog:
    """A device and CPU processes that log, in one list, each batch handed over and each decode."""

    stage = "device_thread"

    def __init__(self):
        self.log: list[tuple[str, Any]] = []
        self.futures: list[Future] = []
        self.on_done = None

    def submit(self, seqs):  # the device
        self.log.append(("launch", len(seqs)))
        self.futures.append(Future())
        return self.futures[-1]

    def close(self):
        pass

    def render(self, key, obj):  # the CPU processes: every row renders at once
        fut: Future = Future()
        fut.set_result((FakePipeline().prepare(None, obj), None, "digest"))
        self.on_done("render", key, fut, 0.0)

    def decode(self, key, outputs, timings):
        self.log.append(("decode", key))

    def drop(self, key):
        pass

    def flush(self):
        pass


def test_a_batch_back_from_the_device_lets_the_next_launch_before_its_rows_go_to_decoding(redis):
    """The device must not idle while the engine ships a finished batch's outputs to decoding."""
    from worker.engine.scheduler import MAX_IN_FLIGHT
    from worker.runtime.device import Ran

    fake = OrderLog()
    engine = Engine(SimpleNamespace(name="fake", calibration=Calibration()), ResultStore(redis, ttl_s=600),
                    EngineSettings(max_batch_tokens=200, max_wait_ms=0.0), pipeline=FakePipeline(), cpu=fake,
                    device=fake)
    broker = Broker(redis)
    for i in range(4 * MAX_IN_FLIGHT):  # 20 tokens each: 10 per full batch
        engine.submit(broker.delivery([row(f"o{j}-{i}") for j in range(10)], chunk=True))
    engine._turn(0.0)  # opened and rendered
    engine._turn(0.0)  # the rendered rows into buckets
    while engine.scheduler.maybe_run_batch(False):
        pass
    assert [k for k, _ in fake.log] == ["launch"] * MAX_IN_FLIGHT
    first = engine.scheduler.in_flight[0]
    fake.futures[0].set_result(Ran([("out", it.seq.row_id, it.seq.window) for it in first], 0.0, 0.1, 0.0))
    engine._turn(0.0)
    after = [k for k, _ in fake.log[MAX_IN_FLIGHT:]]
    assert after[0] == "launch" and after[1:] == ["decode"] * len(first)


def test_a_turn_opens_at_most_turn_requests_and_the_rest_waits_for_the_next(redis):
    """Multi-row messages flooding in: a turn opens whole messages until TURN_REQUESTS requests,
    the other deliveries wait (unopened) for the next turn, so a batch can launch between."""
    from worker.engine.intake import TURN_REQUESTS

    cpu = RecordingCpu()
    engine = Engine(SimpleNamespace(name="fake", calibration=Calibration()), ResultStore(redis, ttl_s=600),
                    EngineSettings(max_batch_tokens=1024, max_wait_ms=5.0), pipeline=FakePipeline(), cpu=cpu)
    broker = Broker(redis)
    per = 100
    n_messages = TURN_REQUESTS // per + 3
    for m in range(n_messages):
        engine.submit(broker.delivery([row(f"f{m}-{i}") for i in range(per)], chunk=True))
    engine._turn(0.0)
    first = -(-TURN_REQUESTS // per)  # whole messages up to the bound
    assert len(cpu.rendered) == first * per and len(engine.intake.backlog) == n_messages - first
    assert engine._wait_s() == 0.0  # the next turn comes at once
    engine._turn(0.0)
    assert len(cpu.rendered) == n_messages * per and not engine.intake.backlog


def test_a_stop_gives_back_deliveries_never_opened(redis):
    engine = Engine(SimpleNamespace(name="fake", calibration=Calibration()), ResultStore(redis, ttl_s=600),
                    EngineSettings(max_batch_tokens=1024, max_wait_ms=5.0), pipeline=FakePipeline())
    broker = Broker(redis)
    rejected: list[bool] = []
    d = broker.delivery([row("never-opened")])
    d.reject = rejected.append
    engine.intake.backlog.append(d)
    engine._return_all()
    assert rejected == [True] and not engine.intake.backlog and engine.stats.messages_returned == 1


def test_every_stored_answer_carries_its_requests_content_digest(redis):
    """What a producer checks an id against before queueing other content under it."""
    from vela2.wire.messages import request_digest

    engine, _, broker = make_engine(redis)
    good, bad = row("dg-1"), {"id": "dg-2", "task": "choice:boolq", "text": "x"}  # bad: no questions
    engine.submit(broker.delivery([good, bad], chunk=True))
    broker.wait(1)
    engine.stop(5)
    for obj in (good, bad):
        meta = json.loads(redis.get(result_key(obj["id"])))
        assert meta["vela2_digest"] == request_digest(obj)
    assert request_digest(good) == request_digest({**good, "id": "another"}) != request_digest(bad)


def test_a_cancelled_request_is_answered_cancelled_never_rendered_nor_run_and_its_job_counts_it(redis):
    engine, pipe, broker = make_engine(redis)
    prepared = []
    real_prepare = pipe.prepare
    pipe.prepare = lambda model, obj: prepared.append(obj["id"]) or real_prepare(model, obj)
    job = "batch_e"
    redis.hset(job_key(job), mapping={"id": job, "model": "m", "input": "done", "total": 4, "ok": 0, "error": 0,
                                      "expired": 0, "cancelled": 0})
    ids = [request_wire_id(job, i) for i in range(4)]
    redis.set(cancel_key(ids[1]), "1")  # one request cancelled by id
    engine.submit(broker.delivery([row(i) for i in ids[:2]], chunk=True, headers={"vela2_job": job}))
    broker.wait(1)
    redis.hset(job_key(job), "cancel_at", 1.0)  # then the whole job
    engine.submit(broker.delivery([row(i) for i in ids[2:]], chunk=True, headers={"vela2_job": job}))
    broker.wait(2)
    engine.stop(5)
    got = read_results(redis, ids)
    assert [got[i].status for i in ids] == [Status.ok, Status.cancelled, Status.cancelled, Status.cancelled]
    assert got[ids[2]].error.type == "cancelled" and prepared == [ids[0]]
    assert [s for batch in pipe.batches for s, _ in batch] == [ids[0]]  # only the one not cancelled ran
    info = parse_job(redis.hmget(job_key(job), JOB_FIELDS), time.time())
    assert info.status == "cancelled" and info.counts == {"queued": 0, "ok": 1, "error": 0, "expired": 0,
                                                          "cancelled": 3}
    assert engine.stats.results["cancelled"] == 3 and "cancelled 3" in engine.stats.summary()


def test_a_job_lines_result_lives_the_jobs_ttl_any_other_the_online_ttl(redis):
    settings = EngineSettings(max_batch_tokens=1024, max_wait_ms=5.0)
    store = ResultStore(redis, ttl_s=600, online_ttl_s=60, expired_marker_s=1_000)
    engine = Engine(SimpleNamespace(name="fake", calibration=Calibration()), store, settings, pipeline=FakePipeline())
    engine.start()
    broker = Broker(redis)
    job = "batch_t"
    redis.hset(job_key(job), mapping={"id": job, "model": "m", "input": "done", "total": 1, "ok": 0})
    line = request_wire_id(job, 0)
    for rid in (line, "online-1"):
        redis.set(submitted_key(rid), "vela2.m x", ex=86_400)
    engine.submit(broker.delivery([row(line)], chunk=True, headers={"vela2_job": job}))
    engine.submit(broker.delivery([row("online-1")]))
    broker.wait(2)
    engine.stop(5)
    assert 60 < redis.ttl(result_key(line)) <= 600 and 0 < redis.ttl(result_key("online-1")) <= 60
    # the "answered" marker outlives its result by expired_marker_s, whichever TTL the result got
    assert 1_060 < redis.ttl(submitted_key(line)) <= 1_600 and 1_000 < redis.ttl(submitted_key("online-1")) <= 1_060
    assert redis.hget(job_key(job), "ok") == b"1"


def test_a_job_header_naming_another_job_moves_no_counter(redis):
    engine, _, broker = make_engine(redis)
    redis.hset(job_key("batch_x"), mapping={"id": "batch_x", "input": "done", "total": 5, "ok": 0})
    engine.submit(broker.delivery([row("not-of-the-job")], headers={"vela2_job": "batch_x"}))
    broker.wait(1)
    engine.stop(5)
    assert read_results(redis, ["not-of-the-job"])["not-of-the-job"].status == Status.ok
    assert redis.hget(job_key("batch_x"), "ok") == b"0"


def test_two_copies_of_one_message_in_one_intake_run_once_and_make_no_suspect(redis):
    engine, pipe, broker = make_engine(redis, start=False)
    engine.submit(broker.delivery([row("twice")]))
    engine.submit(broker.delivery([row("twice")]))  # a producer retry, taken in the same turn
    engine.start()
    broker.wait(2)
    engine.stop(5)
    assert broker.acked == ["twice", "twice"]
    assert [b for b in pipe.batches if ("twice", 0) in b] == [[("twice", 0)]]  # scored once
    assert engine.stats.duplicates == 1
    assert engine.stats.retried_alone == 0  # its own copy is no earlier attempt that died
    assert not redis.keys(attempts_key("*"))


def test_a_batch_that_raises_while_a_suspect_waits_is_split_and_every_row_answered(redis):
    """The halves of a batch that raised run although a suspect waits in quarantine (they once waited
    for it, and it for them: nothing was answered again); then the suspect runs alone."""
    redis.set(attempts_key("suspect"), 1)  # an earlier attempt died with its worker
    pipe = FakePipeline(fail_ids={"bad"})  # a batch holding "bad" raises (CUDA OOM)
    engine, _, broker = make_engine(redis, pipe, start=False, max_wait_ms=50.0)
    ids = ["suspect", "bad", "good1", "good2"]
    for rid in ids:
        engine.submit(broker.delivery([row(rid)]))
    engine.start()
    broker.wait(len(ids), timeout_s=10)
    engine.submit(broker.delivery([row("later")]))  # the worker still serves
    broker.wait(len(ids) + 1, timeout_s=10)
    engine.stop(5)
    res = read_results(redis, [*ids, "later"])
    assert res["bad"].status == Status.error and res["bad"].error.type == "model_error"
    assert all(res[i].status == Status.ok for i in ("suspect", "good1", "good2", "later"))
    assert len(pipe.batches[0]) == 3 and [("bad", 0)] in pipe.batches  # split down to the failing one
    alone = pipe.batches.index([("suspect", 0)])
    assert all(("suspect", 0) not in b for b in pipe.batches[:alone])  # it never shared a batch
    others = [i for i, b in enumerate(pipe.batches) if {"bad", "good1", "good2"} & {s for s, _ in b}]
    assert max(others) < alone  # every counted row first, then the suspect alone
    assert engine.stats.retried_alone == 1
    assert not redis.keys(attempts_key("*"))


def test_a_job_chunk_refused_whole_counts_its_rows_errors_and_the_job_ends(redis):
    engine, pipe, broker = make_engine(redis, max_message_bytes=2000)
    job = "batch_r"
    redis.hset(job_key(job), mapping={"id": job, "model": "m", "input": "done", "total": 3, "ok": 0, "error": 0,
                                      "expired": 0, "cancelled": 0})
    ids = [request_wire_id(job, i) for i in range(3)]
    big = broker.delivery([row(ids[0], words=400), row(ids[1])], chunk=True, headers={"vela2_job": job})
    engine.submit(big)  # over max_message_bytes: refused whole, each row answered limit_exceeded
    engine.submit(broker.delivery([row(ids[2])], chunk=True, headers={"vela2_job": job}))
    broker.wait(2)
    engine.stop(5)
    got = read_results(redis, ids)
    assert [got[i].error.type for i in ids[:2]] == ["limit_exceeded"] * 2 and got[ids[2]].status == Status.ok
    assert read_results(redis, [big.message_id])[big.message_id].status == Status.error  # its own id too
    info = parse_job(redis.hmget(job_key(job), JOB_FIELDS), time.time())
    # the rows are counted, the chunk's own id (no line of the job) is not
    assert info.status == "completed" and info.counts == {"queued": 0, "ok": 1, "error": 2, "expired": 0,
                                                          "cancelled": 0}


def test_each_tenants_served_tokens_and_stored_bytes_are_counted(redis):
    """The tokens run for each tenant reach its per-second counters (the tokens_per_s quota) and the
    bytes of its stored results its stored-bytes hash (the stored_bytes quota); keyless producers
    count as tenant ""."""
    from vela2.wire import keys, usage

    engine, pipe, broker = make_engine(redis, start=False)
    sent = {"acme": [f"acme/a{i}" for i in range(3)], "": ["k0", "k1"]}
    for rid in sent["acme"]:
        engine.submit(broker.delivery([row(rid, words=8)], headers={keys.TENANT_HEADER: "acme"}))
    for rid in sent[""]:
        engine.submit(broker.delivery([row(rid, words=60)]))  # two windows each: 60 and 20 tokens
    engine.start()
    broker.wait(5)
    deadline = time.monotonic() + 10
    served: dict[str, int] = {}
    while served != {"acme": 3 * 18, "": 2 * (60 + 20)}:  # a window's tokens: its words + 10 (FakePipeline)
        assert time.monotonic() < deadline, f"tokens reported: {served}"
        time.sleep(0.01)
        served = {t: sum(int(redis.get(k)) for k in redis.scan_iter(f"{keys.TOKENS_PREFIX}{t}:*"))
                  for t in sent}
    engine.stop(5)
    for tenant, ids in sent.items():
        held = sum(len(result_key(i)) + len(redis.get(result_key(i))) for i in ids)
        assert usage.stored_bytes(redis, tenant) == held
        assert usage.stored_bytes(redis, tenant, now=time.time() + 600 + 2 * usage.MIN_BUCKET_S) == 0  # expired
