"""What each tenant holds in the result store and what the workers serve it (issue 38).

Tokens: each worker adds up the tokens it ran for each tenant and adds them, about once a
TOKENS_REPORT_S, to the tenant's counter of that unix second (keys.tokens_key, TTL TOKENS_TTL_S);
`tokens_per_s` reads a tenant's rate over the last TOKENS_WINDOW_S whole seconds.

Stored bytes: the bytes of a tenant's stored results, counted by the script that writes them and
given back when they expire.

A hash per tenant (keys.stored_key; keyless producers are tenant ""): field = the unix second from
which every result counted in it has expired (its TTL's end, rounded up to a bucket of
`bucket_s(ttl)`: a day's results fall in BUCKETS fields), value = their bytes (key and value, as
Redis keeps them, without its per-key overhead). A result's bytes are added by the very script call
that writes it (vela2.wire.results, vela2.wire.jobs: COUNT_LUA), so nothing stored goes uncounted,
and a bucket stops counting once its second has passed, which gives back what expired with it,
at most one bucket late. Readers (the route's stored_bytes quota, `vela2 status --tenants`) sum the
buckets still ahead with USAGE_SCRIPT, which drops the others.
"""

from __future__ import annotations

import time
from typing import Any

from vela2.wire import keys, scripts
from vela2.wire.scripts import Script

BUCKETS = 96  # buckets per result lifetime: a day's results in 15-minute ones
MIN_BUCKET_S = 60


def bucket_s(ttl_s: int) -> int:
    """The width of the buckets of results that live `ttl_s`."""
    return max(MIN_BUCKET_S, int(ttl_s) // BUCKETS)


def count_args(ttl_s: int, now: float | None = None) -> list[int]:
    """The store scripts' two ARGV for counting results written now with TTL `ttl_s`: the bucket
    (the second from which they have all expired) and how long the tenant's hash must live."""
    now = time.time() if now is None else now
    width = bucket_s(ttl_s)
    at = (int(now + ttl_s) // width + 1) * width
    return [at, at - int(now) + width]


# count_stored(hash, bucket, bytes, keep_s): add `bytes` to the bucket; the hash lives at least keep_s.
COUNT_LUA = """
local function count_stored(key, at, bytes, keep)
  if bytes <= 0 then return end
  redis.call('HINCRBY', key, at, bytes)
  if redis.call('TTL', key) < tonumber(keep) then redis.call('EXPIRE', key, keep) end
end
"""

# KEYS[1] a tenant's hash; ARGV[1] now (unix s). The bytes of the buckets still ahead; drops the others.
USAGE_SCRIPT = """
local now, total = tonumber(ARGV[1]), 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if tonumber(all[i]) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    total = total + tonumber(all[i + 1])
  end
end
return total
"""


TOKENS_REPORT_S = 0.5  # a worker adds its tokens to Redis about this often (one round trip)
TOKENS_WINDOW_S = 2  # the whole seconds a tenant's token rate is averaged over
TOKENS_TTL_S = 10  # a second's counter outlives its window (a worker's clock a little ahead)


USAGE = Script(USAGE_SCRIPT)


def report_tokens(client: Any, tokens: dict[str, int], now: float | None = None) -> None:
    """Add each tenant's tokens (keyless producers: "") to its counter of this second, one round trip."""
    second = int(time.time() if now is None else now)
    pipe = client.pipeline(transaction=False)
    for tenant, n in tokens.items():
        key = keys.tokens_key(tenant, second)
        pipe.incrby(key, n)
        pipe.expire(key, TOKENS_TTL_S)
    pipe.execute()


async def read_async(client: Any, tenant: str, now: float | None = None) -> tuple[int, int]:
    """(stored bytes, tokens a second) of `tenant`, one round trip (asyncio client): the bytes its
    stored results hold, and the tokens a second its requests were served over the last
    TOKENS_WINDOW_S whole seconds."""
    now = time.time() if now is None else now
    second = int(now)
    pipe = client.pipeline(transaction=False)
    USAGE.queue(pipe, [keys.stored_key(tenant)], [now])
    pipe.mget([keys.tokens_key(tenant, second - k) for k in range(1, TOKENS_WINDOW_S + 1)])
    stored, tokens = await scripts.execute_async(pipe)
    return int(stored), sum(int(v or 0) for v in tokens) // TOKENS_WINDOW_S


def stored_bytes(client: Any, tenant: str, now: float | None = None) -> int:
    """The bytes `tenant`'s stored results hold now ("" for keyless producers), sync client."""
    return int(USAGE(client, [keys.stored_key(tenant)], [time.time() if now is None else now]))

