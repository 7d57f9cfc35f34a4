"""What the routes of one app share: its settings (`Settings`, what create_app was given) and its
Redis clients (`RouteState`, held on ``app.state.vela2``): one AsyncClient over a bounded pool for
the SystemOne routes, one per tenant seen over the same pool, and a bounded synchronous pool for
the bulk-job routes (producer.jobs is synchronous: those routes run it in worker threads).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis as redis_lib
import redis.asyncio as aioredis

from producer.aio import AsyncClient, BoundedPool, SyncBoundedPool
from producer.auth import KeyRing
from producer.brokers import AmqpPublisher
from producer.client import Client
from producer.quotas import Quotas, Usage
from vela2.wire.connections import redis_pool
from vela2.wire.keys import TENANT_SHARES_KEY, is_amqp_url

DEFAULT_TIMEOUT_S = 10.0  # how long POST waits for the answer by default
DEFAULT_MAX_WAIT_S = 60.0  # the largest wait_s a caller may ask for
DEFAULT_REDIS_CONNECTIONS = 64  # Redis connections of one route process (requests share them)
DEFAULT_REDIS_WAIT_S = 5.0  # longest a request waits for a free one, then 429
DEFAULT_BODY_TIMEOUT_S = 30.0  # longest a request body may take to arrive, then 408
DEFAULT_MAX_BATCH_BYTES = 64 << 20  # the largest JSONL body of POST /v1/batches
DEFAULT_UPLOAD_PROCESSES = 2  # processes that parse and queue batch uploads (online requests never wait for them)
DEFAULT_UPLOAD_TIMEOUT_S = 300.0  # longest one upload may take to register its lines (then 408; the job fails)
DEFAULT_UPLOADS_PER_TENANT = 2  # batch uploads one tenant may have in progress at once (more: 429)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    """What one app was made with (producer.http.app.create_app's arguments)."""

    redis_url: str
    model: str
    timeout_s: float
    max_wait_s: float
    keys: KeyRing | None  # None: no authentication
    redis_connections: int
    redis_wait_s: float
    body_timeout_s: float
    max_batch_bytes: int
    broker_url: str | None
    wait_replicas: int
    upload_processes: int = DEFAULT_UPLOAD_PROCESSES
    uploads_per_tenant: int = DEFAULT_UPLOADS_PER_TENANT
    upload_timeout_s: float = DEFAULT_UPLOAD_TIMEOUT_S
    tenant_quotas: Mapping[str, Quotas] = field(default_factory=dict)  # --quotas-file: "" = keyless callers

    def quotas(self, tenant: str | None, key_quotas: Quotas | None) -> Quotas | None:
        """A caller's quotas: its key's, else its tenant's in the quotas file (keyless: tenant "")."""
        return key_quotas if key_quotas is not None else self.tenant_quotas.get(tenant or "")


class RouteState:
    """The settings and the Redis clients of one app. The asyncio clients are made by `open`, inside
    the server's event loop (redis.asyncio connections belong to one loop), and closed by `aclose`."""

    def __init__(self, settings: Settings):
        self.settings = settings
        # The bulk-job routes run producer.jobs (synchronous, streaming) in worker threads, over a pool of
        # their own: at most `redis_connections` connections, a caller waits up to redis_wait_s for one.
        self.sync_pool = redis_pool(settings.redis_url, SyncBoundedPool, max_connections=settings.redis_connections,
                                    timeout=settings.redis_wait_s)
        # Batch uploads are parsed and queued in processes of their own: they never hold the default
        # executor that online requests' parsing (POST /v1/system_one) runs on, nor this process's GIL
        # (in threads here, 8 uploads of 100k lines still took the p99 of online requests 4.2x up:
        # bench/results/cpu-upload-isolation.json)
        self.uploads = ProcessPoolExecutor(settings.upload_processes, mp_context=mp.get_context("spawn"))
        self.uploading: dict[str | None, int] = {}  # tenant -> uploads in progress (the event loop's)
        self._client: AsyncClient | None = None
        self._tenants: dict[str, AsyncClient] = {}  # one client per tenant seen, over the one pool
        self.usage = Usage()  # the stored_bytes and tokens_per_s quotas (producer.quotas)
        self._opened: tuple[Any, Any, Any, Any] | None = None  # (pool, redis client, broker, broker pool)

    def open(self) -> None:
        """Make the asyncio clients: the result store's bounded pool, and the broker when it is not
        the result store: RabbitMQ (one confirming publisher), or a Redis pool as bounded as the
        result store's."""
        s = self.settings
        pool = redis_pool(s.redis_url, BoundedPool, max_connections=s.redis_connections, timeout=s.redis_wait_s)
        redis_client = aioredis.Redis(connection_pool=pool)
        broker: Any = None
        broker_pool = None
        if s.broker_url and is_amqp_url(s.broker_url):
            broker = AmqpPublisher(s.broker_url)
        elif s.broker_url:
            broker_pool = redis_pool(s.broker_url, BoundedPool, max_connections=s.redis_connections,
                                     timeout=s.redis_wait_s)
            broker = aioredis.Redis(connection_pool=broker_pool)
        self._client = AsyncClient(model=s.model, track_submitted=True, redis=redis_client, broker=broker,
                                   wait_replicas=s.wait_replicas)
        self._opened = (pool, redis_client, broker, broker_pool)

    async def publish_shares(self) -> None:
        """Write the keys file's tenant shares where the workers' take reads them (the Redis broker,
        else the result store): a tenant with a share is set, one without is reset to 1. A Redis away
        is logged: the shares written last stay."""
        keyring = self.settings.keys
        if keyring is None or self._opened is None:
            return
        _, redis_client, broker, _ = self._opened
        target = broker if broker is not None and not isinstance(broker, AmqpPublisher) else redis_client
        shares = keyring.shares()
        pipe = target.pipeline(transaction=True)
        if set_ := {t: s for t, s in shares.items() if s is not None}:
            pipe.hset(TENANT_SHARES_KEY, mapping=set_)
        if unset := [t for t, s in shares.items() if s is None]:
            pipe.hdel(TENANT_SHARES_KEY, *unset)
        try:
            await pipe.execute()
        except redis_lib.exceptions.RedisError as e:
            log.warning("could not write the tenants' shares (%s): the workers keep the shares written last", e)

    async def aclose(self) -> None:
        """Close every client and pool `open` made, and the synchronous pool."""
        if self._opened is None or self._client is None:
            return
        pool, redis_client, broker, broker_pool = self._opened
        client, self._client, self._opened = self._client, None, None
        for c in [*self._tenants.values(), client]:
            await c.aclose()
        self._tenants.clear()
        await redis_client.aclose()
        await pool.disconnect()
        self.sync_pool.disconnect()
        self.uploads.shutdown(wait=False, cancel_futures=True)
        if isinstance(broker, AmqpPublisher):
            broker.close()
        elif broker is not None and broker_pool is not None:
            await broker.aclose()
            await broker_pool.disconnect()

    def client(self, tenant: str | None = None) -> AsyncClient:
        """The client of a caller's tenant: its ids are scoped to it (producer.scope.Scope)."""
        if self._client is None:
            raise RuntimeError("the app's clients are made when its lifespan starts (RouteState.open)")
        if tenant is None:
            return self._client
        c = self._tenants.get(tenant)
        if c is None:
            c = self._tenants[tenant] = self._client.with_tenant(tenant)
        return c

    def jobs_client(self, tenant: str | None) -> Client:
        """A synchronous client of the caller's tenant over the bounded pool, for producer.jobs."""
        s = self.settings
        return Client(model=s.model, redis=redis_lib.Redis(connection_pool=self.sync_pool), tenant=tenant,
                      wait_replicas=s.wait_replicas)
