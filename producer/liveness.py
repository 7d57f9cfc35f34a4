"""Whether any worker serves a model: what ends a client's wait with vela2.errors.NoWorker at once,
instead of a wait to its timeout, when nothing would answer it.

A worker beats every keys.HEARTBEAT_S into `keys.workers_key(model)` while its engine makes
progress (worker.runtime.leases), and, while it starts (loading a checkpoint takes a minute and
more), into `keys.starting_key(model)` (worker.runtime.announce): both sorted sets, worker -> the
unix time of its last beat. A model counts as unserved once the newest beat of either is older than
the grace period (`grace_s`, default DEFAULT_GRACE_S). A crashed worker's beat stays on record, so
a wait after it fails at once, naming how long ago it beat; a worker that stopped cleanly takes its
beat away, and so the grace then runs from this client's first look that found none.

The match is by model name, exactly: the name the worker's queues are named after (its `--model`,
else its checkpoint's name) is the one it beats under, and a client's `model`. Over cells
(producer.cells) each cell's client looks in its own cell: a request waits for a worker of its cell.

No round trip per request while a worker beats: the newest beat read is kept and, as a beat only
ever moves forward, nothing is read while it is younger than the grace period; so a client reads
the beats about once per grace period, and only while something waits. Once no beat is young enough
they are read again at most every READ_EVERY_S. The clocks of workers and producers are taken to
agree (NTP), as /readyz takes them. No celery, no torch.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vela2.errors import InvalidRequest, NoWorker
from vela2.wire import fleet, keys

DEFAULT_GRACE_S = 30.0  # 6 beats: a worker late by a few beats under load is not taken for gone
MIN_GRACE_S = fleet.STALE_S  # shorter would take a live worker between two beats for none
READ_EVERY_S = 1.0  # with no beat young enough, the beats are read again at most this often
CHECK_EVERY_S = 1.0  # a waiting coroutine asks this often (no round trip while a worker beats)


def check_grace(grace_s: Any) -> float | None:
    """`no_worker_grace_s` as the clients take it: None (never raise NoWorker) or a number of seconds
    >= MIN_GRACE_S; InvalidRequest naming the limit and the value otherwise."""
    if grace_s is None:
        return None
    if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not grace_s >= MIN_GRACE_S:
        raise InvalidRequest(f"no_worker_grace_s must be None (off) or a number of seconds >= {MIN_GRACE_S:g} "
                             f"(3 heartbeats); got {grace_s!r}")
    return float(grace_s)


class Liveness:
    """The newest beat of one model's workers as a client knows it (one per client; its tenants'
    clients share it). `check` / `check_async` raise NoWorker once the grace period has passed with
    no beat; `absent` says so without raising."""

    def __init__(self, model: str, grace_s: float | None = DEFAULT_GRACE_S, clock: Callable[[], float] = time.time):
        self.model = model
        self.grace_s = check_grace(grace_s)
        self.clock = clock
        self.newest: float | None = None  # the newest beat read (unix time); None: none on record
        self.absent_since: float | None = None  # the first read that found no beat on record (since then)
        self.read_at = -math.inf  # when the beats were last read (or a read was claimed)
        self.reads = 0  # round trips made (tests read it)
        self._lock = threading.Lock()  # a synchronous client's threads share this

    def _since(self) -> float | None:
        """Since when no worker is known to have beaten: its newest beat, else the first look that
        found none; None before the first read."""
        return self.newest if self.newest is not None else self.absent_since

    def _claim(self, now: float) -> bool:
        """True (and the read claimed, so that concurrent waits do not read too) when the beats must be
        read: the beat known is older than the grace period and the last read is READ_EVERY_S old."""
        since = self._since()
        if self.grace_s is None or (since is not None and now - since <= self.grace_s):
            return False
        if now - self.read_at < READ_EVERY_S:
            return False
        self.read_at = now
        return True

    def _queue(self, pipe: Any) -> None:
        for key in (keys.workers_key(self.model), keys.starting_key(self.model)):
            pipe.zrevrange(key, 0, 0, withscores=True)

    def _take(self, replies: list[Any], now: float) -> None:
        self.reads += 1
        beats = [float(score) for reply in replies for _, score in reply]
        if beats:
            self.newest, self.absent_since = max(beats), None
        else:  # none on record (gone cleanly, or never came): the grace runs from this look
            self.newest = None
            self.absent_since = now if self.absent_since is None else self.absent_since

    def verdict(self, now: float | None = None) -> NoWorker | None:
        """NoWorker when the grace period has passed with no beat known (no read), else None."""
        now = self.clock() if now is None else now
        since = self._since()
        if self.grace_s is None or since is None or now - since <= self.grace_s:
            return None
        return NoWorker(self.model, now - since, self.grace_s, on_record=self.newest is not None)

    def absent(self, redis: Any) -> NoWorker | None:
        """`verdict` after reading the beats where the one known is too old (a redis.Redis)."""
        with self._lock:
            due = self._claim(self.clock())
        if due:
            pipe = redis.pipeline(transaction=False)
            self._queue(pipe)
            replies = pipe.execute()
            with self._lock:
                self._take(replies, self.clock())
        return self.verdict()

    def check(self, redis: Any) -> None:
        """Raise NoWorker when no worker of the model has beaten for the grace period."""
        if (found := self.absent(redis)) is not None:
            raise found

    async def absent_async(self, redis: Any) -> NoWorker | None:
        """`absent` over a redis.asyncio client (one event loop: no lock needed around the claim)."""
        if self._claim(self.clock()):
            pipe = redis.pipeline(transaction=False)
            self._queue(pipe)
            self._take(await pipe.execute(), self.clock())
        return self.verdict()

    async def check_async(self, redis: Any) -> None:
        """`check` over a redis.asyncio client."""
        if (found := await self.absent_async(redis)) is not None:
            raise found


async def wait_checked(futures: list[asyncio.Future], timeout_s: float | None,
                       check: Callable[[], Awaitable[None]] | None) -> None:
    """Wait until every future is done or timeout_s passes (asyncio.wait); await `check` first and
    every CHECK_EVERY_S while some are not: what it raises (NoWorker) ends the wait."""
    if check is None:
        await asyncio.wait(futures, timeout=timeout_s)
        return
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    left = [f for f in futures if not f.done()]
    while left:
        step = CHECK_EVERY_S if deadline is None else min(CHECK_EVERY_S, deadline - loop.time())
        if step <= 0:
            return
        await check()
        _, pending = await asyncio.wait(left, timeout=step)
        left = list(pending)
