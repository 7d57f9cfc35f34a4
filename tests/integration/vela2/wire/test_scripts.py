"""Lua scripts by SHA1 (vela2.wire.scripts) against a real redis-server: EVALSHA only once Redis
knows a script, the text sent again after SCRIPT FLUSH (a restart), in a pipeline too, and a WAIT
sent again after the calls it must cover."""

from __future__ import annotations

import asyncio

import pytest
import redis as redis_lib
import redis.asyncio as aioredis

from vela2.wire import scripts

INCR = scripts.Script("return redis.call('INCRBY', KEYS[1], ARGV[1])")


def _calls(r) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


def test_a_script_is_sent_by_its_sha_and_its_text_only_after_noscript(redis_url):
    r = redis_lib.Redis.from_url(redis_url)
    r.script_flush()
    r.config_resetstat()
    assert INCR(r, ["n"], [2]) == 2  # NOSCRIPT, then EVAL (which caches it)
    assert INCR(r, ["n"], [3]) == 5
    calls = _calls(r)
    assert calls["evalsha"] == 2 and calls["eval"] == 1 and "script|exists" not in calls
    r.script_flush()  # as a restart leaves Redis
    pipe = r.pipeline(transaction=False)
    pipe.set("a", 1)
    INCR.queue(pipe, ["n"], [10])
    pipe.incr("a")  # ran once, in the first round trip
    INCR.queue(pipe, ["m"], [1])
    pipe.execute_command("WAIT", 0, 100)
    assert scripts.execute(pipe) == [True, 15, 2, 1, 0]
    assert r.get("a") == b"2" and r.get("n") == b"15" and r.get("m") == b"1"
    assert INCR(r, ["n"], [1]) == 16  # cached again: one EVALSHA
    pipe = r.pipeline(transaction=False)
    INCR.queue(pipe, ["n"], [1])
    pipe.execute_command("NOSUCHCOMMAND")
    with pytest.raises(redis_lib.exceptions.ResponseError, match="unknown command"):
        scripts.execute(pipe)
    assert r.get("n") == b"17"
    r.close()


def test_the_asyncio_forms_send_the_text_after_a_flush(redis_url):
    async def go() -> None:
        r = aioredis.Redis.from_url(redis_url)
        await r.script_flush()
        assert await INCR.run_async(r, ["x"], [4]) == 4
        await r.script_flush()
        pipe = r.pipeline(transaction=False)
        INCR.queue(pipe, ["x"], [1])
        pipe.incr("y")
        assert await scripts.execute_async(pipe) == [5, 1]
        await r.aclose()

    asyncio.run(go())
