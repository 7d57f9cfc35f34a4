"""Tenants' resources (issue 38): the queued, stored_bytes, tokens_per_s and job_lines quotas refuse
before anything is written (keyless callers' from --quotas-file), shares reach the workers' Redis,
and `vela2 status --tenants` shows each tenant's usage."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest
import redis as redis_lib

from producer import AsyncClient, Client, QuotaExceeded
from producer.quotas import Quotas
from producer.status import gather, main, render
from tests.support.tenants import tenant_keys
from vela2.wire import keys, usage

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


def test_stored_bytes_refuse_a_tenant_with_507_once_its_results_hold_the_quota(redis_url, http_server,
                                                                                fake_worker, tmp_path):
    """acme may hold 1 byte of results: its first request is accepted and answered; once the route
    has read what that answer holds (at most USAGE_CACHE_S later), acme's next request is 507
    quota_exceeded and queues nothing, while beta is served."""
    path = tmp_path / "keys.jsonl"
    headers = tenant_keys(path, {"acme": Quotas(stored_bytes=1), "beta": None})
    base = http_server(redis_url, "--api-keys-file", str(path))
    fake_worker()
    r = redis_lib.Redis.from_url(redis_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        first = http.post("/v1/system_one", json={**REQUEST, "id": "s-1"}, headers=headers["acme"])
        assert first.status_code == 200, first.text
        held = usage.stored_bytes(r, "acme")
        assert held == len(keys.result_key("acme/s-1")) + len(r.get(keys.result_key("acme/s-1")))
        deadline = time.monotonic() + 10
        while (got := http.post("/v1/system_one", json={**REQUEST, "id": "s-2"}, params={"wait_s": 0},
                                headers=headers["acme"])).status_code != 507:
            assert got.status_code in (200, 202) and time.monotonic() < deadline, got.text
            time.sleep(0.05)
        err = got.json()["error"]
        said = re.search(r"quota stored_bytes of this tenant is 1; it holds ([\d,]+)", err["message"])
        assert err["type"] == "quota_exceeded" and said, err
        assert held <= int(said[1].replace(",", "")) <= usage.stored_bytes(r, "acme")  # s-2 may have come in
        assert got.headers["Retry-After"] == "60"
        assert http.get("/v1/results/s-2", headers=headers["acme"]).status_code in (200, 404)  # never queued now
        assert http.post("/v1/system_one", json={**REQUEST, "id": "b-1"}, headers=headers["beta"]).status_code == 200
    r.close()


def test_a_tenant_over_its_tokens_per_s_is_refused_until_its_rate_falls(redis_url, http_server, tmp_path):
    """The workers report acme's served tokens (here written as they would be): past tokens_per_s
    acme gets 429 quota_exceeded; beta, with none counted, is accepted."""
    path = tmp_path / "keys.jsonl"
    headers = tenant_keys(path, {"acme": Quotas(tokens_per_s=100), "beta": Quotas(tokens_per_s=100)})
    base = http_server(redis_url, "--api-keys-file", str(path))
    r = redis_lib.Redis.from_url(redis_url)
    now = time.time()
    for second in range(-3, 6):  # a steady 1,000 tokens a second for the next seconds
        usage.report_tokens(r, {"acme": 1_000}, now=now + second)
    with httpx.Client(base_url=base, timeout=30) as http:
        got = http.post("/v1/system_one", json=REQUEST, params={"wait_s": 0}, headers=headers["acme"])
        assert got.status_code == 429, got.text
        assert "quota tokens_per_s of this tenant is 100; this would make it 1,000" in got.json()["error"]["message"]
        assert not r.exists(keys.submitted_key("acme/s-0"))
        got = http.post("/v1/system_one", json=REQUEST, params={"wait_s": 0}, headers=headers["beta"])
        assert got.status_code == 202, got.text
    r.close()


def test_keyless_callers_get_the_quotas_file_default(redis_url, http_server, tmp_path):
    """A route without authentication applies the quotas file's tenant "" to every caller."""
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps({"": {"queued": 2}, "acme": {"queued": 99}}))
    base = http_server(redis_url, "--quotas-file", str(path))  # --no-auth: keyless callers
    with httpx.Client(base_url=base, timeout=30) as http:
        got = [http.post("/v1/system_one", json={**REQUEST, "id": f"k-{i}"}, params={"wait_s": 0})
               for i in range(3)]
    assert [g.status_code for g in got] == [202, 202, 429], [g.text for g in got]
    assert "quota queued of this tenant is 2; this would make it 3" in got[2].json()["error"]["message"]


def test_status_shows_each_tenants_messages_share_jobs_and_stored_bytes(redis_url, capsys):
    r = redis_lib.Redis.from_url(redis_url)
    Client(redis_url, model=MODEL, tenant="acme").submit_many([row(f"a-{i}") for i in range(4)])
    Client(redis_url, model=MODEL, tenant="beta").submit(row("b"), backfill=True)
    Client(redis_url, model=MODEL).submit(row("keyless"))
    r.hset(keys.TENANT_SHARES_KEY, "gamma", 2)
    at, keep = usage.count_args(600)
    r.hset(keys.stored_key("delta"), str(at), 1_234)
    r.hset(keys.stored_key(""), str(at), 5)
    r.zadd("vela2:quota:acme:jobs", {"vela2:job:acme/j1": time.time()})  # a live job of 7 lines
    r.hset("vela2:quota:acme:job-lines", "vela2:job:acme/j1", 7)
    r.hset("vela2:job:acme/j1", "total", 7)
    status = gather(r, [MODEL], tenants=True)
    m = status["models"][MODEL]
    assert m["queues"] == {"online": 5, "backfill": 1}
    zero = {"online": 0, "backfill": 0, "share": 1.0, "live_jobs": 0, "job_lines": 0, "stored_bytes": 0}
    assert m["tenants"] == {"(keyless)": {**zero, "stored_bytes": 5},
                            "acme": {**zero, "online": 4, "live_jobs": 1, "job_lines": 7},
                            "beta": {**zero, "backfill": 1},
                            "delta": {**zero, "stored_bytes": 1_234},
                            "gamma": {**zero, "share": 2.0}}
    assert ("    acme: online 4 | backfill 0 | share 1 | live jobs 1 (7 lines) | stored 0 bytes"
            in render(status).splitlines())
    assert main(["--redis", redis_url, "--model", MODEL, "--tenants", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"][MODEL]["tenants"]["gamma"]["share"] == 2.0
    r.close()
