"""Per-tenant quotas of the HTTP route (issue 38), from the API keys file (producer.auth): what one
tenant may use of the shared Redis and workers, so that no tenant can hurt another.

- ``requests_per_s``: SystemOne requests a second. Counted in Redis in a window of one second per
  tenant (RATE_SCRIPT: one atomic INCRBY, refused and taken back over the limit), so every replica
  of the route shares one count.
- ``queued``: messages (a SystemOne request is one) waiting for a worker on the tenant's list of the
  online queue. Checked by the push itself (vela2.wire.taking.PUSH_SCRIPT), atomically.
- ``live_jobs``: bulk jobs not ended. A sorted set per tenant of its jobs' keys (JOBS_SCRIPT: those
  ended or gone are swept, then the new job is reserved or refused, in one atomic step).

A refusal is 429 ``quota_exceeded`` naming the quota, the limit and the usage, with Retry-After,
before anything is written.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from vela2.errors import ConfigError, QuotaExceeded

QUOTA_PREFIX = "vela2:quota:"  # vela2:quota:<tenant>:rate:<unix second>, vela2:quota:<tenant>:jobs
RETRY_JOBS_S = 30  # Retry-After of a live_jobs refusal: jobs end in minutes, not seconds

# KEYS[1] the tenant's window of this second; ARGV n, limit, ttl. Returns the usage refused (> limit,
# nothing counted), or 0 when the n requests are counted.
RATE_SCRIPT = """
local used = redis.call('INCRBY', KEYS[1], ARGV[1])
if used == tonumber(ARGV[1]) then redis.call('EXPIRE', KEYS[1], ARGV[3]) end
if used > tonumber(ARGV[2]) then
  redis.call('DECRBY', KEYS[1], ARGV[1])
  return used
end
return 0
"""
WINDOW_TTL_S = 3  # a second's window outlives it briefly (a replica's clock a little behind)

# KEYS[1] the tenant's live jobs (job key -> reserved at); ARGV the new job's key, now, limit, the
# grace a reserved job has to appear. Each member whose job ended (its hash has a status), or that
# never appeared within the grace, or whose hash is gone, is removed; then the new job is added, or
# (at the limit) refused: returns the live count refused, else 0.
JOBS_SCRIPT = """
local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
  local member, reserved = all[i], tonumber(all[i + 1])
  if redis.call('EXISTS', member) == 1 then
    if redis.call('HEXISTS', member, 'status') == 1 then redis.call('ZREM', KEYS[1], member) end
  elseif tonumber(ARGV[2]) - reserved > tonumber(ARGV[4]) then
    redis.call('ZREM', KEYS[1], member)
  end
end
local live = redis.call('ZCARD', KEYS[1])
if live >= tonumber(ARGV[3]) then return live + 1 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return 0
"""
RESERVE_GRACE_S = 60  # a reserved job not created within this is not counted (its upload failed first)


@dataclass(frozen=True)
class Quotas:
    """A tenant's limits (None: unlimited)."""

    requests_per_s: int | None = None
    queued: int | None = None
    live_jobs: int | None = None

    @classmethod
    def parse(cls, obj: Any, where: str) -> Quotas:
        """The quotas of a keys-file line's "quotas" object; ConfigError naming the key and value."""
        if not isinstance(obj, dict):
            raise ConfigError(f"{where}: quotas must be an object like {{\"requests_per_s\": 50}}")
        known = set(cls.__dataclass_fields__)
        if unknown := sorted(set(obj) - known):
            raise ConfigError(f"{where}: unknown quotas {unknown}; known: {sorted(known)}")
        for name, value in obj.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}: quotas.{name} must be a positive integer; got {value!r}")
        return cls(**obj)

    def to_dict(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def rate_key(tenant: str, second: int) -> str:
    return f"{QUOTA_PREFIX}{tenant}:rate:{second}"


def jobs_key(tenant: str) -> str:
    return f"{QUOTA_PREFIX}{tenant}:jobs"


async def reserve_job(redis: Any, tenant: str, quotas: Quotas | None, job_key: str) -> None:
    """Count the new job `job_key` (its hash key) among `tenant`'s live jobs; QuotaExceeded (nothing
    reserved) at its live_jobs. No quota: nothing is counted."""
    limit = quotas.live_jobs if quotas is not None else None
    if limit is None:
        return
    live = int(await redis.eval(JOBS_SCRIPT, 1, jobs_key(tenant), job_key, time.time(), limit, RESERVE_GRACE_S))
    if live:
        raise QuotaExceeded("live_jobs", limit, live, retry_after_s=RETRY_JOBS_S)


async def take_rate(redis: Any, tenant: str, quotas: Quotas | None, n: int = 1) -> None:
    """Count `n` requests of `tenant` in this second's window; QuotaExceeded (nothing counted) when
    that would pass its requests_per_s. No quota: nothing is counted."""
    limit = quotas.requests_per_s if quotas is not None else None
    if limit is None:
        return
    if n > limit:
        raise QuotaExceeded("requests_per_s", limit, n)
    used = int(await redis.eval(RATE_SCRIPT, 1, rate_key(tenant, int(time.time())), n, limit, WINDOW_TTL_S))
    if used:
        raise QuotaExceeded("requests_per_s", limit, used)
