"""Attempt counting, the quarantine verdicts and the dead-letter list: the engine's defence against
requests that kill the worker process itself.

A request that crashes its worker (a segfault, the kernel's OOM killer, a CUDA error that aborts)
raises nothing to split on; its message is redelivered after the visibility timeout and would kill
the next worker too, forever. So before a request's first batch in a delivery the engine counts the
attempt in Redis (`vela2:attempts:<id>`: SET NX + GET for the whole batch in one pipelined round
trip, with a TTL); the counter is deleted once the request has a stored result, so a counter found
there means earlier attempts died with their workers. Such a suspect runs alone (its counter INCRed
first) once every counted request in flight has its result stored, so if it kills the process again
it takes no innocent request's attempt with it. One whose earlier attempts reached `max_attempts`
is poison: never run, copied to the dead-letter list `vela2.<model>.dead`, answered "poison".
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import Any

from vela2.wire import keys

log = logging.getLogger(__name__)


class Verdict(Enum):
    """What the counters say of a request about to run."""

    FIRST = "first"  # no earlier attempt: counted, runs with the others
    SUSPECT = "suspect"  # earlier attempts died with their worker: runs alone
    POISON = "poison"  # earlier attempts reached max_attempts: dead-lettered, never run
    UNCOUNTED = "uncounted"  # Redis was away: runs uncounted (a crash loop needs Redis to redeliver at all)


# Per key: -1 where this call set the counter to 1 (a first attempt), else how many earlier
# attempts it counts (their workers died before storing a result).
FIRST_SCRIPT = """
local out = {}
for i, k in ipairs(KEYS) do
  if redis.call('SET', k, 1, 'NX', 'EX', ARGV[1]) then
    out[i] = -1
  else
    out[i] = tonumber(redis.call('GET', k)) or 0
  end
end
return out
"""


class Attempts:
    """The attempt counters this engine holds, in Redis and here."""

    def __init__(self, redis: Any, *, max_attempts: int, ttl_s: int):
        self.redis = redis
        self.max_attempts = max_attempts
        self.ttl_s = int(ttl_s)
        # id -> the attempt this engine counted, until its result is stored; a poison request's
        # counter must survive a warm stop, so it is held with None (never uncounted)
        self._held: dict[str, int | None] = {}
        self._first = redis.register_script(FIRST_SCRIPT)

    def __bool__(self) -> bool:
        """True while some counted request of this engine has no stored result."""
        return bool(self._held)

    def __contains__(self, rid: str) -> bool:
        return rid in self._held

    def first(self, rids: list[str]) -> list[tuple[Verdict, int]]:
        """Count the first attempt of each request in this delivery (one call): per id its
        verdict and how many earlier attempts died."""
        try:
            replies = self._first(keys=[keys.attempts_key(rid) for rid in rids], args=[self.ttl_s])
        except Exception as e:
            log.warning("counting attempts of %d requests failed (%s); running them uncounted", len(rids), e)
            return [(Verdict.UNCOUNTED, 0)] * len(rids)
        out = []
        for rid, died in zip(rids, replies, strict=True):
            if died < 0:
                self._held[rid] = 1
                out.append((Verdict.FIRST, 0))
                continue
            out.append((Verdict.POISON if died >= self.max_attempts else Verdict.SUSPECT, int(died)))
        return out

    def again(self, rid: str) -> tuple[Verdict, int]:
        """Count one more attempt of a suspect about to run alone: (SUSPECT, attempt number), or
        (POISON, earlier attempts) past max_attempts, or (UNCOUNTED, 0) when Redis is away."""
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.incr(keys.attempts_key(rid))
            pipe.expire(keys.attempts_key(rid), self.ttl_s)
            attempt = int(pipe.execute()[0])
        except Exception as e:
            log.warning("counting the attempt of %s failed (%s); running it uncounted", rid, e)
            return Verdict.UNCOUNTED, 0
        if attempt > self.max_attempts:
            return Verdict.POISON, attempt - 1
        self._held[rid] = attempt
        return Verdict.SUSPECT, attempt

    def poisoned(self, rid: str) -> None:
        """Hold a poison request's counter until its error answer is stored, never uncounting it."""
        self._held[rid] = None

    def forget(self, rids: list[str]) -> None:
        """Delete the counters of held requests whose results are now stored."""
        rids = [rid for rid in rids if rid in self._held]
        if not rids:
            return
        for rid in rids:
            del self._held[rid]
        try:
            self.redis.delete(*[keys.attempts_key(rid) for rid in rids])
        except Exception as e:  # harmless: the counters expire on their own
            log.warning("deleting %d attempt counters failed: %s", len(rids), e)

    def give_back(self, rids: list[str]) -> None:
        """Take back this engine's attempt of held requests it returns to the queue alive (warm
        stop): a request handed back alive is no suspect."""
        rids = [rid for rid in rids if rid in self._held]
        if not rids:
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            for rid in rids:
                attempt = self._held.pop(rid)
                if attempt == 1:
                    pipe.delete(keys.attempts_key(rid))
                elif attempt is not None:
                    pipe.decr(keys.attempts_key(rid))
            pipe.execute()
        except Exception as e:
            log.warning("uncounting %d attempts failed: %s", len(rids), e)
