"""A Redis URL turned into a redis-py client or pool, the same way on every side (worker, Client,
AsyncClient, `vela2 backfill` / `jobs` / `http` / `status`).

`redis://`, `rediss://` and `unix://` URLs go to redis-py's `from_url`. A `sentinel://` URL
(vela2.wire.urls.parse_sentinel_url) becomes a client of the master the sentinels name: redis-py's
Sentinel-managed pool asks a sentinel for the master's address whenever it opens a connection, so
after a failover (the old master's connections fail, or it answers READONLY as a replica) the next
connection goes to the promoted replica. Callers keep their own retries; this only says where to
connect. No celery, no torch.
"""

from __future__ import annotations

from typing import Any

from vela2.wire.urls import SentinelUrl, is_sentinel_url, parse_sentinel_url

SENTINEL_TIMEOUT_S = 2.0  # a sentinel that does not answer within this is skipped for the next one


def _sentinel_kwargs(kw: dict[str, Any], s: SentinelUrl) -> dict[str, Any]:
    """Options for the connections to the sentinels themselves: the caller's socket timeouts, bounded,
    and the sentinels' own password when the URL gives one (`sentinel_password`)."""
    return {"socket_timeout": min(kw.get("socket_timeout") or SENTINEL_TIMEOUT_S, SENTINEL_TIMEOUT_S),
            "socket_connect_timeout": min(kw.get("socket_connect_timeout") or SENTINEL_TIMEOUT_S,
                                          SENTINEL_TIMEOUT_S), **s.sentinel_kwargs()}


def redis_client(url: str, **kw: Any) -> Any:
    """A `redis.Redis` for `url` (`kw`: redis-py connection options, e.g. socket_timeout). For a
    sentinel:// URL, the client of its master (redis.sentinel.Sentinel(...).master_for(name))."""
    import redis

    if not is_sentinel_url(url):
        return redis.Redis.from_url(url, **kw)
    from redis.sentinel import Sentinel

    s = parse_sentinel_url(url)
    sentinel = Sentinel(list(s.sentinels), sentinel_kwargs=_sentinel_kwargs(kw, s))
    return sentinel.master_for(s.master_name, db=s.db, username=s.username, password=s.password, **kw)


def async_redis_client(url: str, **kw: Any) -> Any:
    """`redis_client` for asyncio: a `redis.asyncio.Redis` (redis.asyncio.sentinel for sentinel://)."""
    import redis.asyncio as aioredis

    if not is_sentinel_url(url):
        return aioredis.Redis.from_url(url, **kw)
    from redis.asyncio.sentinel import Sentinel

    s = parse_sentinel_url(url)
    sentinel = Sentinel(list(s.sentinels), sentinel_kwargs=_sentinel_kwargs(kw, s))
    return sentinel.master_for(s.master_name, db=s.db, username=s.username, password=s.password, **kw)


def redis_pool(url: str, pool_class: Any, **kw: Any) -> Any:
    """A connection pool of `pool_class` (a redis-py ConnectionPool subclass, sync or asyncio: e.g.
    a bounded BlockingConnectionPool) for `url`; for a sentinel:// URL the same class mixed with the
    Sentinel-managed pool, so it is bounded alike and follows the master."""
    if not is_sentinel_url(url):
        return pool_class.from_url(url, **kw)
    import redis.asyncio as aioredis

    is_async = issubclass(pool_class, aioredis.ConnectionPool)
    if is_async:
        from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
    else:
        from redis.sentinel import Sentinel, SentinelConnectionPool  # type: ignore[assignment]
    s = parse_sentinel_url(url)
    sentinel = Sentinel(list(s.sentinels), sentinel_kwargs=_sentinel_kwargs(kw, s))
    mixed = type(f"Sentinel{pool_class.__name__}", (SentinelConnectionPool, pool_class), {})
    return mixed(s.master_name, sentinel, db=s.db, username=s.username, password=s.password, **kw)
