"""The worker's channel against a real redis-server: a take pops and records in one step, in
priority order, bounded by the QoS credit; a restore puts the exact item back; nothing is taken
while Redis is full; a kombu consumer on the channel gets every message, waits for new ones, and
gives back what it did not ack."""

from __future__ import annotations

import json
import time

import pytest
import redis as redis_lib
from kombu import Connection, Consumer, Queue

from tests.unit.worker.transport.test_redis import Q, _take
from vela2.wire import keys, taking
from vela2.wire.messages import build_message


@pytest.fixture
def r(redis_url):
    client = redis_lib.Redis.from_url(redis_url)
    yield client
    client.close()


ROW = {"id": "r-1", "task": "choice:boolq", "text": "The sky is green.",
       "questions": [{"question": "Is it?", "options": ["yes", "no"]}]}


def test_a_take_pops_in_priority_order_and_records_each_item_as_held(r):
    prio = keys.priority_lists(Q)[1]
    r.lpush(Q, b"a1", b"a2")  # a1 is the oldest (taken first)
    r.lpush(prio, b"\xff\x00 raw bytes")
    r.lpush(keys.backfill_queue("m"), b"b1")
    lists = [Q, keys.backfill_queue("m"), prio]
    got = _take(r, lists, 3)
    assert [(k.decode(), item) for k, _, item in got] == [(Q, b"a1"), (Q, b"a2"), (keys.backfill_queue("m"), b"b1")]
    tags = [t.decode() for _, t, _ in got]
    assert len(set(tags)) == 3 and all(t.startswith("p.") for t in tags)
    for k, t, item in got:
        assert taking.split_held(r.hget(keys.UNACKED_KEY, t)) == (k.decode(), item)
        assert r.zscore(keys.UNACKED_INDEX_KEY, t) == pytest.approx(time.time(), abs=5)
    (k, t, item), = _take(r, lists, 5, "q")
    assert item == b"\xff\x00 raw bytes" and r.llen(prio) == 0 and _take(r, lists, 5) == []
    assert r.eval(taking.RESTORE_SCRIPT, 2, keys.UNACKED_KEY, keys.UNACKED_INDEX_KEY, t, 0) == 1
    assert r.lrange(prio, 0, -1) == [b"\xff\x00 raw bytes"]  # byte for byte, on its own list
    assert not r.hexists(keys.UNACKED_KEY, t) and r.zscore(keys.UNACKED_INDEX_KEY, t) is None
    assert r.eval(taking.RESTORE_SCRIPT, 2, keys.UNACKED_KEY, keys.UNACKED_INDEX_KEY, t, 0) == 0


def test_restore_puts_an_item_at_either_end(r):
    r.lpush(Q, b"x")
    (_, t, _), = _take(r, [Q], 1)
    r.lpush(Q, b"newer", b"newest")
    r.eval(taking.RESTORE_SCRIPT, 2, keys.UNACKED_KEY, keys.UNACKED_INDEX_KEY, t, 1)  # leftmost: taken last
    assert r.lrange(Q, 0, -1) == [b"x", b"newest", b"newer"]


def test_a_take_while_redis_is_full_moves_items_whole_and_a_restore_changes_nothing(redis_server_factory):
    server = redis_server_factory()
    r = redis_lib.Redis.from_url(server.url())
    r.lpush(Q, b"m1", b"m2")
    try:
        r.config_set("maxmemory", 1)  # full: every write that adds memory is refused
        with pytest.raises(redis_lib.exceptions.OutOfMemoryError):
            r.set("x", "y")
        (key, tag, item), = _take(r, [Q], 1)  # its first write is the pop: it runs whole
        assert item == b"m1" and taking.split_held(r.hget(keys.UNACKED_KEY, tag)) == (Q, b"m1")
        with pytest.raises(redis_lib.exceptions.OutOfMemoryError):  # the push is refused first
            r.eval(taking.RESTORE_SCRIPT, 2, keys.UNACKED_KEY, keys.UNACKED_INDEX_KEY, tag, 0)
        assert r.hexists(keys.UNACKED_KEY, tag) and r.lrange(Q, 0, -1) == [b"m2"]
        r.config_set("maxmemory", 0)
        assert r.eval(taking.RESTORE_SCRIPT, 2, keys.UNACKED_KEY, keys.UNACKED_INDEX_KEY, tag, 0) == 1
        assert r.lrange(Q, 0, -1) == [b"m2", b"m1"] and not r.hexists(keys.UNACKED_KEY, tag)
    finally:
        r.close()


