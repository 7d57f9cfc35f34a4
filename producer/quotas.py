"""Per-tenant quotas of the HTTP route (issue 38), from the API keys file (producer.auth) or a quotas
file (`--quotas-file`: `load_quotas_file`, which also names the quotas of keyless callers): what one
tenant may use of the shared Redis and workers, so that no tenant can hurt another.

- ``requests_per_s``: SystemOne requests a second. Counted in Redis in a window of one second per
  tenant (RATE_SCRIPT: one atomic INCRBY, refused and taken back over the limit), so every replica
  of the route shares one count.
- ``tokens_per_s``: tokens the workers ran for the tenant's requests a second, as they report them
  (vela2.wire.usage: averaged over the last whole seconds). Served tokens are known only once run,
  so this one is checked after the fact: while the tenant's rate is over it, its new requests are
  refused (429); what it has queued is still served.
- ``queued``: messages (a SystemOne request is one) waiting for a worker on the tenant's list of the
  online queue. Checked by the push itself (vela2.wire.taking.PUSH_SCRIPT), atomically.
- ``stored_bytes``: bytes its stored results hold (key and value), counted by the scripts that write
  them and given back as they expire (vela2.wire.usage). Checked before a request or an upload is
  accepted (read at most once a USAGE_CACHE_S per tenant and route process); what is queued already
  is still answered and stored, so usage may pass the limit by what was in flight. Refused: 507.
- ``live_jobs``: bulk jobs not ended, and ``job_lines``: the input lines of those jobs (an upload is
  counted by its lines, blank ones included, before it is read). A sorted set and a hash per tenant
  of its jobs (JOBS_SCRIPT: those ended or gone are swept, then the new job is reserved or refused,
  in one atomic step); an ended job gives its lines back.

A refusal is ``quota_exceeded`` naming the quota, the limit and the usage, with Retry-After, before
anything is written: 429, or 507 for stored_bytes.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from producer.cells import DOWN  # a Redis (cell) that did not answer
from vela2.errors import ConfigError, QuotaExceeded
from vela2.wire import usage
from vela2.wire.keys import tenant_problem
from vela2.wire.scripts import Script

QUOTA_PREFIX = "vela2:quota:"  # vela2:quota:<tenant>:rate:<unix second>, vela2:quota:<tenant>:jobs
RETRY_JOBS_S = 30  # Retry-After of a live_jobs / job_lines refusal: jobs end in minutes, not seconds
RETRY_STORED_S = 60  # Retry-After of a stored_bytes refusal: results expire in buckets (vela2.wire.usage)
USAGE_CACHE_S = 1.0  # a route process reads a tenant's stored bytes at most this often

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

# KEYS[1] the tenant's live jobs (job key -> reserved at), KEYS[2] their lines (job key -> lines); ARGV
# the new job's key, now, the live_jobs limit, the grace a reserved job has to appear, the new job's
# lines, the job_lines limit (a limit of 0: none). Each job that ended (its hash has a status), or
# that never appeared within the grace, or whose hash is gone, is removed; then the new job is added,
# or refused: returns {0, 0} when reserved, {1, live jobs} or {2, lines} (what it would make) refused.
JOBS_SCRIPT = """
local now = tonumber(ARGV[2])
local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
  local member, reserved = all[i], tonumber(all[i + 1])
  local over
  if redis.call('EXISTS', member) == 1 then
    over = redis.call('HEXISTS', member, 'status') == 1
  else
    over = now - reserved > tonumber(ARGV[4])
  end
  if over then
    redis.call('ZREM', KEYS[1], member)
    redis.call('HDEL', KEYS[2], member)
  end
end
local live, live_limit = redis.call('ZCARD', KEYS[1]), tonumber(ARGV[3])
if live_limit > 0 and live >= live_limit then return {1, live + 1} end
local n, lines_limit = tonumber(ARGV[5]), tonumber(ARGV[6])
if lines_limit > 0 then
  local held = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do held = held + tonumber(v) end
  if held + n > lines_limit then return {2, held + n} end
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], n)
return {0, 0}
"""
RATE, JOBS = Script(RATE_SCRIPT), Script(JOBS_SCRIPT)
RESERVE_GRACE_S = 60  # a reserved job not created within this is not counted (its upload failed first)


@dataclass(frozen=True)
class Quotas:
    """A tenant's limits (None: unlimited)."""

    requests_per_s: int | None = None
    queued: int | None = None
    tokens_per_s: int | None = None
    stored_bytes: int | None = None
    live_jobs: int | None = None
    job_lines: int | None = None

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


def job_lines_key(tenant: str) -> str:
    return f"{QUOTA_PREFIX}{tenant}:job-lines"


def upload_lines(body: bytes) -> int:
    """The lines of an upload as the job_lines quota counts them (blank ones included)."""
    return body.count(b"\n") + (0 if body.endswith(b"\n") else 1)


