"""Tenants' resources (issue 38): the queued quota refuses before anything is written, shares reach
the workers' Redis, and `vela2 status --tenants` shows each tenant's usage."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import redis as redis_lib

from producer import AsyncClient, Client, QuotaExceeded
from producer.quotas import Quotas
from producer.status import gather, main, render
from tests.support.tenants import tenant_keys
from vela2.wire import keys

MODEL = "vela2-demo"
REQUEST = {"model": MODEL, "id": "s-0", "input": {"user": "Where is my refund?"},
           "tasks": [{"name": "intent", "kind": "choice", "question": "What does the user want?",
                      "options": ["refund", "other"]}]}


def row(rid: str) -> dict:
    return {"id": rid, "task": "choice:boolq", "text": f"Row {rid}.",
            "questions": [{"question": "Is it?", "options": ["yes", "no"]}]}


def test_a_submit_over_max_queued_queues_nothing_and_takes_its_markers_back(redis_url):
    c = Client(redis_url, model=MODEL, tenant="acme")
    c.submit_many([row(f"r-{i}") for i in range(3)], max_queued=4)
    with pytest.raises(QuotaExceeded) as got:
        c.submit_many([row(f"s-{i}") for i in range(2)], max_queued=4)
    assert (got.value.quota, got.value.limit, got.value.usage) == ("queued", 4, 5)
    q = keys.online_queue(MODEL)
    assert c.redis.llen(keys.tenant_list(q, "acme")) == 3
    assert not c.redis.exists(keys.submitted_key(keys.scoped_id("acme", "s-0")))  # marker taken back
    assert c.status("s-0") == "unknown"
    Client(redis_url, model=MODEL, tenant="beta").submit(row("r-0"), max_queued=1)  # another tenant's own list

    async def on_asyncio() -> None:
        a = AsyncClient(redis_url, model=MODEL, tenant="acme")
        try:
            with pytest.raises(QuotaExceeded):
                await a.submit(row("t-0"), max_queued=3)
            assert await a.submit(row("t-1"), max_queued=4) == "t-1"
        finally:
            await a.aclose()

    asyncio.run(on_asyncio())


def test_the_queued_quota_refuses_a_tenants_request_with_429_and_writes_nothing(redis_url, http_server, tmp_path):
    path = tmp_path / "keys.jsonl"
    headers = tenant_keys(path, {"acme": Quotas(queued=3), "beta": None}, shares={"acme": 3})
    base = http_server(redis_url, "--api-keys-file", str(path))  # no worker: everything stays queued
    r = redis_lib.Redis.from_url(redis_url)
    assert r.hgetall(keys.TENANT_SHARES_KEY) == {b"acme": b"3.0"}  # the route published the shares
    with httpx.Client(base_url=base, timeout=30) as http:
        got = [http.post("/v1/system_one", json={**REQUEST, "id": f"q-{i}"}, params={"wait_s": 0},
                         headers=headers["acme"]) for i in range(4)]
        assert [g.status_code for g in got] == [202, 202, 202, 429], [g.text for g in got]
        err = got[3].json()["error"]
        assert err["type"] == "quota_exceeded" and "quota queued of this tenant is 3; this would make it 4" in err[
            "message"]
        assert got[3].headers["Retry-After"] == "1"
        assert not r.exists(keys.submitted_key(keys.scoped_id("acme", "q-3")))
        assert http.get("/v1/results/q-3", headers=headers["acme"]).status_code == 404
        others = [http.post("/v1/system_one", json={**REQUEST, "id": f"b-{i}"}, params={"wait_s": 0},
                            headers=headers["beta"]) for i in range(5)]
        assert [g.status_code for g in others] == [202] * 5  # beta has no quota and its own queue
    r.close()


def test_status_shows_each_tenants_messages_share_and_live_jobs(redis_url, capsys):
    r = redis_lib.Redis.from_url(redis_url)
    Client(redis_url, model=MODEL, tenant="acme").submit_many([row(f"a-{i}") for i in range(4)])
    Client(redis_url, model=MODEL, tenant="beta").submit(row("b"), backfill=True)
    Client(redis_url, model=MODEL).submit(row("keyless"))
    r.hset(keys.TENANT_SHARES_KEY, "gamma", 2)
    status = gather(r, [MODEL], tenants=True)
    m = status["models"][MODEL]
    assert m["queues"] == {"online": 5, "backfill": 1}
    assert m["tenants"] == {"acme": {"online": 4, "backfill": 0, "share": 1.0, "live_jobs": 0},
                            "beta": {"online": 0, "backfill": 1, "share": 1.0, "live_jobs": 0},
                            "gamma": {"online": 0, "backfill": 0, "share": 2.0, "live_jobs": 0}}
    assert "    acme: online 4 | backfill 0 | share 1 | live jobs 0" in render(status).splitlines()
    assert main(["--redis", redis_url, "--model", MODEL, "--tenants", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"][MODEL]["tenants"]["gamma"]["share"] == 2.0
    r.close()
