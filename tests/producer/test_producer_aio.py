"""producer.AsyncClient against a real redis-server and a fake worker thread: many concurrent tasks,
shared pipelined polls, an event loop that keeps running while they wait, timeouts, Redis down."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import redis.exceptions

from producer.aio import AsyncClient
from vela2.errors import InvalidRequest, ModelMismatch

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
    worker = fake_worker()
    worker.go.clear()  # nothing is answered until 2 s after the tasks started waiting

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
                worker.go.set()

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
    assert worker.rows == 60
    # The loop kept turning while 60 coroutines waited 2 s or more each (a blocking wait would
    # leave a gap of the whole wait), and one MGET per poll served all of them.
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert len(ticks) >= 20 and max(gaps) < 1.0, (len(ticks), max(gaps))
    assert polls < 60, polls


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
