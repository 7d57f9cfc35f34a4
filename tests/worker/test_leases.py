"""Visibility leases: held messages are re-scored in kombu's unacked index while the engine lives."""

from __future__ import annotations

import time

import fakeredis

from vela2.wire.keys import UNACKED_INDEX_KEY
from worker.leases import Leases


def test_held_messages_are_renewed_and_released_ones_never_come_back():
    r = fakeredis.FakeRedis()
    r.zadd(UNACKED_INDEX_KEY, {"held": 1.0, "acked": 1.0})
    leases = Leases(r, visibility_timeout_s=60)
    leases.hold("held")
    leases.hold("acked")
    leases.release("acked")
    r.zrem(UNACKED_INDEX_KEY, "acked")  # kombu's ack
    assert leases.renew() == 1
    assert r.zscore(UNACKED_INDEX_KEY, "held") > time.time() - 5
    assert r.zscore(UNACKED_INDEX_KEY, "acked") is None  # ZADD XX: an acked message is never re-added
    assert leases.interval_s == 15


def test_a_stalled_engine_stops_renewing():
    now = [100.0]
    leases = Leases(fakeredis.FakeRedis(), visibility_timeout_s=10, progress=lambda: 95.0, clock=lambda: now[0])
    assert not leases.stalled()
    now[0] = 106.0
    assert leases.stalled()


def test_the_thread_renews_on_its_own():
    r = fakeredis.FakeRedis()
    r.zadd(UNACKED_INDEX_KEY, {"t": 1.0})
    leases = Leases(r, visibility_timeout_s=0.8)  # renews every 0.2 s
    leases.hold("t")
    leases.start()
    try:
        deadline = time.monotonic() + 10
        while r.zscore(UNACKED_INDEX_KEY, "t") < 2.0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        leases.stop()
    assert leases.renewals >= 1
