"""Waiting out Redis when it refuses writes: full under noeviction, loading after a restart, a
read-only replica during a failover, or gone for a moment. The broker channel and the engine wait
and retry instead of failing; one process-wide record says since when, for the log (once per
interval) and the metric `vela2_redis_write_blocked_seconds`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from vela2.wire.results import REFUSED_ERRORS

log = logging.getLogger(__name__)

T = TypeVar("T")

# Redis refuses the write for now (vela2.wire.results.REFUSED_ERRORS: full, loading, read-only);
# a connection error is the same for the caller: Redis will be back.
RETRY_ERRORS: tuple[type[Exception], ...] = (*REFUSED_ERRORS, redis.exceptions.ConnectionError,
                                             redis.exceptions.TimeoutError)
_LOG_EVERY_S = 30.0
_BACKOFF_MAX_S = 2.0


class _Blocked:
    """Since when writes have been refused (None: they are not), shared by every thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None
        self._logged = 0.0

    def refused(self, what: str, e: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            if self.since is None:
                self.since = now
            if now - self._logged >= _LOG_EVERY_S:
                self._logged = now
                log.error("Redis refuses writes (%s: %s) while %s; waiting (%.0f s so far), nothing is dropped",
                          type(e).__name__, e, what, now - self.since)

    def accepted(self) -> None:
        with self._lock:
            if self.since is not None:
                log.warning("Redis accepts writes again after %.1f s", time.monotonic() - self.since)
            self.since = None
            self._logged = 0.0


BLOCKED = _Blocked()


def write_blocked_seconds() -> float:
    """How long this process has been waiting for Redis to accept a write (0 when it is not)."""
    since = BLOCKED.since
    return 0.0 if since is None else time.monotonic() - since


def until_written(write: Callable[[], T], what: str) -> T:
    """Run `write` until Redis accepts it (see RETRY_ERRORS), with a growing pause between tries."""
    pause = 0.05
    while True:
        try:
            result = write()
        except RETRY_ERRORS as e:
            BLOCKED.refused(what, e)
            time.sleep(pause)
            pause = min(_BACKOFF_MAX_S, pause * 2)
            continue
        if BLOCKED.since is not None:
            BLOCKED.accepted()
        return result