def _connection(url: str) -> Connection:
    return Connection(url, transport="worker.transport.redis:RedisTransport",
                      transport_options={"queue_order_strategy": "priority", "visibility_timeout": 3600})


def _publish(r: redis_lib.Redis, rid: str, queue: str = Q) -> None:
    r.lpush(queue, build_message([{**ROW, "id": rid}], queue, message_id=rid).payload)


def _drain(conn: Connection, consumer_queues: list[Queue], want: int, *, ack: bool, prefetch: int | None = None,
           before_each=None) -> list:
    got: list = []

    def on_message(body, message):
        got.append(message)
        if ack:
            message.ack()

    with Consumer(conn, queues=consumer_queues, callbacks=[on_message], accept=None) as consumer:
        if prefetch:
            consumer.qos(prefetch_count=prefetch)
        deadline = time.monotonic() + 20
        while len(got) < want:
            assert time.monotonic() < deadline, f"{len(got)} of {want} delivered"
            if before_each:
                before_each(len(got))
            try:
                conn.drain_events(timeout=0.5)
            except TimeoutError:
                pass
    return got


def test_a_consumer_gets_every_message_online_first_and_acks_clear_them(r, redis_url):
    for i in range(5):
        _publish(r, f"b-{i}", keys.backfill_queue("m"))
    for i in range(5):
        _publish(r, f"o-{i}")
    queues = [Queue(q, routing_key=q) for q in keys.queues("m")]
    with _connection(redis_url) as conn:
        got = _drain(conn, queues, 10, ack=True)
    assert [m.headers["id"] for m in got] == [f"o-{i}" for i in range(5)] + [f"b-{i}" for i in range(5)]
    assert r.hlen(keys.UNACKED_KEY) == 0 and r.zcard(keys.UNACKED_INDEX_KEY) == 0


def test_a_waiting_consumer_takes_what_arrives_and_the_credit_bounds_a_take(r, redis_url):
    sent: list[str] = []

    def publish_later(n_got: int) -> None:
        if len(sent) == n_got and len(sent) < 3:  # one at a time, once the consumer waits on an empty queue
            sent.append(f"late-{len(sent)}")
            _publish(r, sent[-1])

    queues = [Queue(Q, routing_key=Q)]
    with _connection(redis_url) as conn:
        got = _drain(conn, queues, 3, ack=True, before_each=publish_later)
        assert [m.headers["id"] for m in got] == sent
        for i in range(6):
            _publish(r, f"c-{i}")
        held = _drain(conn, queues, 2, ack=False, prefetch=2)
        # unacked, the consumer holds exactly its credit; the other four are still queued
        assert len(held) == 2 and r.llen(Q) == 4 and r.hlen(keys.UNACKED_KEY) == 2
    # closing the channel gave the unacked two back (restore at shutdown), byte for byte
    assert r.llen(Q) == 6 and r.hlen(keys.UNACKED_KEY) == 0
    assert {json.loads(x)["headers"]["id"] for x in r.lrange(Q, 0, -1)} == {f"c-{i}" for i in range(6)}


