"""producer.AsyncClient against a real redis-server and a fake worker thread: many concurrent tasks,
shared pipelined polls, an event loop that keeps running while they wait, timeouts, expired answers
(terminal, never an endless wait), Redis down."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
import redis.exceptions

from producer.aio import AsyncClient
from vela2.api.schemas import RowResult, Status
from vela2.errors import InvalidRequest, ModelMismatch, ResultExpired
from vela2.wire.keys import result_key
from vela2.wire.results import ResultStore, row_meta

pytestmark = pytest.mark.integration

MODEL = "vela2-demo"


def row(i: int) -> dict:
    return {
        "id": f"a-{i}",
        "task": "choice:boolq",
        "text": f"Row number {i} says the sky is green.",
        "questions": [{"options": ["yes", "no"]}],
    }


def system_one(i: int) -> dict:
    return {
        "model": MODEL,
        "id": f"s-{i}",
        "input": f"text {i}",
        "tasks": [{"name": "t", "kind": "set", "options": ["a"]}],
    }


def test_concurrent_tasks_share_polls_and_never_block_the_loop(redis_url, fake_worker):
    # A process's first SystemOne submit imports vela2.api.systemone (numpy with it): once, ~0.1 s idle
    # and 1.5 s on a loaded CI machine, a start-up cost and not the steady blocking this test looks for
    import vela2.api.systemone  # noqa: F401

    worker = fake_worker()
    worker.pause()  # nothing is answered until 2 s after the tasks started waiting

    async def main() -> tuple[list, list[float], int]:
        async with AsyncClient(redis_url, model=MODEL) as client:
            ticks: list[float] = []
            stop = asyncio.Event()

            async def heartbeat() -> None:
                while not stop.is_set():
                    ticks.append(time.monotonic())
                    await asyncio.sleep(0.01)

            async def one(i: int) -> tuple[str, dict]:
                rid = await client.submit(system_one(i) if i % 5 == 0 else row(i), backfill=i % 2 == 1)
                return rid, await client.answer(rid, timeout_s=30)

            async def release() -> None:
                await asyncio.sleep(2.0)
                worker.resume()

            beat = asyncio.create_task(heartbeat())
            results, _ = await asyncio.gather(asyncio.gather(*(one(i) for i in range(60))), release())
            many = await client.results_many([f"a-{i}" for i in range(1, 60) if i % 5], timeout_s=5)
            stop.set()
            await beat
            assert all(r is not None and r.status == "ok" for r in many.values())
            return results, ticks, client.poller.polls

    results, ticks, polls = asyncio.run(main())
    for i, (rid, answer) in enumerate(results):
        assert rid == (f"s-{i}" if i % 5 == 0 else f"a-{i}")
        assert answer["id"] == rid and answer["status"] == "ok"
        assert ("tasks" in answer) == (i % 5 == 0)  # SystemOne requests get the SystemOne answer
    assert worker.requests == 60
    # The loop kept turning while 60 coroutines waited 2 s or more each (a blocking wait would
    # leave a gap of the whole wait), and one MGET per poll served all of them: a wait of its own
    # would poll each of them at least 2 s / POLL_MAX_S = 20 times, 1,200 in all; shared, a few per
    # waiter at most (each new waiter restarts the pause at POLL_MIN_S: on a loaded machine, where
    # the submits spread out, 81 were seen).
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert len(ticks) >= 20 and max(gaps) < 1.0, (len(ticks), max(gaps))
    assert polls < 3 * 60, polls


def test_timeouts_and_missing_results(redis_url):
    async def main() -> None:
        async with AsyncClient(redis_url, model=MODEL) as client:
            t0 = time.monotonic()
            with pytest.raises(TimeoutError, match="no result for 'never' after 0.2 s"):
                await client.result("never", timeout_s=0.2)
            assert time.monotonic() - t0 >= 0.2  # waited its whole timeout (a hang is the test timeout's)
            got = await client.answers_many(["x", "y"], timeout_s=0.1)
            assert got == {"x": None, "y": None}
            assert not client.poller._waiting  # nothing left registered after the waits ended

    asyncio.run(main())


def test_validation_happens_before_anything_is_queued(redis_url, redis_server):
    async def main() -> None:
        async with AsyncClient(redis_url, model=MODEL) as client:
            with pytest.raises(ModelMismatch, match="names model 'other'"):
                await client.submit({**system_one(1), "model": "other"})
            with pytest.raises(InvalidRequest, match=r"requests\[1\]: .*options"):
                await client.submit_many([row(0), {**row(1), "questions": [{"options": []}]}])

    asyncio.run(main())
    r = redis_server.client()
    try:
        assert r.keys("vela2.*") == []
    finally:
        r.close()


def test_redis_down_raises_instead_of_hanging():
    with socket.socket() as s:  # a free port: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        async with AsyncClient(f"redis://127.0.0.1:{port}/0", model=MODEL) as client:
            with pytest.raises(redis.exceptions.ConnectionError):
                await client.answer("x", timeout_s=3600)  # raises at once instead of waiting an hour

    asyncio.run(main())


def test_an_expired_answer_raises_at_once_and_is_an_error_result_in_many(redis_url, redis_server):
    r = redis_server.client()
    short = ResultStore(r, ttl_s=1)  # result_expires of 1 s

    async def main() -> None:
        async with AsyncClient(redis_url, model=MODEL) as client:  # tracks submissions by default
            ids = await client.submit_many([row(1), row(2)])
            assert [await client.status(i) for i in ids] == ["pending", "pending"]
            short.store([("a-1", row_meta("a-1", RowResult(id="a-1", task="choice:boolq", status=Status.ok)))])
            assert (await client.answer("a-1", timeout_s=5))["status"] == "ok"  # while it lives
            deadline = time.monotonic() + 15
            while r.exists(result_key("a-1")):  # the TTL runs out
                assert time.monotonic() < deadline, "the result did not expire"
                await asyncio.sleep(0.02)
            assert await client.status("a-1") == "expired" and not await client.is_submitted("a-1")
            assert await client.is_submitted("a-2") and await client.status("never") == "unknown"

            with pytest.raises(ResultExpired, match=r"'a-1' expired from the result store"):
                await asyncio.wait_for(client.answer("a-1", timeout_s=None), 10)  # not an endless wait
            with pytest.raises(ResultExpired):
                await asyncio.wait_for(client.result("a-1", timeout_s=3600), 10)  # at once, not in an hour

            # A waiter on a pending id and one on the expired id share polls; each gets its own outcome.
            polls = client.poller.polls
            waiting = asyncio.create_task(client.results_many(ids, timeout_s=None))
            await asyncio.sleep(0.1)
            assert not waiting.done()  # a-2 is still pending: keeps waiting
            short.store([("a-2", row_meta("a-2", RowResult(id="a-2", task="choice:boolq", status=Status.ok)))])
            got = await asyncio.wait_for(waiting, 10)
            gone, done = got["a-1"], got["a-2"]
            assert gone is not None and gone.status == "error" and gone.error is not None
            assert gone.error.type == "result_expired"
            assert done is not None and done.status == "ok"
            assert client.poller.polls - polls < 40  # one MGET per pause, not one per id and poll
            answers = await client.answers_many(["a-1", "missing"], timeout_s=0.1)
            expired = answers["a-1"]
            assert expired is not None and expired["error"]["type"] == "result_expired" and expired["id"] == "a-1"
            assert answers["missing"] is None  # unknown: not yet, as ever

    try:
        asyncio.run(main())
    finally:
        r.close()


def test_an_id_reused_for_other_content_is_a_conflict(redis_url, redis_server):
    from vela2.errors import IdConflict
    from vela2.wire.keys import online_queue, submitted_key

    async def main() -> None:
        async with AsyncClient(redis_url, model=MODEL) as client:
            await client.submit(row(1))  # pending
            with pytest.raises(IdConflict, match=r"request id 'a-1' already names"):
                await client.submit({**row(1), "text": "something else entirely"})
            with pytest.raises(IdConflict):  # all or nothing: the fresh id's marker is taken back
                await client.submit_many([row(2), {**row(1), "text": "other"}])
            assert await client.redis.get(submitted_key("a-2")) is None
            assert await client.redis.llen(online_queue(MODEL)) == 1

    asyncio.run(main())


def test_a_busy_pool_delays_the_poller_and_fails_no_waiter():
    """Busy (every pooled connection in use) is load: the poller polls again; only a real Redis
    error fails the waiters."""
    import fakeredis

    from producer.aio import Busy

    async def main() -> dict:
        redis = fakeredis.FakeAsyncRedis()
        client = AsyncClient(model=MODEL, redis=redis, poll_min_s=0.001, poll_max_s=0.01)
        real_mget, calls = redis.mget, {"n": 0}

        async def flaky_mget(*a, **kw):
            calls["n"] += 1
            if calls["n"] <= 3:
                raise Busy("every connection busy")
            return await real_mget(*a, **kw)

        redis.mget = flaky_mget
        res = RowResult(id="b-1", task="choice:boolq", status=Status.ok, answers=[])
        await redis.set(result_key("b-1"), json.dumps(row_meta("b-1", res)))
        answer = await client.answer("b-1", timeout_s=5)
        await client.aclose()
        return {"answer": answer, "calls": calls["n"]}

    got = asyncio.run(main())
    assert got["answer"]["id"] == "b-1" and got["calls"] >= 4


def test_wait_replicas_is_checked_like_the_clients(redis_url):
    with pytest.raises(InvalidRequest, match="wait_replicas must be a whole number, 0 or more; got -2"):
        AsyncClient(redis_url, wait_replicas=-2)
    with pytest.raises(InvalidRequest, match="the broker is RabbitMQ"):
        AsyncClient(redis_url, broker_url="amqp://guest:guest@127.0.0.1:1//", wait_replicas=2)


def test_a_push_that_fails_takes_its_marker_back(redis_url):
    """As producer.Client: a broker that refuses the push leaves no "pending" marker behind."""
    from vela2.wire.keys import submitted_key

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]

    async def main() -> None:
        async with AsyncClient(redis_url, model=MODEL, broker_url=f"redis://127.0.0.1:{dead}/0") as client:
            with pytest.raises(redis.exceptions.ConnectionError):
                await client.submit(row(1))
            assert await client.status("a-1") == "unknown"
            assert await client.redis.get(submitted_key("a-1")) is None

    asyncio.run(main())


def _answer_after(redis_url: str, rid: str, delay_s: float, **client_kw) -> tuple[dict, float, AsyncClient]:
    """answer(rid) while a worker's store writes its result `delay_s` later: (answer, seconds, client)."""
    import redis as redis_sync

    store = ResultStore(redis_sync.Redis.from_url(redis_url))
    res = RowResult(id=rid, task="choice:boolq", status=Status.ok, answers=[])

    async def main() -> tuple[dict, float, AsyncClient]:
        # polls only at the start and after 30 s: an answer within the test's bound came pushed
        async with AsyncClient(redis_url, model=MODEL, **{"poll_min_s": 30, "poll_max_s": 30, **client_kw}) as client:
            loop = asyncio.get_running_loop()
            loop.call_later(delay_s, store.store, [(rid, row_meta(rid, res))])
            t0 = time.monotonic()
            answer = await client.answer(rid, timeout_s=20)
            return answer, time.monotonic() - t0, client

    return asyncio.run(main())


def test_an_answer_is_pushed_the_moment_it_is_stored(redis_url):
    answer, took, client = _answer_after(redis_url, "push-1", 0.3)
    assert answer["id"] == "push-1" and answer["status"] == "ok"
    assert 0.3 <= took < 5  # not the 30 s poll: the result's own message resolved it
    assert client.poller.pushed == 1 and client.poller.polls == 1  # the one poll right after subscribing


def test_a_user_without_channel_rights_is_answered_by_polling(redis_url):
    """An ACL user whose channels are reset (Redis 7's default for new users) cannot SUBSCRIBE: the
    client polls instead and still gets every answer."""
    import redis as redis_sync

    admin = redis_sync.Redis.from_url(redis_url)
    admin.execute_command("ACL", "SETUSER", "nochan", "on", ">pw", "~*", "+@all", "resetchannels")
    try:
        url = redis_url.replace("redis://", "redis://nochan:pw@", 1)
        answer, took, client = _answer_after(url, "poll-1", 0.3, poll_min_s=0.01, poll_max_s=0.05)
    finally:
        admin.execute_command("ACL", "DELUSER", "nochan")
    assert answer["id"] == "poll-1" and answer["status"] == "ok"
    assert client.poller.pushed == 0 and client.poller.polls >= 2
