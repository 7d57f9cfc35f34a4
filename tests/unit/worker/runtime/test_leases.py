"""Visibility leases: held messages are re-scored in kombu's unacked index while the engine lives."""

from __future__ import annotations

import time

import fakeredis

from vela2.wire.keys import UNACKED_INDEX_KEY
from worker.runtime.leases import Leases


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


def test_a_live_engine_beats_and_a_stalled_or_stopped_one_drops_out():
    from vela2.wire.keys import workers_key

    r = fakeredis.FakeRedis()
    progress = [time.monotonic()]
    r.zadd(workers_key("m"), {"gone-long-ago": time.time() - 3600})
    leases = Leases(r, visibility_timeout_s=0.8, progress=lambda: progress[0], heartbeat=("m", "w-1"))
    leases.start()
    try:
        deadline = time.monotonic() + 10
        while r.zscore(workers_key("m"), "w-1") is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert r.zscore(workers_key("m"), "gone-long-ago") is None  # dropped by the live one's beat
        progress[0] = time.monotonic() - 100  # the engine stalls: no more beats
        time.sleep(0.5)
        last = r.zscore(workers_key("m"), "w-1")
        time.sleep(0.5)
        assert r.zscore(workers_key("m"), "w-1") == last
    finally:
        leases.stop()
    assert r.zscore(workers_key("m"), "w-1") is None  # a stopped worker is not ready
