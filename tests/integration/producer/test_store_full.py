"""A full Redis (maxmemory reached, noeviction) is named for what it is (issue 38): the clients raise
StoreFull and the HTTP route answers 507 `store_full`, never "unreachable"; nothing is queued and no
submitted marker is left behind; once memory is freed the same request goes through."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis as redis_lib

from producer.aio import AsyncClient
from producer.client import Client
from vela2.errors import StoreFull
from vela2.wire.keys import online_queue, submitted_key

MODEL = "vela2-demo"
ROW = {"task": "choice:boolq", "text": "Is the sky blue?", "questions": [{"question": "Is it?",
                                                                         "options": ["yes", "no"]}]}


def _fill(r: redis_lib.Redis) -> int:
    """Write junk until Redis refuses for memory; returns how many keys it took."""
    blob = b"x" * 20_000
    for i in range(100_000):
        try:
            r.set(f"junk:{i}", blob)
        except redis_lib.exceptions.OutOfMemoryError:
            return i
    raise AssertionError("Redis never refused a write: maxmemory not set?")


def _make_full(r: redis_lib.Redis) -> int:
    """Fill Redis, then lower maxmemory 256 KiB under what it holds.

    A refused 20 KB SET frees its own query buffer, so right after the fill Redis may sit a few KB
    under its limit and accept a small write; the lowered limit leaves no such slack. Returns the
    number of junk keys written."""
    filled = _fill(r)
    used = int(r.info("memory")["used_memory"])
    r.config_set("maxmemory", used - 256 * 1024)
    return filled


def test_a_full_redis_is_store_full_to_clients_and_507_on_the_route(redis_server_factory, http_server):
    server = redis_server_factory(extra_args=["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"])
    r = redis_lib.Redis.from_url(server.url())
    filled = _make_full(r)
    client = Client(server.url(), model=MODEL)
    with pytest.raises(StoreFull, match="Redis refuses writes: it is full"):
        client.submit({**ROW, "id": "full-1"})
    with pytest.raises(StoreFull):
        asyncio.run(_submit_async(server.url(), {**ROW, "id": "full-2"}))
    assert r.llen(online_queue(MODEL)) == 0
    assert not r.exists(submitted_key("full-1")) and not r.exists(submitted_key("full-2"))
    base = http_server(server.url())
    body = {"model": MODEL, "id": "full-3", "input": "Is the sky blue?",
            "tasks": [{"name": "q", "kind": "choice", "question": "Is it?", "options": ["yes", "no"]}]}
    with httpx.Client(base_url=base, timeout=30) as http:
        got = http.post("/v1/system_one", json=body, params={"wait_s": 0})
        assert got.status_code == 507, got.text
        assert got.json()["error"]["type"] == "store_full" and "unreachable" not in got.text
        r.delete(*[f"junk:{i}" for i in range(filled)])  # memory back: the same request goes through
        again = http.post("/v1/system_one", json=body, params={"wait_s": 0})
        assert again.status_code == 202, again.text
    assert client.submit({**ROW, "id": "full-1"}) == "full-1"
    assert r.llen(online_queue(MODEL)) == 2
    client.close()
    r.close()


async def _submit_async(url: str, row: dict) -> str:
    client = AsyncClient(url, model=MODEL)
    try:
        return await client.submit(row)
    finally:
        await client.aclose()
