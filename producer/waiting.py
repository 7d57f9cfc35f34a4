"""How the synchronous client waits for answers: one id on its result key's pub/sub channel (no
polling; over one pub/sub connection per client and thread, kept between waits: `Subscriptions`),
many ids with ONE MGET per poll over the result and marker keys of those still missing
(MGET is atomic, so the worker's result-and-marker write is never seen half done). An id whose
answer came and expired (its marker says "answered", its result is gone) ends the wait at once:
ResultExpired for one id, a stand-in result for many. With a `check` (the client's
producer.liveness check) a wait that finds no answer ends with NoWorker once no worker of the model
has beaten for the grace period: an answer stored already is returned first, never NoWorker.
No celery, no torch.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import redis as redis_lib

from producer.answers import result_expired_error
from vela2.errors import InvalidRequest, NoWorker, Vela2Error
from vela2.wire.keys import result_key
from vela2.wire.results import split_state, state_keys, state_of

_POLL_START_S = 0.005  # first poll interval of wait_many; doubles up to _POLL_MAX_S
_POLL_MAX_S = 0.2
# Channels of a thread's finished waits stay subscribed until this many, then go in one UNSUBSCRIBE
# (one command per wait saved; a publish on one meanwhile is read and ignored by the next wait).
STALE_MAX = 32


def check_timeout(timeout_s: Any) -> float | None:
    """A wait's `timeout_s` as the waits take it: None or infinity (wait for ever: None), a number
    (<= 0: one look, no wait); InvalidRequest naming it for NaN, which would never time out, or for
    anything that is not a number."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or math.isnan(timeout_s):
        raise InvalidRequest(f"timeout_s must be a number of seconds or None; got {timeout_s!r}")
    return None if math.isinf(timeout_s) and timeout_s > 0 else max(0.0, float(timeout_s))


def read_one(redis: Any, request_id: str, parse: Callable[[Any], Any]) -> Any:
    """The parsed result now, or None; raises ResultExpired when the answer came and went."""
    raw, marker = redis.mget(state_keys([request_id]))
    if state_of(raw, marker) == "expired":
        raise result_expired_error(request_id)
    return parse(raw)


class Subscriptions:
    """The result channels' pub/sub connections of one synchronous client: one per thread that
    waits, kept open between its waits (a connection per wait cost Redis a connect, HELLO and two
    CLIENT SETINFO each time), closed with the client. A thread's connection is subscribed while it
    waits to the key it waits on, and to at most STALE_MAX keys of its finished waits."""

    def __init__(self, redis: Any):
        self.redis = redis
        self._local = threading.local()
        self._open: weakref.WeakSet[Any] = weakref.WeakSet()  # every thread's, for close (a dead thread's goes)
        self._lock = threading.Lock()

    def get(self) -> Any:
        """This thread's pub/sub (made on its first wait)."""
        pubsub = getattr(self._local, "pubsub", None)
        if pubsub is None:
            pubsub = self._local.pubsub = self.redis.pubsub()
            with self._lock:
                self._open.add(pubsub)
        return pubsub

    def drop(self) -> None:
        """Close this thread's pub/sub (after an error left it in an unknown state): the next wait makes anew."""
        pubsub, self._local.pubsub = getattr(self._local, "pubsub", None), None
        self._local.stale = []
        if pubsub is not None:
            pubsub.close()

    def done(self, key: str) -> None:
        """A wait on `key` ended: its channel joins the stale ones, all unsubscribed in one command
        once there are STALE_MAX."""
        stale = self._local.__dict__.setdefault("stale", [])
        stale.append(key)
        if len(stale) < STALE_MAX:
            return
        self._local.stale = []
        try:
            self.get().unsubscribe(*stale)
        except redis_lib.exceptions.RedisError:
            self.drop()

    def close(self) -> None:
        """Close every thread's pub/sub."""
        with self._lock:
            opened, self._open = list(self._open), weakref.WeakSet()
        for pubsub in opened:
            pubsub.close()


def _checked(check: Callable[[], None], redis: Any, request_id: str, parse: Callable[[Any], Any]) -> Any:
    """None, or the answer stored meanwhile when `check` raised NoWorker (one more read, then); the
    NoWorker when there is still none."""
    try:
        check()
    except NoWorker:
        found = read_one(redis, request_id, parse)  # it may have come since the last look
        if found is None:
            raise
        return found
    return None


def wait_one(redis: Any, request_id: str, timeout_s: float | None, parse: Callable[[Any], Any],
             subs: Subscriptions | None = None, check: Callable[[], None] | None = None) -> Any:
    """Wait on the result key's pub/sub channel (no polling) of `subs` (None: a connection of this
    wait's own); TimeoutError after timeout_s, ResultExpired as soon as the marker says the answer
    came and expired, NoWorker when `check` raises it (called about every second of the wait). An
    answer stored already is read by one MGET, with no subscription."""
    timeout_s = check_timeout(timeout_s)
    found = read_one(redis, request_id, parse)
    if found is not None:
        return found
    key = result_key(request_id)
    channels = (key, key.encode("utf-8", "surrogatepass"))  # as a decoding client or a plain one tells it
    pubsub = redis.pubsub() if subs is None else subs.get()
    clean = False
    try:
        pubsub.subscribe(key)  # subscribe first, then read: a result written in between is not missed
        found = read_one(redis, request_id, parse)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while found is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no result for {request_id!r} after {timeout_s} s")
            if check is not None and (found := _checked(check, redis, request_id, parse)) is not None:
                break
            msg = pubsub.get_message(timeout=min(left, 1.0))
            if msg is None:  # a second without a word: a reconnect may have dropped the publish
                found = read_one(redis, request_id, parse)
            elif msg.get("type") == "message" and msg.get("channel") in channels:
                found = parse(msg["data"])
            # else: a (un)subscribe confirmation, or a publish on a key waited on before: read on
        clean = True
        return found
    except (TimeoutError, Vela2Error):
        clean = True  # the connection is sound: only the wait ended
        raise
    finally:
        if subs is None:
            pubsub.close()
        elif clean:
            subs.done(key)
        else:
            subs.drop()


def wait_many(redis: Any, ids: list[str], timeout_s: float | None, parse: Callable[[Any], Any],
              expired: Callable[[str], Any], check: Callable[[], None] | None = None) -> dict[str, Any]:
    """id -> its parsed result, `expired(id)` for an id whose answer expired, or None for an id with
    no result when `timeout_s` (already checked: `check_timeout`) runs out; one MGET per poll, the
    pause doubling from _POLL_START_S up to _POLL_MAX_S. NoWorker (with the answers read in `done`)
    when `check`, called after each poll that left ids missing, raises it."""
    out: dict[str, Any] = dict.fromkeys(ids)
    missing = list(dict.fromkeys(ids))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pause = _POLL_START_S
    while missing:
        still = []
        for rid, (raw, marker) in split_state(missing, redis.mget(state_keys(missing))).items():
            value = expired(rid) if state_of(raw, marker) == "expired" else parse(raw)
            if value is None:
                still.append(rid)
            else:
                out[rid] = value
        missing = still
        if not missing or (deadline is not None and time.monotonic() >= deadline):
            break
        if check is not None:
            try:
                check()
            except NoWorker as e:
                e.done = {rid: value for rid, value in out.items() if value is not None}
                raise
        time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
        pause = min(pause * 2, _POLL_MAX_S)
    return out
