"""When a batch goes to the device (worker.engine.scheduler), driven turn by turn with a clock, a
device and render processes the test holds: a free device takes online work at once unless
requests are on their way; behind a running batch, the next goes just before it ends; backfill
alone still waits to fill a batch; a latency target caps the batch."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import fakeredis
import pytest

from tests.unit.worker.engine.test_engine import Broker, FakePipeline, row
from vela2.model.calibration import Calibration
from vela2.wire.results import ResultStore
from worker.engine.loop import Engine
from worker.engine.scheduler import STAGE_MARGIN_S
from worker.runtime.device import Ran
from worker.settings import EngineSettings

TOKENS = 18  # a row(..) of 8 words: FakePipeline gives it one sequence of 18 tokens


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Held:
    """A device and render processes whose work completes when the test says."""

    stage = "device_thread"

    def __init__(self) -> None:
        self.on_done = None
        self.batches: list[list[str]] = []
        self.futures: list[Future] = []
        self.renders: dict[str, tuple[int, dict]] = {}

    def submit(self, seqs):  # the device
        self.batches.append([s.row_id for s in seqs])
        self.futures.append(Future())
        return self.futures[-1]

    def finish(self, i: int, start: float, end: float) -> None:
        ids = self.batches[i]
        self.futures[i].set_result(Ran([("out", rid, 0) for rid in ids], start, end, 0.0))

    def render(self, key, obj):  # the CPU processes: a render waits for release()
        self.renders[obj["id"]] = (key, obj)

    def release(self, rid: str) -> None:
        key, obj = self.renders.pop(rid)
        fut: Future = Future()
        fut.set_result((FakePipeline().prepare(None, obj), None, "digest"))
        self.on_done("render", key, fut, 0.0)

    def decode(self, key, outputs, timings):
        pass

    def drop(self, key):
        pass

    def flush(self):
        pass

    def close(self):
        pass


@pytest.fixture
def redis():
    r = fakeredis.FakeRedis()
    yield r
    r.flushall()


def engine_for(redis, **kw) -> tuple[Engine, Held, Clock, Broker]:
    held, clock = Held(), Clock()
    settings = EngineSettings(**{"max_batch_tokens": 1024, "max_wait_ms": 60_000.0, **kw})
    engine = Engine(SimpleNamespace(name="fake", calibration=Calibration()), ResultStore(redis, ttl_s=600), settings,
                    pipeline=FakePipeline(), cpu=held, device=held, clock=clock, cost_seed=[(1000, 1.0)])
    return engine, held, clock, Broker(redis)


def arrive(engine: Engine, broker: Broker, *rids: str, backfill: bool = False) -> None:
    """Deliveries of one row each, opened (sent to render) in one turn."""
    for rid in rids:
        d = broker.delivery([row(rid)])
        d.backfill, d.received = backfill, engine.clock()  # waits count on the test's clock
        engine.submit(d)
    engine._turn(0.0)


def rendered(engine: Engine, held: Held, *rids: str) -> None:
    for rid in rids:
        held.release(rid)
    engine._turn(0.0)


def test_a_free_device_takes_a_lone_online_request_at_once(redis):
    """No company on its way: the request goes now, not after max_wait_ms (a minute here)."""
    engine, held, clock, broker = engine_for(redis)
    arrive(engine, broker, "alone")
    rendered(engine, held, "alone")
    assert engine.scheduler.maybe_run_batch(False)
    assert held.batches == [["alone"]]


def test_a_free_device_waits_for_requests_in_render_then_takes_them_together(redis):
    engine, held, clock, broker = engine_for(redis, max_wait_ms=50.0)
    arrive(engine, broker, "a", "b", "c")
    rendered(engine, held, "a")
    assert not engine.scheduler.maybe_run_batch(False)  # b and c are in render: company on its way
    assert 0 < engine._wait_s() <= 0.05  # the loop wakes at the oldest's max_wait (or at a render)
    rendered(engine, held, "b")
    assert not engine.scheduler.maybe_run_batch(False)
    clock.t += 0.051  # c's render is slow: past max_wait the others go without it
    assert engine.scheduler.maybe_run_batch(False)
    assert sorted(held.batches[0]) == ["a", "b"]
    rendered(engine, held, "c")
    assert not engine.scheduler.maybe_run_batch(False)  # running: c goes behind it only near its end


def test_the_next_batch_goes_behind_the_running_one_just_before_it_ends(redis):
    """Seeded cost: 1 ms per token, so the running batch of 18 tokens ends 18 ms after it went (its
    launch included); what arrives meanwhile goes behind it then, in one batch, while it still runs
    (no gap on the device), and not earlier (so it takes every request that arrived)."""
    engine, held, clock, broker = engine_for(redis)
    sched = engine.scheduler
    arrive(engine, broker, "first")
    rendered(engine, held, "first")
    assert sched.maybe_run_batch(False)
    expected_end = 100.0 + TOKENS * 1e-3
    assert sched.ends == [pytest.approx(expected_end)]
    arrive(engine, broker, "x", "y")
    rendered(engine, held, "x", "y")
    stage_at = expected_end - sched.cost.lead_s - STAGE_MARGIN_S
    assert engine._wait_s() == pytest.approx(stage_at - clock.t)
    assert not sched.maybe_run_batch(False)  # too early: company may still come
    arrive(engine, broker, "z")
    rendered(engine, held, "z")
    clock.t = stage_at
    assert sched.maybe_run_batch(False)
    assert sorted(held.batches[1]) == ["x", "y", "z"] and not held.futures[0].done()  # staged behind it
    assert len(sched.in_flight) == 2 and not sched.maybe_run_batch(False)  # never more than two
    held.finish(0, 100.0, 100.02)
    clock.t = 100.021
    engine._turn(0.0)
    assert len(sched.in_flight) == 1  # the staged one runs now, its end predicted from the last one's
    assert sched.ends == [pytest.approx(100.02 + sched.cost.seconds(3 * TOKENS))]


def test_a_full_batch_goes_behind_the_running_one_at_once(redis):
    engine, held, clock, broker = engine_for(redis, max_batch_tokens=3 * TOKENS)
    arrive(engine, broker, "first")
    rendered(engine, held, "first")
    assert engine.scheduler.maybe_run_batch(False)
    ids = [f"f{i}" for i in range(3)]
    arrive(engine, broker, *ids)
    rendered(engine, held, *ids)
    assert engine.scheduler.maybe_run_batch(False)  # full: nothing more fits, so no reason to wait
    assert sorted(held.batches[1]) == ids


def test_backfill_alone_still_waits_to_fill_a_batch(redis):
    engine, held, clock, broker = engine_for(redis, max_wait_ms=1000.0)
    arrive(engine, broker, "b1", "b2", backfill=True)
    rendered(engine, held, "b1", "b2")
    assert not engine.scheduler.maybe_run_batch(False)  # bulk work: company is worth a wait
    clock.t += 1.0
    assert engine.scheduler.maybe_run_batch(False)
    assert sorted(held.batches[0]) == ["b1", "b2"]


def test_online_work_goes_first_and_takes_waiting_backfill_with_it(redis):
    engine, held, clock, broker = engine_for(redis, max_wait_ms=1000.0)
    arrive(engine, broker, "b1", backfill=True)
    rendered(engine, held, "b1")
    arrive(engine, broker, "o1")
    rendered(engine, held, "o1")
    assert engine.scheduler.maybe_run_batch(False)
    assert sorted(held.batches[0]) == ["b1", "o1"]  # one batch: the backfill row rides along


@pytest.mark.parametrize("target_ms, per_batch", [(0.0, 5), (60.0, 1), (150.0, 2)])
def test_a_latency_target_caps_the_batch(redis, target_ms, per_batch):
    """1 ms per token: a third of 60 ms holds one 18-token row, of 150 ms two; no target, all five."""
    engine, held, clock, broker = engine_for(redis, target_p99_ms=target_ms)
    ids = [f"r{i}" for i in range(5)]
    arrive(engine, broker, *ids)
    rendered(engine, held, *ids)
    assert engine.scheduler.maybe_run_batch(False)
    assert len(held.batches[0]) == per_batch