def test_an_idle_consumer_waits_on_the_doorbell_at_most_its_idle_wait(r, redis_url, monkeypatch):
    # an idle consumer blocks on the model's doorbell (rung by a push of our producers onto an empty list) at most
    # the worker's idle_wait_s (its transport option); a message pushed without ringing it (a plain LPUSH
    # here) is still taken after that wait
    sent: list[tuple] = []
    got: list = []
    queues = [Queue(q, routing_key=q) for q in keys.queues("m")]
    options = {"queue_order_strategy": "priority", "visibility_timeout": 3600, "idle_wait_s": 0.1}
    conn = Connection(redis_url, transport="worker.transport.redis:RedisTransport", transport_options=options)
    with conn, Consumer(conn, queues=queues, accept=None, callbacks=[lambda body, m: (got.append(m), m.ack())]):
        real_send = redis_lib.connection.Connection.send_command
        monkeypatch.setattr(redis_lib.connection.Connection, "send_command",
                            lambda self, *a, **kw: (sent.append(a), real_send(self, *a, **kw))[1])
        deadline = time.monotonic() + 10
        while sum(a[0] == "BLMOVE" for a in sent) < 2:  # idle: it took nothing and waited, twice
            assert time.monotonic() < deadline, f"no wait seen in {[a[0] for a in sent]}"
            try:
                conn.drain_events(timeout=0.2)
            except TimeoutError:
                pass
        waits = [a for a in sent if a[0] == "BLMOVE"]
        assert all(a[1] == keys.bell_key(Q) and a[-1] == 0.1 for a in waits), waits
        _publish(r, "late-backfill", keys.backfill_queue("m"))
        while not got:
            assert time.monotonic() < deadline, "the backfill arrival was never taken"
            try:
                conn.drain_events(timeout=0.2)
            except TimeoutError:
                pass
    assert [m.headers["id"] for m in got] == ["late-backfill"]


def test_a_record_kombu_wrote_itself_is_still_restored(r, redis_url):
    payload = json.loads(build_message([ROW], Q, message_id="old-1").payload)
    r.hset(keys.UNACKED_KEY, "kombu-tag", json.dumps([payload, "", Q]))
    r.zadd(keys.UNACKED_INDEX_KEY, {"kombu-tag": 1.0})
    with _connection(redis_url) as conn:
        conn.default_channel.qos.restore_by_tag("kombu-tag")
    (item,) = r.lrange(Q, 0, -1)
    assert json.loads(item)["headers"]["id"] == "old-1" and r.hlen(keys.UNACKED_KEY) == 0


def test_refreshing_bindings_while_redis_is_full_waits_instead_of_logging_tracebacks(monkeypatch, redis_url, caplog):
    from kombu.transport import redis as kombu_redis

    from worker.transport.retry import BLOCKED

    def full(self):
        raise redis_lib.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'")

    monkeypatch.setattr(kombu_redis.Channel, "maybe_refresh_binding_expiry", full)
    with _connection(redis_url) as conn:
        conn.default_channel.maybe_refresh_binding_expiry()  # no exception: kombu would log a traceback
    assert BLOCKED.since is not None and "refreshing queue bindings" in caplog.text
    BLOCKED.accepted()


def test_takes_go_by_sha1_and_send_the_text_once_after_redis_forgot_it(r, redis_url):
    """A take is EVALSHA; after SCRIPT FLUSH (as after a restart) the next take gets NOSCRIPT,
    takes nothing, and the one after sends the text (EVAL) and takes: nothing lost, nothing doubled."""
    queues = [Queue(q, routing_key=q) for q in keys.queues("m")]
    with _connection(redis_url) as conn:
        _publish(r, "before")
        assert [m.headers["id"] for m in _drain(conn, queues, 1, ack=True)] == ["before"]
        r.script_flush()
        r.config_resetstat()
        _publish(r, "after")
        assert [m.headers["id"] for m in _drain(conn, queues, 1, ack=True)] == ["after"]
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}
    assert calls.get("eval", 0) >= 1 and calls["evalsha"] >= 1 and "script|exists" not in calls
    assert r.hlen(keys.UNACKED_KEY) == 0 and r.llen(Q) == 0