async def reserve_job(redis: Any, tenant: str, quotas: Quotas | None, job_key: str, lines: int = 0) -> None:
    """Count the new job `job_key` (its hash key) of `lines` input lines among `tenant`'s live jobs;
    QuotaExceeded (nothing reserved) past its live_jobs or job_lines. Neither quota: nothing counted."""
    live_limit = quotas.live_jobs if quotas is not None else None
    lines_limit = quotas.job_lines if quotas is not None else None
    if live_limit is None and lines_limit is None:
        return
    if lines_limit is not None and lines > lines_limit:
        raise QuotaExceeded("job_lines", lines_limit, lines, retry_after_s=RETRY_JOBS_S)
    args = [job_key, time.time(), live_limit or 0, RESERVE_GRACE_S, lines, lines_limit or 0]
    which, held = await JOBS.run_async(redis, [jobs_key(tenant), job_lines_key(tenant)], args)
    if int(which) == 1:
        raise QuotaExceeded("live_jobs", live_limit or 0, int(held), retry_after_s=RETRY_JOBS_S)
    if int(which) == 2:
        raise QuotaExceeded("job_lines", lines_limit or 0, int(held), retry_after_s=RETRY_JOBS_S)


async def take_rate(redis: Any, tenant: str, quotas: Quotas | None, n: int = 1) -> None:
    """Count `n` requests of `tenant` in this second's window; QuotaExceeded (nothing counted) when
    that would pass its requests_per_s. No quota: nothing is counted."""
    limit = quotas.requests_per_s if quotas is not None else None
    if limit is None:
        return
    if n > limit:
        raise QuotaExceeded("requests_per_s", limit, n)
    used = int(await RATE.run_async(redis, [rate_key(tenant, int(time.time()))], [n, limit, WINDOW_TTL_S]))
    if used:
        raise QuotaExceeded("requests_per_s", limit, used)


class Usage:
    """The stored_bytes and tokens_per_s checks of one route process: each tenant's usage
    (vela2.wire.usage) read at most once a USAGE_CACHE_S, in one round trip for both."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, int, int]] = {}  # tenant -> (monotonic time read, bytes, tokens/s)

    async def check(self, redis: Any, tenant: str, quotas: Quotas | None) -> None:
        """QuotaExceeded when `tenant`'s stored results hold its stored_bytes quota already (507), or
        its requests were served more than its tokens_per_s over the last seconds (429). `redis`: one
        client, or a list of them (Redis cells: the usage of all summed; a cell that does not answer
        is left out of the sum while another does, so it stalls no tenant's requests elsewhere)."""
        if quotas is None or (quotas.stored_bytes is None and quotas.tokens_per_s is None):
            return
        now = time.monotonic()
        seen = self._seen.get(tenant)
        if seen is None or now - seen[0] > USAGE_CACHE_S:
            stored, tokens = await _read_usage(redis if isinstance(redis, list) else [redis], tenant)
            seen = self._seen[tenant] = (now, stored, tokens)
        if quotas.stored_bytes is not None and seen[1] >= quotas.stored_bytes:
            raise QuotaExceeded("stored_bytes", quotas.stored_bytes, seen[1], retry_after_s=RETRY_STORED_S,
                                status=507)
        if quotas.tokens_per_s is not None and seen[2] > quotas.tokens_per_s:
            raise QuotaExceeded("tokens_per_s", quotas.tokens_per_s, seen[2])


async def _read_usage(redises: list[Any], tenant: str) -> tuple[int, int]:
    """(stored bytes, tokens a second) of `tenant`, summed over `redises`; the first error when none answered."""
    got = await asyncio.gather(*(usage.read_async(r, tenant) for r in redises), return_exceptions=True)
    ok = [g for g in got if not isinstance(g, BaseException)]
    if not ok:
        raise next(g for g in got if isinstance(g, BaseException))
    for g in got:
        if isinstance(g, BaseException) and not isinstance(g, DOWN):
            raise g
    return sum(g[0] for g in ok), sum(g[1] for g in ok)


def load_quotas_file(path: str | None) -> dict[str, Quotas]:
    """The quotas of a `--quotas-file`: a JSON object of tenant -> quotas (as in the keys file), the
    tenant "" naming keyless callers' (a route without authentication). ConfigError naming the
    entry and the value; no path: none."""
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--quotas-file {path}: {e}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f'--quotas-file {path}: a JSON object of tenant -> quotas, like {{"": {{"queued": 1000}}}}')
    out = {}
    for tenant, quotas in obj.items():
        if tenant and (problem := tenant_problem(tenant)):
            raise ConfigError(f"--quotas-file {path}: {problem}")
        out[tenant] = Quotas.parse(quotas, f"--quotas-file {path}: tenant {tenant!r}")
    return out
