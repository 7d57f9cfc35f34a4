"""Poison requests, engine level (a fake pipeline, fakeredis): attempts counted then forgotten, a
suspect runs alone, a request past max_attempts is dead-lettered and answered "poison", a warm stop
gives back the attempts of what it returns."""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest

from vela2.api.schemas import Answer, RowResult, Status, parse_row
from vela2.model.calibration import Calibration
from vela2.wire.keys import attempts_key, dead_letter
from vela2.wire.messages import build_message
from vela2.wire.results import ResultStore, read_results
from worker.engine.loop import Engine
from worker.engine.work import Delivery
from worker.settings import EngineSettings


def row(rid: str, words: int = 8) -> dict[str, Any]:
    text = " ".join(f"w{i}" for i in range(words))
    return {"id": rid, "task": "choice:boolq", "text": text, "questions": [{"options": ["yes", "no"]}]}


@dataclass
class Pipeline:
    """A fake model: one sequence per 20 words; records every batch and the attempt counters it saw."""

    redis: Any
    batches: list[list[str]] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def prepare(self, model, obj):
        r = parse_row(obj)
        n = max(1, -(-len(r.text.split()) // 20))
        seqs = [SimpleNamespace(rid=r.id, num_tokens=30) for _ in range(n)]
        return SimpleNamespace(row=r, task=r.task, sequences=seqs)

    def run_batch(self, model, sequences, precision, row_tokens=None):
        with self.lock:
            self.batches.append([s.rid for s in sequences])
            for s in sequences:
                self.counters[s.rid] = int(self.redis.get(attempts_key(s.rid)) or 0)
        return [None] * len(sequences)

    def finish(self, model, prep, outputs, timings, precision):
        r = prep.row
        answers = [Answer(question=0, task=r.task, probs={"yes": 1.0, "no": 0.0})]
        return RowResult(id=r.id, task=r.task, status=Status.ok, answers=answers, timings=timings)


def run_engine(redis, rows: list[dict], **settings) -> tuple[Engine, Pipeline, list[str]]:
    """Deliver `rows` (one message each) to a fresh engine, wait until all are acked, stop it."""
    pipe = Pipeline(redis)
    engine = Engine(
        SimpleNamespace(name="fake", calibration=Calibration()),
        ResultStore(redis),
        EngineSettings(**{"max_batch_tokens": 4096, "max_wait_ms": 20.0, "render_threads": 1, **settings}),
        pipeline=pipe,
    )
    acked: list[str] = []
    for r in rows:  # all delivered before the engine starts: its first turn takes them together
        msg = build_message([r], "vela2.fake")
        env = json.loads(msg.payload)
        engine.submit(
            Delivery(env["headers"], base64.b64decode(env["body"]), ack=lambda i=msg.id: acked.append(i), reject=None)
        )
    engine.start()
    deadline = time.monotonic() + 20
    while len(acked) < len(rows):
        assert time.monotonic() < deadline, f"{acked} acked of {len(rows)}"
        time.sleep(0.01)
    engine.stop(5.0)
    return engine, pipe, acked


@pytest.fixture
def redis():
    r = fakeredis.FakeRedis()
    yield r
    r.flushall()


def test_first_attempts_are_counted_then_forgotten(redis):
    # max_wait long: the six wait for each other while any is in render, however loaded the machine
    # (the wait ends when the last render comes back, not after max_wait)
    engine, pipe, _ = run_engine(redis, [row(f"r{i}") for i in range(6)], max_wait_ms=5000.0)
    assert pipe.counters == {f"r{i}": 1 for i in range(6)}  # counted before the batch ran
    assert len(pipe.batches) == 1  # nobody is a suspect: one batch
    assert not redis.keys(attempts_key("*"))  # deleted once the results were stored
    assert engine.stats.retried_alone == 0 and engine.stats.dead_lettered == 0


def test_a_request_whose_earlier_attempt_died_runs_alone(redis):
    redis.set(attempts_key("s"), 1)  # an earlier delivery was running when its worker died
    engine, pipe, _ = run_engine(redis, [row("a"), row("s", words=50), row("b")], max_wait_ms=300.0)
    assert sorted(pipe.batches[0]) == ["a", "b"]  # the others went first, together
    assert pipe.batches[1:] == [["s"], ["s"], ["s"]]  # each of its three sequences alone
    assert pipe.counters["s"] == 2
    got = read_results(redis, ["a", "b", "s"])
    assert all(v is not None and v.status == Status.ok for v in got.values())
    assert not redis.keys(attempts_key("*"))
    assert engine.stats.retried_alone == 1


def test_a_request_past_max_attempts_is_dead_lettered_not_run(redis):
    redis.set(attempts_key("p"), 3)
    engine, pipe, acked = run_engine(redis, [row("ok"), row("p")], max_attempts=3)
    assert all("p" not in b for b in pipe.batches)
    got = read_results(redis, ["ok", "p"])
    assert got["ok"].status == Status.ok
    assert got["p"].status == Status.error and got["p"].error.type == "poison"
    assert got["p"].error.message == "request crashed the worker 3 times; moved to vela2.fake.dead"
    (entry,) = [json.loads(x) for x in redis.lrange(dead_letter("fake"), 0, -1)]
    assert entry["id"] == "p" and entry["attempts"] == 3 and entry["request"]["id"] == "p"
    assert "crashed the worker 3 times" in entry["reason"]
    assert sorted(acked) == ["ok", "p"]
    assert not redis.keys(attempts_key("*"))
    assert engine.stats.dead_lettered == 1


def test_a_warm_stop_gives_back_the_attempts_of_what_it_returns(redis):
    gate = threading.Event()

    class Slow(Pipeline):
        def run_batch(self, model, sequences, precision, row_tokens=None):
            gate.wait(5)
            return super().run_batch(model, sequences, precision, row_tokens)

    pipe = Slow(redis)
    engine = Engine(
        SimpleNamespace(name="fake", calibration=Calibration()),
        ResultStore(redis),
        EngineSettings(max_batch_tokens=30, max_wait_ms=0.0, render_threads=1),
        pipeline=pipe,
    )
    engine.start()
    rejected: list[bool] = []
    msg = build_message([row("long", words=60)], "vela2.fake")  # three sequences, one per batch
    env = json.loads(msg.payload)
    engine.submit(Delivery(env["headers"], base64.b64decode(env["body"]), ack=lambda: None, reject=rejected.append))
    deadline = time.monotonic() + 10
    while not redis.exists(attempts_key("long")):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    threading.Timer(0.3, gate.set).start()  # the running batch ends while the stop is under way
    engine.stop(0.0)  # no time to finish: the message goes back
    assert rejected == [True]
    assert not redis.exists(attempts_key("long"))  # returned alive: no earlier attempt died


# --- the real thing: crashing worker processes, restarted by a supervisor ----------------------


