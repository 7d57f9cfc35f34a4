"""kombu's Redis transport, made safe for a fleet: no queue item can kill a worker, and no message
is lost when Redis refuses writes (full under noeviction) or goes away mid-delivery.

- Taking is one atomic step (vela2.wire.taking): a Lua script pops up to a QoS-credit's worth of
  items from the queue lists, in kombu's priority order and fairly across tenants, and records each
  in the `unacked` hash and index under a fresh tag, in one round trip. Where kombu sends BRPOP, the
  channel sends that script; when it finds nothing, the channel blocks with `BLMOVE bell bell LEFT
  LEFT` on the model's doorbell (a no-op move that only waits for a token: every push of our
  producers leaves one, online or backfill, any tenant) and takes again when it returns, so an
  arrival is taken at once. A message pushed without the bell (plain Celery `send_task`, kombu's
  priority sub-lists) is taken by an idle worker within the wait (kombu's `brpop_timeout`: the
  worker's idle_wait_s, 1 s), as kombu's own BRPOP would: an idle worker sends Redis one wait and
  one empty take a second (before issue 42: twenty of each). A busy worker takes from every list
  each time it takes. A message is never
  in neither the queue nor `unacked`: not when the worker dies, and not when Redis exits between
  a pop and its reply (which lost BRPOP's messages). While Redis is full (noeviction) a take still
  moves items into `unacked` whole (see vela2.wire.taking); results and acks then wait, logging
  once per interval and setting `vela2_redis_write_blocked_seconds` (worker.transport.retry).
- A restore (warm shutdown, a timed-out delivery) puts the held item back, byte for byte, on the
  list it came from, in one script.
- Every taken item is looked at before kombu parses it (vela2.wire.messages.triage): anything that
  is not a protocol-2 message of ours (not JSON, nested too deep, headers not an object, another
  task, protocol 1, an unknown body encoding...) is wrapped so the engine answers the ids found in
  it or dead-letters it, acking only after that is stored. Celery's built-in tasks are never run.
- The periodic restore of timed-out messages is skipped while Redis refuses writes (it takes a
  lock with SET NX), instead of stopping the worker; binding a queue at start-up waits like a write.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str

from vela2.wire import keys, messages, taking
from worker.transport.retry import BLOCKED, REFUSED_ERRORS, RETRY_ERRORS, until_written

log = logging.getLogger(__name__)

_BINDING_REFUSED: tuple[type[Exception], ...] = (*REFUSED_ERRORS, redis.exceptions.ExecAbortError)
TAKE_MAX = 64  # items one take may return (fewer when the QoS credit is lower)
_REFUSED_PAUSE_S = 0.5  # after Redis refused a take (full), the next one waits this long


IDLE_WAIT_OPTION = "idle_wait_s"  # the transport option of an idle worker's wait (WorkerSettings.idle_wait_s)

# How many more messages the engine wants now (None: as many as the credit allows; Engine.take_room,
# set at start by set_take_room). At 0 or less the channel takes nothing and waits ROOM_WAIT_S.
_take_room: Callable[[], int | None] | None = None
ROOM_WAIT_S = 0.005


def set_take_room(room: Callable[[], int | None] | None) -> None:
    """Have every channel take no more than `room()` messages at a time (None: no limit)."""
    global _take_room
    _take_room = room


# Tags whose held records the engine removed itself (release_held: one round trip for every message
# it acks in a turn); the consumer's ack of such a tag then only settles kombu's own bookkeeping.
_released: set[str] = set()
_released_lock = threading.Lock()


def release_held(client: Any, tags: list[str]) -> None:
    """Remove the held records of `tags` (messages whose results are all stored) in one round trip;
    the acks the consumer then runs for them skip Redis. Raises what Redis raises (the caller then
    leaves each ack to write its own removal, as kombu does)."""
    if not tags:
        return
    with client.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.UNACKED_INDEX_KEY, *tags)
        pipe.hdel(keys.UNACKED_KEY, *tags)
        pipe.execute()
    with _released_lock:
        _released.update(tags)


class TolerantQoS(kombu_redis.QoS):
    """kombu's QoS over the take script's records: nothing to write when a message is delivered
    (the take recorded it), none at an ack the engine released already, restores by one script,
    the restore sweep skipped while refused."""

    def append(self, message: Any, delivery_tag: str) -> None:
        virtual.QoS.append(self, message, delivery_tag)  # held in this process; Redis has it already

    def ack(self, delivery_tag: str) -> None:
        with _released_lock:
            released = delivery_tag in _released
            _released.discard(delivery_tag)
        if released:
            virtual.QoS.ack(self, delivery_tag)
        else:
            super().ack(delivery_tag)

    def restore_by_tag(self, tag: str, client: Any = None, leftmost: bool = False) -> None:
        with self.channel.conn_or_acquire(client) as c:
            done = taking.RESTORE(c, [self.unacked_key, self.unacked_index_key], [tag, int(leftmost)])
        if done == -1:  # recorded by kombu itself (a worker of an earlier version)
            super().restore_by_tag(tag, client, leftmost)

    def restore_visible(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().restore_visible(*args, **kwargs)
        except RETRY_ERRORS as e:  # the next sweep tries again
            BLOCKED.refused("restoring timed-out messages", e)


class TolerantChannel(kombu_redis.Channel):
    """kombu's Redis channel taking by the atomic take script, every item triaged."""

    QoS = TolerantQoS
    _sent: str | None = None  # the command awaiting its reply on the polling connection
    _wait_next = False  # the last take found nothing: wait on the first list before the next
    _refused_until = 0.0  # monotonic time before which no take is sent (Redis refused the last)
    _take_unknown = False  # Redis said NOSCRIPT to the last take: send the next with its text

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # an idle worker's wait on the doorbell (kombu's BRPOP timeout, which its health check of a
        # blocked connection also reads): the worker's idle_wait_s, from the transport options
        self.brpop_timeout = float(self.connection.client.transport_options.get(IDLE_WAIT_OPTION, self.brpop_timeout))

    def _take_lists(self, queues: list[str]) -> list[str]:
        # kombu's BRPOP order: every queue's priority-0 list first, then priority 3, 6, 9
        return [self._q_for_pri(q, pri) for pri in self.priority_steps for q in queues]

    def _take_call(self, queues: list[str], most: int) -> tuple[list[str], list[Any]]:
        """TAKE's (KEYS, ARGV): up to `most` messages from `queues`' lists."""
        lists = self._take_lists(queues)
        take_keys = taking.take_keys(lists, keys.bell_key(queues[0]), self.qos.unacked_key, self.qos.unacked_index_key)
        return take_keys, [repr(time.time()), most, uuid.uuid4().hex]

    def _take_args(self, queues: list[str], most: int) -> tuple[Any, ...]:
        """The take's command: EVALSHA, or EVAL with the text once after Redis said NOSCRIPT (a
        restart, SCRIPT FLUSH), which caches it again."""
        call = self._take_call(queues, most)
        return taking.TAKE.fallback(*call) if self._take_unknown else taking.TAKE.command(*call)

    def _brpop_start(self, timeout: float | None = None) -> None:
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues or time.monotonic() < self._refused_until:
            return  # the poller calls again on its next turn
        if self._wait_next:
            bell = keys.bell_key(queues[0])
            wait = self.brpop_timeout or 1  # the worker's idle_wait_s
            wait = wait if timeout is None else min(wait, timeout) or wait
            args: tuple[Any, ...] = ("BLMOVE", bell, bell, "LEFT", "LEFT", wait)
        else:
            credit = self.qos.can_consume_max_estimate()
            most = TAKE_MAX if credit is None else max(1, min(TAKE_MAX, credit))
            room = _take_room() if _take_room is not None else None
            if room is not None and room <= 0:  # the engine holds enough: wait a moment (a key never written)
                pause = keys.bell_key(queues[0]) + ":pause"
                args = ("BLMOVE", pause, pause, "LEFT", "LEFT", ROOM_WAIT_S)
            else:
                args = self._take_args(queues, most if room is None else min(most, room))
        self._sent = args[0]
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()  # type: ignore[assignment]  # kombu declares it None
        self.client.connection.send_command(*args)

    def _brpop_read(self, **options: Any) -> bool:
        sent, self._sent = self._sent, None
        try:
            try:
                reply = self.client.parse_response(self.client.connection, sent or "EVAL", **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            except REFUSED_ERRORS as e:  # loading, a read-only replica: the script took nothing
                BLOCKED.refused("taking messages", e)
                self._refused_until = time.monotonic() + _REFUSED_PAUSE_S
                raise kombu_redis.Empty() from None
            except redis.exceptions.NoScriptError:  # it took nothing: the next take sends the text
                self._take_unknown = True
                raise kombu_redis.Empty() from None
            if sent == "EVAL":
                self._take_unknown = False
            if sent == "BLMOVE":  # the doorbell rang, or the wait (or the pause) timed out: take next
                self._wait_next = False
                raise kombu_redis.Empty()
            self._wait_next = not reply
            if not reply:
                raise kombu_redis.Empty()
            if BLOCKED.since is not None:
                BLOCKED.accepted()
            for i in range(0, len(reply), 3):
                self._deliver_taken(reply[i], reply[i + 1], reply[i + 2])
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # as kombu resets it
            flush = getattr(self, "_flush_brpop_reauth", None)
            if flush is not None:
                flush()

    def _triaged(self, list_key: bytes, tag: bytes, item: bytes) -> tuple[str, messages.Triage]:
        """(queue, triage) of an item a take returned from `list_key` (a queue or its priority list)."""
        dest = bytes_to_str(list_key).rsplit(self.sep, 1)[0]
        return dest, messages.triage(item, dest, bytes_to_str(tag))

    def _deliver_taken(self, list_key: bytes, tag: bytes, item: bytes) -> None:
        dest, checked = self._triaged(list_key, tag, item)
        if checked.refused is not None:
            log.warning("queue item on %s refused: %s", dest, checked.refused)
        try:
            self.connection._deliver(checked.envelope, dest)
        except Exception:  # it stays held in Redis and comes back after the visibility timeout
            log.exception("delivering message %s failed", bytes_to_str(tag))

    def _get(self, queue: str, timeout: Any = None) -> dict[str, Any]:
        # basic_get: one item by the same take script
        with self.conn_or_acquire() as client:
            reply = taking.TAKE(client, *self._take_call([queue], 1))
        if not reply:
            raise kombu_redis.Empty()
        return self._triaged(*reply)[1].envelope

    def _restore(self, message: Any, leftmost: bool = False) -> None:
        self.qos.restore_by_tag(message.delivery_tag, leftmost=leftmost)

    def maybe_refresh_binding_expiry(self) -> None:
        # kombu refreshes the bindings of expiring queues (Celery's pidbox) every second with a
        # script; while Redis refuses writes it logged a traceback per tick: wait like any write
        try:
            super().maybe_refresh_binding_expiry()
        except _BINDING_REFUSED as e:  # the next tick tries again
            BLOCKED.refused("refreshing queue bindings", e)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        until_written(lambda: super(TolerantChannel, self)._queue_bind(exchange, routing_key, pattern, queue),
                      f"binding queue {queue}")

    def _size(self, queue: str) -> int:
        # a MULTI of LLENs, which Redis refuses while full
        return until_written(lambda: super(TolerantChannel, self)._size(queue), f"sizing queue {queue}")

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        until_written(lambda: super(TolerantChannel, self)._put(queue, message, **kwargs), f"queueing on {queue}")


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport with the tolerant channel (redis:// and rediss:// broker URLs)."""

    Channel = TolerantChannel


class TolerantSentinelChannel(TolerantChannel, kombu_redis.SentinelChannel):
    """The tolerant channel over kombu's Sentinel-managed pool: its connections go to the master the
    sentinels name (asked again at every reconnect, so a failover is followed)."""


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with the tolerant channel (sentinel:// broker URLs; the master's
    name in the `master_name` transport option, worker.app sets it from the URL)."""

    Channel = TolerantSentinelChannel


def ssl_options(url: str) -> dict[str, Any] | None:
    """For a rediss:// URL, the SSL options kombu needs when the transport is given explicitly
    (the URL's ssl_* query parameters; certificates required unless ssl_cert_reqs says otherwise)."""
    parts = urlsplit(url)
    if parts.scheme != "rediss":
        return None
    import ssl

    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    reqs = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
    opts: dict[str, Any] = {"ssl_cert_reqs": reqs.get(query.get("ssl_cert_reqs", "required").lower(),
                                                      ssl.CERT_REQUIRED)}
    for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if key in query:
            opts[key] = query[key]
    return opts
