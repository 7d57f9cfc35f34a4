"""The worker's take and restore scripts on fakeredis, and how held records tell ours from kombu's."""

from __future__ import annotations

import json
import time

import redis as redis_lib

from vela2.wire import keys, taking

Q = keys.online_queue("m")


def _take(r: redis_lib.Redis, lists: list[str], most: int, prefix: str = "p") -> list[tuple[bytes, bytes, bytes]]:
    reply = r.eval(taking.TAKE_SCRIPT, 2 + len(lists), keys.UNACKED_KEY, keys.UNACKED_INDEX_KEY, *lists,
                   repr(time.time()), most, prefix)
    return [tuple(reply[i:i + 3]) for i in range(0, len(reply), 3)]


def test_the_scripts_run_on_fakeredis_too():
    import fakeredis

    r = fakeredis.FakeRedis()
    r.lpush(Q, b"a")
    (_, tag, item), = _take(r, [Q], 2)
    assert item == b"a" and r.eval(taking.RESTORE_SCRIPT, 2, keys.UNACKED_KEY, keys.UNACKED_INDEX_KEY, tag, 0) == 1
    assert r.lrange(Q, 0, -1) == [b"a"]


def test_split_held_tells_our_records_from_kombus():
    assert taking.split_held(taking.held_record("vela2.m", b"{}")) == ("vela2.m", b"{}")
    assert taking.split_held(json.dumps([{"body": ""}, "", "vela2.m"]).encode()) is None
    assert taking.version_problem("6.0.16") and taking.version_problem("6.2.14") is None
    assert taking.version_problem("7.4.1") is None and taking.version_problem("weird") is None


