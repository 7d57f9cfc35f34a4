"""Fail fast when nothing serves (issue 40): a wait for an answer ends with NoWorker once no worker of
the model has beaten (nor said it is starting) for the grace period, instead of waiting out its
timeout; never while a worker beats (however long its queue) or when the answer is stored already;
`status()` says "no_worker"; and no round trip per request while a worker beats. On fakeredis, with
a clock of the test's own where the rule itself is under test."""

from __future__ import annotations

import asyncio
import math
import time

import fakeredis
import pytest

from producer.aio import AsyncClient
from producer.client import Client
from producer.liveness import DEFAULT_GRACE_S, MIN_GRACE_S, Liveness, check_grace
from producer.testing import FakeWorker
from vela2.errors import InvalidRequest, NoWorker, Vela2Error
from vela2.wire import keys

MODEL = "vela2-demo"
ROW = {"task": "choice:boolq", "text": "The sky is green.", "questions": [{"options": ["yes", "no"]}]}
LONG_S = 120.0  # a wait's timeout far beyond the grace: NoWorker must come well before it


class Clock:
    """A settable time.time()."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server():
    return fakeredis.FakeServer()


@pytest.fixture
def redis(server):
    return fakeredis.FakeRedis(server=server)


def beat(redis, at: float, key=keys.workers_key, worker: str = "w1@host") -> None:
    redis.zadd(key(MODEL), {worker: at})


def row(rid: str) -> dict:
    return {"id": rid, **ROW}


# --- the rule ---------------------------------------------------------------------------------


def test_with_no_beat_on_record_the_grace_runs_from_the_first_look(redis):
    clock = Clock()
    live = Liveness(MODEL, 30, clock=clock)
    live.check(redis)  # first look: none on record, the grace starts now
    assert live.reads == 1
    clock.now += 29
    live.check(redis)  # within the grace: nothing read, nothing raised
    assert live.reads == 1
    clock.now += 2
    with pytest.raises(NoWorker) as e:
        live.check(redis)
    assert live.reads == 2
    msg = str(e.value)
    assert "no worker of model 'vela2-demo' has beaten in the last 31 s" in msg and "none on record" in msg
    assert "grace 30 s" in msg and "vela2 worker --checkpoint DIR --model vela2-demo" in msg
    assert e.value.code == "no_worker" and isinstance(e.value, TimeoutError) and isinstance(e.value, Vela2Error)


def test_a_crashed_workers_old_beat_fails_at_once_naming_how_long_ago(redis):
    clock = Clock()
    beat(redis, clock.now - 100)
    with pytest.raises(NoWorker, match=r"has beaten in the last 100 s \(grace 30 s\)"):
        Liveness(MODEL, 30, clock=clock).check(redis)


def test_a_live_worker_costs_a_read_about_once_per_grace_period(redis):
    clock = Clock()
    live = Liveness(MODEL, 30, clock=clock)
    for step in range(600):  # ten simulated minutes, a check every second, a beat every 5 s
        if step % 5 == 0:
            beat(redis, clock.now)
        assert live.absent(redis) is None
        clock.now += 1
    assert live.reads <= 600 // 25 + 1


def test_a_starting_worker_counts_and_a_worker_of_another_model_does_not(redis):
    clock = Clock()
    beat(redis, clock.now, key=lambda _: keys.workers_key("other-model"))  # names match exactly
    live = Liveness(MODEL, 30, clock=clock)
    live.check(redis)
    clock.now += 31
    with pytest.raises(NoWorker):
        live.check(redis)
    beat(redis, clock.now - 10, key=keys.starting_key)  # loading its model: requests wait for it
    clock.now += 1
    live.check(redis)
    assert live.newest == clock.now - 11


def test_the_newest_beat_counts_and_a_beat_resets_the_absence(redis):
    clock = Clock()
    live = Liveness(MODEL, 30, clock=clock)
    live.check(redis)
    clock.now += 20
    beat(redis, clock.now - 200, worker="gone@host")
    beat(redis, clock.now)  # a worker arrived meanwhile
    clock.now += 25
    live.check(redis)  # 45 s after the first look, 25 s after the beat: served
    assert live.newest is not None and live.absent_since is None


def test_grace_none_never_reads_nor_raises(redis):
    clock = Clock()
    beat(redis, clock.now - 10_000)
    live = Liveness(MODEL, None, clock=clock)
    live.check(redis)
    assert live.reads == 0 and live.verdict() is None


@pytest.mark.parametrize("bad", [0, 5, MIN_GRACE_S - 0.5, -30, math.nan, "30", True])
def test_a_grace_shorter_than_three_beats_is_refused_naming_the_limit(bad):
    with pytest.raises(InvalidRequest, match=f"no_worker_grace_s must be None .* >= {MIN_GRACE_S:g}.*got"):
        check_grace(bad)
    with pytest.raises(InvalidRequest, match="no_worker_grace_s"):
        Client(redis=fakeredis.FakeRedis(), model=MODEL, no_worker_grace_s=bad)


def test_the_default_grace_outlasts_a_live_workers_stale_mark():
    assert check_grace(None) is None and check_grace(MIN_GRACE_S) == MIN_GRACE_S
    assert DEFAULT_GRACE_S > MIN_GRACE_S


# --- the clients ------------------------------------------------------------------------------


def test_result_raises_no_worker_well_before_its_timeout(redis):
    beat(redis, time.time() - 300)
    client = Client(redis=redis, model=MODEL)
    rid = client.submit(row("nw-1"))
    start = time.monotonic()
    with pytest.raises(NoWorker, match="no worker of model 'vela2-demo'") as e:
        client.result(rid, timeout_s=LONG_S)
    assert time.monotonic() - start < LONG_S / 4 and e.value.grace_s == DEFAULT_GRACE_S
    with pytest.raises(NoWorker):
        client.answer(rid, timeout_s=None)  # a wait for ever ends too
    assert client.status(rid) == "no_worker" and client.is_submitted(rid)


def test_a_stored_answer_is_returned_never_no_worker(redis):
    beat(redis, time.time() - 300)
    client = Client(redis=redis, model=MODEL)
    rid = client.submit(row("nw-2"))
    FakeWorker(redis, model=MODEL).drain()
    assert client.result(rid, timeout_s=LONG_S).status == "ok"
    assert client.results_many([rid], timeout_s=LONG_S)[rid].status == "ok"
    assert client.status(rid) == "answered"


def test_many_waits_raise_no_worker_with_the_answers_read(redis):
    beat(redis, time.time() - 300)
    client = Client(redis=redis, model=MODEL)
    done = client.submit(row("nw-3"))
    FakeWorker(redis, model=MODEL).drain()
    waiting = client.submit(row("nw-4"))
    with pytest.raises(NoWorker) as e:
        client.results_many([done, waiting], timeout_s=LONG_S)
    assert set(e.value.done) == {done} and e.value.done[done].status == "ok"


def test_a_look_with_no_wait_is_a_plain_timeout(redis):
    beat(redis, time.time() - 300)
    client = Client(redis=redis, model=MODEL)
    rid = client.submit(row("nw-5"))
    with pytest.raises(TimeoutError) as e:
        client.result(rid, timeout_s=0)
    assert not isinstance(e.value, NoWorker)


def test_a_pending_request_of_a_beating_worker_is_pending_and_waits_cost_no_extra_read(redis):
    beat(redis, time.time() + 3600)  # a beat that stays fresh through the test
    client = Client(redis=redis, model=MODEL)
    rid = client.submit(row("nw-6"))
    for _ in range(20):
        with pytest.raises(TimeoutError) as e:
            client.result(rid, timeout_s=0.02)
        assert not isinstance(e.value, NoWorker)
    assert client.status(rid) == "pending" and client.liveness.reads == 1  # the first look only


def test_grace_off_waits_out_the_timeout(redis):
    beat(redis, time.time() - 300)
    client = Client(redis=redis, model=MODEL, no_worker_grace_s=None)
    rid = client.submit(row("nw-7"))
    with pytest.raises(TimeoutError) as e:
        client.result(rid, timeout_s=0.5)
    assert not isinstance(e.value, NoWorker) and client.status(rid) == "pending"


def test_the_async_client_raises_no_worker_and_says_so_in_status(server, redis):
    beat(redis, time.time() - 300)

    async def run() -> None:
        client = AsyncClient(redis=fakeredis.FakeAsyncRedis(server=server), model=MODEL)
        try:
            rid = await client.submit(row("nw-8"))
            start = time.monotonic()
            with pytest.raises(NoWorker, match="no worker of model 'vela2-demo'"):
                await client.answer(rid, timeout_s=LONG_S)
            assert time.monotonic() - start < LONG_S / 4
            assert await client.status(rid) == "no_worker" and await client.is_submitted(rid)
            FakeWorker(redis, model=MODEL).drain()
            assert (await client.answer(rid, timeout_s=LONG_S))["status"] == "ok"  # stored: never NoWorker
            other = await client.submit(row("nw-9"))
            with pytest.raises(NoWorker) as e:
                await client.results_many([rid, other], timeout_s=LONG_S)
            assert set(e.value.done) == {rid} and e.value.done[rid].status == "ok"
            tenant = client.with_tenant("acme")
            assert tenant.liveness is client.liveness  # one view of the fleet per pool
        finally:
            await client.aclose()

    asyncio.run(run())


def test_over_cells_a_request_waits_for_a_worker_of_its_own_cell():
    from producer.cells import CellsClient
    from vela2.wire.cells import Cell, CellMap

    redises = [fakeredis.FakeRedis(server=fakeredis.FakeServer()) for _ in range(2)]
    cells = CellsClient(CellMap.even([Cell("a", "redis://a/0"), Cell("b", "redis://b/0")]), model=MODEL,
                        clients=[Client(redis=r, model=MODEL) for r in redises])
    rid = cells.submit(row("nw-cells"))
    home = cells.map.cell_of(rid)
    beat(redises[home], time.time() - 300)  # its cell's worker is long gone ...
    beat(redises[1 - home], time.time() + 3600)  # ... while the other cell's beats
    assert cells.status(rid) == "no_worker"
    with pytest.raises(NoWorker):
        cells.result(rid, timeout_s=LONG_S)


def test_a_moved_id_is_waited_for_and_told_in_the_cell_that_held_it():
    from producer.cells import CellsClient
    from vela2.wire.cells import Cell, CellMap

    redises = [fakeredis.FakeRedis(server=fakeredis.FakeServer()) for _ in range(3)]
    old = CellMap.even([Cell("a", "redis://a/0"), Cell("b", "redis://b/0")])
    before = CellsClient(old, model=MODEL, clients=[Client(redis=r, model=MODEL) for r in redises[:2]])
    ids = before.submit_many([row(f"mv-{k}") for k in range(40)])
    for r in redises[:2]:
        FakeWorker(r, model=MODEL).drain()
    bigger = old.with_cell(Cell("c", "redis://c/0"))
    moved = next(i for i in ids if bigger.cell_of(i) == 2)
    after = CellsClient(bigger, model=MODEL, clients=[Client(redis=r, model=MODEL) for r in redises])
    assert after.status(moved) == "answered" and after.result(moved, timeout_s=LONG_S).status == "ok"
