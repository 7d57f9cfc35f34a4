"""What a tenant holds (vela2.wire.usage): stored bytes counted by the writing script, once, given
back when their bucket expires; tokens reported per second and read as a rate."""

from __future__ import annotations

import asyncio

import fakeredis
import pytest

from vela2.api.schemas import RowResult, Status
from vela2.wire import keys, usage
from vela2.wire.keys import result_key
from vela2.wire.results import ResultStore, row_meta


@pytest.fixture
def redis():
    r = fakeredis.FakeRedis()
    yield r
    r.flushall()


def _meta(rid: str) -> dict:
    return row_meta(rid, RowResult(id=rid, task="choice:x", status=Status.ok, answers=[]))


def _held(redis, ids: list[str]) -> int:
    return sum(len(result_key(i)) + len(redis.get(result_key(i))) for i in ids)


def test_a_results_bytes_count_once_on_its_tenant_and_come_back_when_it_expires(redis):
    store = ResultStore(redis, ttl_s=3_600)
    now = 1_000_000.0
    out = store.store([("acme/a", _meta("acme/a")), ("acme/b", _meta("acme/b")), ("k", _meta("k"))],
                      tenants=["acme", "acme", None])
    assert out == [True, True, True]
    assert store.store([("acme/a", _meta("acme/a"))], tenants=["acme"]) == [False]  # written once, counted once
    assert usage.stored_bytes(redis, "acme") == _held(redis, ["acme/a", "acme/b"]) > 0
    assert usage.stored_bytes(redis, "") == _held(redis, ["k"])  # keyless producers: tenant ""
    at, keep = usage.count_args(3_600, now)
    assert at % usage.bucket_s(3_600) == 0 and now + 3_600 < at <= now + 3_600 + usage.bucket_s(3_600)
    assert keep >= at - now
    (field,) = redis.hkeys(keys.stored_key("acme"))
    assert usage.stored_bytes(redis, "acme", now=int(field) - 1) > 0  # its bucket still ahead
    assert usage.stored_bytes(redis, "acme", now=int(field)) == 0  # expired: given back, the field dropped
    assert redis.hlen(keys.stored_key("acme")) == 0


def test_a_jobs_results_count_on_its_tenant_too(redis):
    from vela2.wire.jobs import job_keys

    job = "acme/j1"
    redis.hset(job_keys(job)[0], mapping={"total": 2, "ok": 0, "error": 0, "expired": 0, "cancelled": 0})
    store = ResultStore(redis, ttl_s=600)
    ids = [f"{job}#0", f"{job}#1"]
    assert store.store([(i, _meta(i)) for i in ids], jobs=[job, job], tenants=["acme", "acme"]) == [True, True]
    assert redis.hget(job_keys(job)[0], "ok") == b"2"  # counted on the job as before
    assert usage.stored_bytes(redis, "acme") == _held(redis, ids)


def test_tokens_reported_per_second_read_as_the_rate_of_the_last_whole_seconds():
    server = fakeredis.FakeServer()
    redis = fakeredis.FakeRedis(server=server)
    now = 2_000_000.0
    usage.report_tokens(redis, {"acme": 300, "": 10}, now=now - 2)
    usage.report_tokens(redis, {"acme": 100}, now=now - 1)
    usage.report_tokens(redis, {"acme": 5_000}, now=now)  # this second is not whole yet: not read
    assert 0 < redis.ttl(keys.tokens_key("acme", int(now) - 1)) <= usage.TOKENS_TTL_S
    client = fakeredis.FakeAsyncRedis(server=server)

    async def read() -> list[tuple[int, int]]:
        try:
            return [await usage.read_async(client, t, now=now) for t in ("acme", "", "beta")]
        finally:
            await client.aclose()

    assert asyncio.run(read()) == [(0, 200), (0, 5), (0, 0)]  # (stored bytes, tokens a second)
