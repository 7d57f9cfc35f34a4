"""What the routes of one app share: its settings (producer.http.settings.Settings) and its Redis
clients (`RouteState`, held on ``app.state.vela2``): one AsyncClient over a bounded pool for the
SystemOne routes, one per tenant seen over the same pool, and a bounded synchronous pool for the
bulk-job routes (producer.jobs is synchronous: those routes run it in worker threads).

Over cells (``--cells FILE``, vela2.wire.cells) each cell has those pools of its own, and the clients
are producer.cells' AsyncCellsClient / CellsClient over them: a request goes to its id's cell, a job
lives in its job id's cell, and a cell that is down stalls only its slice (503 cell_unavailable).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis as redis_lib
import redis.asyncio as aioredis

from producer.aio import AsyncClient, BoundedPool, SyncBoundedPool
from producer.brokers import AmqpPublisher
from producer.cells import DOWN, AsyncCellsClient, CellsClient
from producer.client import Client
from producer.files import Files
from producer.http.settings import Settings
from producer.quotas import Quotas, Usage, take_rate
from producer.webhooks import Deliverer
from vela2.errors import CellUnavailable
from vela2.wire.connections import redis_pool
from vela2.wire.keys import TENANT_SHARES_KEY, is_amqp_url

log = logging.getLogger(__name__)


@dataclass
class _Cell:
    """One Redis (a cell, or the one Redis of a route without cells) and the route's pools on it."""

    name: str
    redis_url: str
    broker_url: str | None
    sync_pool: SyncBoundedPool  # the bulk-job routes' (threads)
    # made by RouteState.open inside the event loop: (pool, redis client, broker, broker pool)
    opened: tuple[Any, Any, Any, Any] | None = None
    subscriber: Any = None  # the result channels' subscription: a connection outside the bounded pool

    def target(self) -> Any:
        """Where the workers' take reads tenant shares: the Redis broker, else the result store."""
        assert self.opened is not None
        _, redis_client, broker, _ = self.opened
        return broker if broker is not None and not isinstance(broker, AmqpPublisher) else redis_client


