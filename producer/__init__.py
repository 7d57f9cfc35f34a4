"""Producers: the client library (sync and asyncio), bulk backfill and the HTTP route.

Never imports torch: a web backend installs the `producer` extra and talks to Redis only.
The exceptions a caller catches are re-exported here (all from vela2.errors): InvalidRequest (a
request the worker would refuse; a ValueError), LimitExceeded (over a documented limit; an
InvalidRequest), ModelMismatch (a SystemOne request naming another model; an InvalidRequest),
IdConflict (an id already naming other content), ResultExpired (answered, but the answer expired
from Redis; a LookupError), JobNotFound (a bulk job id that is unknown; a LookupError), StoreFull
(Redis is up and refuses writes for memory: nothing was queued), QuotaExceeded (a tenant's quota, or a
submit's max_queued, refused it before anything was written), and Vela2Error, the base of them
all. CellsClient / AsyncCellsClient are the clients of a deployment of many Redis cells
(producer.cells); a cell that is down raises CellUnavailable for its ids only. Redis being away
raises redis.ConnectionError; a wait past its timeout raises TimeoutError, and one for a model no
worker has served for the clients' no_worker_grace_s raises NoWorker (a TimeoutError) at once.
Test helpers: producer.testing.
"""

from producer.aio import AsyncClient
from producer.cells import AsyncCellsClient, CellsClient
from producer.client import Client
from vela2.errors import (
    CellUnavailable,
    IdConflict,
    InvalidRequest,
    JobNotFound,
    LimitExceeded,
    ModelMismatch,
    NoWorker,
    QuotaExceeded,
    ResultExpired,
    StoreFull,
    Vela2Error,
)

__all__ = ["AsyncCellsClient", "AsyncClient", "CellUnavailable", "CellsClient", "Client", "IdConflict",
           "InvalidRequest", "JobNotFound", "LimitExceeded", "ModelMismatch", "NoWorker", "QuotaExceeded",
           "ResultExpired", "StoreFull", "Vela2Error"]
