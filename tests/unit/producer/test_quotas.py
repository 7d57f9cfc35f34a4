"""The route's quotas (producer.quotas): job lines reserved with the job and given back when it ends,
the quotas file (with keyless callers' quotas), the usage checks."""

from __future__ import annotations

import asyncio
import json
import re
import time

import fakeredis
import pytest

from producer.quotas import Quotas, Usage, load_quotas_file, reserve_job, upload_lines
from vela2.errors import ConfigError, QuotaExceeded
from vela2.wire import keys, usage


def test_an_upload_counts_its_lines_blank_ones_included():
    assert [upload_lines(b) for b in (b"a", b"a\n", b"a\nb", b"a\n\nb\n", b"\n")] == [1, 1, 2, 3, 1]


def test_job_lines_are_reserved_with_the_job_refused_past_the_quota_and_given_back_when_it_ends():
    r = fakeredis.FakeAsyncRedis()
    quotas = Quotas(job_lines=100, live_jobs=5)

    async def go() -> None:
        await reserve_job(r, "acme", quotas, "vela2:job:acme/j1", 60)
        with pytest.raises(QuotaExceeded) as got:
            await reserve_job(r, "acme", quotas, "vela2:job:acme/j2", 41)  # 60 + 41 > 100: nothing reserved
        assert (got.value.quota, got.value.limit, got.value.usage, got.value.status) == ("job_lines", 100, 101, 429)
        with pytest.raises(QuotaExceeded, match="quota job_lines of this tenant is 100; this would make it 101"):
            await reserve_job(r, "acme", quotas, "vela2:job:acme/j3", 101)  # alone over it: no round trip needed
        await reserve_job(r, "beta", quotas, "vela2:job:beta/j1", 100)  # another tenant's own count
        await r.hset("vela2:job:acme/j1", mapping={"total": 60})  # the job exists, running
        await reserve_job(r, "acme", quotas, "vela2:job:acme/j4", 40)  # 100: at the quota, not past it
        await r.hset("vela2:job:acme/j1", "status", "completed")  # ended: its 60 lines come back
        await reserve_job(r, "acme", quotas, "vela2:job:acme/j5", 60)
        assert sorted(await r.hkeys("vela2:quota:acme:job-lines")) == [b"vela2:job:acme/j4", b"vela2:job:acme/j5"]
        await reserve_job(r, "acme", None, "vela2:job:acme/j6", 10**9)  # no quota: nothing counted
        await reserve_job(r, "acme", Quotas(queued=1), "vela2:job:acme/j6", 10**9)
        assert await r.hlen("vela2:quota:acme:job-lines") == 2
        await r.aclose()

    asyncio.run(go())


def test_the_usage_check_refuses_stored_bytes_with_507_and_tokens_with_429():
    server = fakeredis.FakeServer()
    sync, r = fakeredis.FakeRedis(server=server), fakeredis.FakeAsyncRedis(server=server)
    at, keep = usage.count_args(3_600)
    sync.hset(keys.stored_key("acme"), str(at), 5_000)
    usage.report_tokens(sync, {"beta": 900}, now=time.time() - 1)

    async def go() -> None:
        check = Usage()
        await check.check(r, "acme", Quotas(stored_bytes=5_001))
        with pytest.raises(QuotaExceeded) as got:
            await Usage().check(r, "acme", Quotas(stored_bytes=5_000))
        assert (got.value.quota, got.value.usage, got.value.status) == ("stored_bytes", 5_000, 507)
        assert "it holds 5,000" in str(got.value)
        await Usage().check(r, "beta", Quotas(tokens_per_s=450))  # 900 over the last 2 s: 450 a second
        with pytest.raises(QuotaExceeded) as got:
            await Usage().check(r, "beta", Quotas(tokens_per_s=449))
        assert (got.value.quota, got.value.limit, got.value.usage, got.value.status) == ("tokens_per_s", 449, 450, 429)
        await r.aclose()

    asyncio.run(go())


def test_a_quotas_file_names_tenants_and_keyless_callers(tmp_path):
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps({"": {"queued": 100}, "acme": {"stored_bytes": 10_000_000, "tokens_per_s": 5_000}}))
    assert load_quotas_file(str(path)) == {"": Quotas(queued=100),
                                           "acme": Quotas(stored_bytes=10_000_000, tokens_per_s=5_000)}
    assert load_quotas_file(None) == {}
    for text, message in [("[1]", "a JSON object of tenant -> quotas"),
                          ('{"a/b": {"queued": 1}}', "a tenant name is 1-64 characters"),
                          ('{"acme": {"bytes": 1}}', "tenant 'acme': unknown quotas ['bytes']"),
                          ('{"acme": {"queued": 0}}', "quotas.queued must be a positive integer; got 0"),
                          ("{", "--quotas-file")]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_quotas_file(str(path))
    with pytest.raises(ConfigError, match="No such file"):
        load_quotas_file(str(tmp_path / "missing.json"))

def test_over_cells_the_usage_is_summed_and_a_cell_that_is_down_is_left_out():
    import redis.exceptions

    servers = [fakeredis.FakeServer(), fakeredis.FakeServer()]
    at, _ = usage.count_args(3_600)
    for server, stored in zip(servers, (3_000, 2_500), strict=True):
        fakeredis.FakeRedis(server=server).hset(keys.stored_key("acme"), str(at), stored)
    cells = [fakeredis.FakeAsyncRedis(server=s) for s in servers]
    gone = fakeredis.FakeServer()
    gone.connected = False  # fakeredis: every command raises ConnectionError
    down = fakeredis.FakeAsyncRedis(server=gone)

    async def go() -> None:
        await Usage().check(cells, "acme", Quotas(stored_bytes=5_501))  # 5,500 in all: under
        with pytest.raises(QuotaExceeded) as got:
            await Usage().check(cells, "acme", Quotas(stored_bytes=5_500))
        assert got.value.usage == 5_500  # neither cell alone holds it
        await Usage().check([cells[0], down], "acme", Quotas(stored_bytes=3_001))  # the down cell left out
        with pytest.raises(redis.exceptions.ConnectionError):  # no cell answers: the error, not a pass
            await Usage().check([down], "acme", Quotas(stored_bytes=1))

    asyncio.run(go())