class RouteState:
    """The settings and the Redis clients of one app. The asyncio clients are made by `open`, inside
    the server's event loop (redis.asyncio connections belong to one loop), and closed by `aclose`."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.map = settings.cells
        where = ([(c.name, c.url, c.broker_url) for c in self.map.cells] if self.map is not None
                 else [("", settings.redis_url, settings.broker_url)])
        # The bulk-job routes run producer.jobs (synchronous, streaming) in worker threads, over pools of
        # their own: at most `redis_connections` connections per Redis, a caller waits up to
        # redis_wait_s for one.
        self.cells = [_Cell(name, url, broker, redis_pool(url, SyncBoundedPool,
                                                          max_connections=settings.redis_connections,
                                                          timeout=settings.redis_wait_s))
                      for name, url, broker in where]
        # Batch uploads are parsed and queued in processes of their own: they never hold the default
        # executor that online requests' parsing (POST /v1/system_one) runs on, nor this process's GIL
        # (in threads here, 8 uploads of 100k lines still took the p99 of online requests 4.2x up:
        # bench/results/cpu-upload-isolation.json)
        self.uploads = ProcessPoolExecutor(settings.upload_processes, mp_context=mp.get_context("spawn"))
        self.uploading: dict[str | None, int] = {}  # tenant -> uploads in progress (the event loop's)
        self._client: AsyncClient | AsyncCellsClient | None = None
        self._tenants: dict[str, AsyncClient | AsyncCellsClient] = {}  # one per tenant seen, over the same pools
        self.usage = Usage()  # the stored_bytes and tokens_per_s quotas (producer.quotas)
        self.deliverer: Deliverer | None = None  # sends jobs' completion webhooks (with --webhook-allow)

    def _open_cell(self, cell: _Cell) -> AsyncClient:
        """The asyncio client of one Redis: the result store's bounded pool, and the broker when it is
        not the result store: RabbitMQ (one confirming publisher), or a Redis pool as bounded."""
        s = self.settings
        pool = redis_pool(cell.redis_url, BoundedPool, max_connections=s.redis_connections, timeout=s.redis_wait_s)
        redis_client = aioredis.Redis(connection_pool=pool)
        broker: Any = None
        broker_pool = None
        if cell.broker_url and is_amqp_url(cell.broker_url):
            broker = AmqpPublisher(cell.broker_url)
        elif cell.broker_url:
            broker_pool = redis_pool(cell.broker_url, BoundedPool, max_connections=s.redis_connections,
                                     timeout=s.redis_wait_s)
            broker = aioredis.Redis(connection_pool=broker_pool)
        cell.opened = (pool, redis_client, broker, broker_pool)
        # the subscription holds its connection for good: taken from the bounded pool, it could be the
        # last one, and the polls that find results stored before a wait subscribed would starve
        cell.subscriber = aioredis.Redis(connection_pool=redis_pool(cell.redis_url, aioredis.ConnectionPool))
        return AsyncClient(model=s.model, track_submitted=True, redis=redis_client, broker=broker,
                           wait_replicas=s.wait_replicas, subscriber=cell.subscriber,
                           no_worker_grace_s=s.no_worker_grace_s or None)

    def open(self) -> None:
        """Make the asyncio clients: one per Redis (per cell), under one AsyncCellsClient over cells."""
        clients = [self._open_cell(cell) for cell in self.cells]
        self._client = (clients[0] if self.map is None
                        else AsyncCellsClient(self.map, model=self.settings.model, clients=clients))
        if self.settings.webhooks.allow:
            self.deliverer = Deliverer([r for _, r in self.redises()], self.settings.webhooks)
            self.deliverer.start()

    async def publish_shares(self) -> None:
        """Write the keys file's tenant shares where the workers' take reads them (in every cell: the
        Redis broker, else the result store): a tenant with a share is set, one without is reset to 1.
        A Redis away is logged: the shares written last stay."""
        keyring = self.settings.keys
        if keyring is None or self._client is None:
            return
        shares = keyring.shares()
        for cell in self.cells:
            pipe = cell.target().pipeline(transaction=True)
            if set_ := {t: s for t, s in shares.items() if s is not None}:
                pipe.hset(TENANT_SHARES_KEY, mapping=set_)
            if unset := [t for t, s in shares.items() if s is None]:
                pipe.hdel(TENANT_SHARES_KEY, *unset)
            try:
                await pipe.execute()
            except redis_lib.exceptions.RedisError as e:
                log.warning("could not write the tenants' shares%s (%s): the workers keep the shares written last",
                            f" in cell {cell.name}" if cell.name else "", e)

    async def aclose(self) -> None:
        """Close every client and pool `open` made, and the synchronous pools."""
        if self._client is None:
            return
        client, self._client = self._client, None
        if self.deliverer is not None:
            await self.deliverer.aclose()
        for c in [*self._tenants.values(), client]:
            await c.aclose()
        self._tenants.clear()
        for cell in self.cells:
            cell.sync_pool.disconnect()
            if cell.opened is None:
                continue
            pool, redis_client, broker, broker_pool = cell.opened
            cell.opened = None
            if cell.subscriber is not None:
                await cell.subscriber.aclose()
                await cell.subscriber.connection_pool.disconnect()
                cell.subscriber = None
            await redis_client.aclose()
            await pool.disconnect()
            if isinstance(broker, AmqpPublisher):
                broker.close()
            elif broker is not None and broker_pool is not None:
                await broker.aclose()
                await broker_pool.disconnect()
        self.uploads.shutdown(wait=False, cancel_futures=True)

    def client(self, tenant: str | None = None) -> AsyncClient | AsyncCellsClient:
        """The client of a caller's tenant: its ids are scoped to it (producer.scope.Scope)."""
        if self._client is None:
            raise RuntimeError("the app's clients are made when its lifespan starts (RouteState.open)")
        if tenant is None:
            return self._client
        c = self._tenants.get(tenant)
        if c is None:
            c = self._tenants[tenant] = self._client.with_tenant(tenant)
        return c

    def redises(self) -> list[tuple[str, Any]]:
        """(cell name, asyncio Redis client) of every Redis this route reads: one without cells."""
        return [(cell.name, cell.opened[1]) for cell in self.cells if cell.opened is not None]

    def quota_redis(self, tenant: str | None) -> Any:
        """Where `tenant`'s request rate is counted (fleet-wide): its home cell, the cell its name
        hashes to (vela2.wire.cells); the one Redis without cells."""
        cell = self.cells[0 if self.map is None else self.map.cell_of(tenant or "")]
        assert cell.opened is not None
        return cell.opened[1]

    async def take_rate(self, tenant: str | None, quotas: Quotas | None) -> None:
        """Count one request against `tenant`'s requests_per_s (producer.quotas.take_rate) in its home
        cell. Over cells, a home cell that does not answer lets the request through (logged): the
        tenant's requests to the other cells are not stalled by the rate count's cell."""
        try:
            await take_rate(self.quota_redis(tenant), tenant or "", quotas)
        except DOWN as e:
            if self.map is None:
                raise
            log.warning("requests_per_s of tenant %r not counted: its home cell is down (%s)", tenant or "", e)

    def job_cell(self, job_id: str) -> _Cell:
        """The cell that holds bulk job `job_id` (its record, lines, results and quota count)."""
        return self.cells[0 if self.map is None else self.map.cell_of(job_id)]

    def job_redis(self, job_id: str) -> Any:
        """The asyncio Redis client of the cell that holds bulk job `job_id`."""
        cell = self.job_cell(job_id)
        assert cell.opened is not None
        return cell.opened[1]

    def files(self, tenant: str | None, file_id: str) -> Files:
        """`tenant`'s files in the cell that holds `file_id` (producer.files; the one Redis without cells)."""
        return Files(self.job_redis(file_id), tenant, self.client(tenant).scope.wire, self.settings.file_expires_s)

    def jobs_client(self, tenant: str | None) -> Client | CellsClient:
        """A synchronous client of the caller's tenant over the bounded pools, for producer.jobs (over
        cells a CellsClient: each job read in its cell)."""
        s = self.settings
        clients = [Client(model=s.model, redis=redis_lib.Redis(connection_pool=cell.sync_pool), tenant=tenant,
                          wait_replicas=s.wait_replicas) for cell in self.cells]
        return clients[0] if self.map is None else CellsClient(self.map, model=s.model, clients=clients)

    def cell_down(self, job_id: str, exc: BaseException) -> CellUnavailable | None:
        """The CellUnavailable of a job route whose job's cell did not answer (None without cells, or
        for an error that is not a cell down): 503 cell_unavailable naming the cell and the job."""
        if self.map is None or not isinstance(exc, DOWN):
            return None
        return CellUnavailable(str(self.map.cells[self.map.cell_of(job_id)]), [job_id], exc)
