"""Visibility leases: a live worker keeps the messages it holds from being handed to another worker.

kombu's Redis transport records each delivered message in the `unacked_index` sorted set, scored
with its delivery time, and any worker's periodic sweep puts a message back on its queue once that
score is older than the visibility timeout. A long request (thousands of windows) or a deep buffer
could outlast any fixed timeout and be scored twice; and a long timeout makes a dead worker's
messages wait that long. So while the engine makes progress, a small thread re-scores the
messages it holds to "now" every quarter of the visibility timeout (ZADD XX: an acked message is
never re-added). A dead worker stops renewing, and its messages come back one visibility timeout
later; a stalled engine (no turn for a whole visibility timeout, e.g. a hung device) stops renewing
too, so its messages go to a live worker.

The same thread beats every keys.HEARTBEAT_S into `keys.workers_key(model)` (a sorted set: worker id
-> unix time) while the engine makes progress, so `vela2 http`'s /readyz knows whether a live
worker serves the model; a stalled engine stops beating as it stops renewing. With each beat it
reads the tenants' weights in the fair share (keys.TENANT_SHARES_KEY, written by `vela2 http` from
its keys file) and hands them to the engine's scheduler.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from vela2.wire import keys

log = logging.getLogger(__name__)

_MAX_INTERVAL_S = 30.0  # renew at least this often, however long the visibility timeout
_CHUNK = 1000  # tags per ZADD


def read_shares(raw: dict[Any, Any]) -> dict[str, float]:
    """Tenant -> weight from the shares hash (an unreadable or non-positive weight counts as 1)."""
    out: dict[str, float] = {}
    for k, v in raw.items():
        try:
            w = float(v)
        except (TypeError, ValueError):
            continue
        if w > 0:
            out[k.decode() if isinstance(k, bytes) else str(k)] = w
    return out


class Leases:
    """The delivery tags an engine holds, renewed from a thread of their own."""

    def __init__(self, redis: Any | None, visibility_timeout_s: float, progress: Callable[[], float] | None = None,
                 clock: Callable[[], float] = time.monotonic, heartbeat: tuple[str, str] | None = None,
                 beats: Any = None, describe: Callable[[], dict[str, Any]] | None = None,
                 shares: Callable[[dict[str, float]], None] | None = None):
        self.redis = redis  # the Redis broker: its unacked index is renewed (None: RabbitMQ, nothing to renew)
        # (model name, worker id): beat into keys.workers_key(model) while the engine makes progress,
        # in `beats` (the result store, where `vela2 http` reads them; default the broker's Redis)
        self.heartbeat = heartbeat
        self.beats: Any = redis if beats is None else beats
        self.describe = describe  # the worker's description, written with every beat (keys.worker_info_key)
        self.shares = shares  # given the tenants' weights (keys.TENANT_SHARES_KEY) after every beat
        self.beat_error: str | None = None  # why the last heartbeat failed (None: it went through)
        self.visibility_timeout_s = float(visibility_timeout_s)
        self.interval_s = max(0.2, min(_MAX_INTERVAL_S, self.visibility_timeout_s / 4))
        self.progress = progress  # when the engine last made progress (clock seconds); None: always
        self.clock = clock
        self.renewals = 0  # ZADD rounds done (tests read it)
        self._tags: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, tag: str | None) -> None:
        if tag:
            with self._lock:
                self._tags.add(tag)

    def release(self, tag: str | None) -> None:
        if tag:
            with self._lock:
                self._tags.discard(tag)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="vela2-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.heartbeat is not None:  # a worker that stops is not ready any more
            try:
                self.beats.zrem(keys.workers_key(self.heartbeat[0]), self.heartbeat[1])
                self.beats.delete(keys.worker_info_key(*self.heartbeat))
            except Exception as e:  # Redis away: the beat goes stale on its own
                log.warning("removing the heartbeat failed: %s", e)

    def beat(self) -> None:
        """Record this worker as live now (and drop heartbeats of workers gone for a while)."""
        if self.heartbeat is None:
            return
        model, worker_id = self.heartbeat
        now = time.time()
        pipe = self.beats.pipeline(transaction=False)
        pipe.zadd(keys.workers_key(model), {worker_id: now})
        pipe.zremrangebyscore(keys.workers_key(model), "-inf", now - 60 * keys.HEARTBEAT_S)
        if self.describe is not None:
            info = {**self.describe(), "beat_at": now}
            pipe.set(keys.worker_info_key(model, worker_id), json.dumps(info), ex=int(3 * keys.HEARTBEAT_S) + 1)
        pipe.execute()
        if self.shares is not None:  # where the take script reads them: the Redis broker, else the store
            self.shares(read_shares((self.redis or self.beats).hgetall(keys.TENANT_SHARES_KEY)))

    def stalled(self) -> bool:
        """True when the engine has made no progress for a whole visibility timeout."""
        return self.progress is not None and self.clock() - self.progress() > self.visibility_timeout_s

    def renew(self) -> int:
        """Re-score every held message to now (one pipelined round trip); returns how many."""
        with self._lock:
            tags = list(self._tags)
        if not tags or self.redis is None:
            return 0
        now = time.time()  # kombu scores with wall-clock time
        pipe = self.redis.pipeline(transaction=False)
        for k in range(0, len(tags), _CHUNK):
            pipe.zadd(keys.UNACKED_INDEX_KEY, {t: now for t in tags[k : k + _CHUNK]}, xx=True)
        pipe.execute()
        self.renewals += 1
        return len(tags)

    def _run(self) -> None:
        warned = False
        tick = min(self.interval_s, keys.HEARTBEAT_S) if self.heartbeat is not None else self.interval_s
        next_renew = self.clock() + self.interval_s
        self._beat_safely()
        while not self._stop.wait(tick):
            if self.stalled():
                if not warned:
                    log.error("the engine made no progress for %.0f s: no longer renewing its %d messages' "
                              "visibility, so other workers take them", self.visibility_timeout_s, len(self._tags))
                    warned = True
                continue
            warned = False
            self._beat_safely()
            if self.clock() < next_renew:
                continue
            next_renew = self.clock() + self.interval_s
            try:
                self.renew()
            except Exception as e:  # Redis away: the next round tries again (the timeout is 4 rounds away)
                log.warning("renewing the visibility of %d messages failed: %s", len(self._tags), e)

    def _beat_safely(self) -> None:
        try:
            self.beat()
            self.beat_error = None
        except Exception as e:  # Redis away: the next tick tries again
            self.beat_error = f"{type(e).__name__}: {e}"
            log.warning("the heartbeat failed: %s", e)
