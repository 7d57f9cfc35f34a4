"""`vela2 http`: the HTTP route for SystemOne requests (an ASGI app; FastAPI, served by uvicorn).

    keys = KeyRing.load("keys.jsonl")                                          # producer.auth
    app = create_app("redis://127.0.0.1:6379/0", model="vela2-demo", keys=keys)  # any ASGI server
    serve("redis://127.0.0.1:6379/0", host="127.0.0.1", port=8000, keys=keys)    # uvicorn

Authentication: every route but ``/healthz``, ``/readyz`` and the OpenAPI document needs an API key
(``Authorization: Bearer <key>``; keys and their tenants in producer.auth): 401 without a known
key, 403 for a key not allowed this model. ``--no-auth`` serves without, on loopback only, and
says so at start; with neither keys nor ``--no-auth`` the route refuses to start (exit 2).

Routes (OpenAPI at /openapi.json; no /docs page, whose scripts would come from a CDN):

- ``POST /v1/system_one?wait_s=&deadline_s=``: a SystemOne request (JSON body). It is validated
  here, queued on the model's online queue, and awaited up to ``wait_s`` (default the app's
  ``timeout_s``, at most ``max_wait_s``; 0 = do not wait). The request id is an idempotency key: the
  same request under an id that already has an answer gets it back without being queued again; a
  request with other content under an id that is answered or pending gets 409 (``id_conflict``).
- ``GET /v1/results/{id}``: the stored answer (200, or the answer's own code below); 202 while a
  request submitted by a tracking producer (this route, ``Client`` / ``AsyncClient``) is pending;
  410 Gone when it was answered but the answer has since expired from the result store
  (``result_expires``: POST it again to score it anew); 404 when the id is unknown. A submission
  is recorded by a ``vela2:submitted:<id>`` marker that the worker turns into "answered" when it
  stores the result and that outlives the result, so an expired answer is never "pending" and
  never an endless wait. One MGET per GET. ``GET /v1/results?id=<id>`` is the same for any id,
  and the ``result_url`` of the ids ``.`` and ``..`` (clients resolve them as path segments).
- ``POST /v1/batches?window_s=&metadata=key=value``: a bulk job (producer.jobs) from a JSONL body (rows,
  SystemOne requests or OpenAI-batch lines ``{"custom_id", "body"}``) of at most ``max_batch_bytes``
  (``--max-batch-bytes``, default 64 MiB): 201 with the job once its lines are registered and queued
  (bad lines become error lines of the job). ``GET /v1/batches/{id}``: the job (status, exact
  counts, times, ``request_counts``, metadata). ``GET /v1/batches/{id}/output``: its output, one
  JSONL line per input line in input order (streamed), once the job has ended (409 before).
  ``POST /v1/batches/{id}/cancel``: cancel it (200 with the job; what no worker started is answered
  ``cancelled``). 404 for a job that is unknown, another tenant's, or expired with its results.
- ``GET /healthz``: liveness: 200 with the queue depths when Redis answers, else 503.
- ``GET /readyz``: readiness: 200 when at least one worker of the model has beaten within
  ``READY_STALE_S`` (workers beat every ``HEARTBEAT_S`` into ``vela2:workers:<model>`` while their
  engine makes progress; a stalled or stopped one drops out), else 503 (``no_worker`` or Redis
  ``unavailable``).

Status codes (the body is always JSON; for a SystemOne request the answer, or an error answer
``{"version", "model", "id", "status": "error", "error": {"type", "message"}}``):

====  ==========================================================================================
200   answered (``status: ok``)
202   not answered within ``wait_s``: ``{"id", "status": "pending", "result_url"}`` (+ Location)
201   a bulk job was created (POST /v1/batches)
400   body is not JSON (``invalid_request``), or the request names another model
      (``model_mismatch``: this route serves one model, named at start)
401   no API key, or an unknown one (``unauthorized``; with ``WWW-Authenticate: Bearer``)
403   the API key may not use this route's model (``forbidden``)
404   GET of an unknown id (never submitted by a tracking producer, or so long ago that even its
      marker is gone)
410   GET of an id whose answer expired from the result store: the error answer with
      ``error.type`` ``result_expired`` and the id (POST: only when it expired within ``wait_s``)
409   the request id already names a request with other content, answered or pending
      (``id_conflict``): an id is an idempotency key; the same content gets the stored answer;
      ``status: cancelled`` (cancelled before a worker started it); the output of a bulk job that
      has not ended (``job_running``)
408   the body did not arrive within ``--body-timeout-s`` (``invalid_request``); a connection whose
      request line and headers do not arrive within ``--headers-timeout-s`` is closed
413   body over ``LIMITS.max_message_bytes`` (``limit_exceeded``): by its Content-Length, or as
      soon as a streamed body passes it (the rest is never read)
422   invalid request (``invalid_request`` / ``limit_exceeded``, with the field, limit and value),
      refused here or by the worker; query parameters out of bounds (``deadline_s`` at most
      ``LIMITS.max_deadline_s``)
500   the worker failed on it (e.g. ``model_error``): the error answer
429   every Redis connection of the route stayed busy for ``--redis-wait-s`` (``busy``; with
      ``Retry-After``): load, not an outage
503   Redis unreachable, or (``--wait-replicas N``) fewer than N replicas took the submission
504   ``status: expired``: its ``deadline_s`` passed before a worker scored it
====  ==========================================================================================

No torch: a web backend runs this with the base install plus the ``producer`` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal
from urllib.parse import quote

import redis as redis_lib
import redis.asyncio as aioredis
import redis.exceptions
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, StringConstraints
from starlette.convertors import Convertor, register_url_convertor

from producer import jobs
from producer.aio import AsyncClient, BoundedPool, Busy, SyncBoundedPool
from producer.auth import ENV_API_KEYS, ENV_API_KEYS_FILE, KeyRing, Refusal
from producer.brokers import AmqpPublisher, NotReplicated, check_wait_replicas
from producer.client import DEFAULT_MODEL, DEFAULT_REDIS_URL, Client, prepare_request, result_expired_error
from producer.client import http_status as status_code
from vela2 import __version__
from vela2.api.schemas import ErrorInfo
from vela2.api.systemone import SYSTEM_ONE_VERSION, SystemOneAnswer, error_answer, parse_request, request_schema
from vela2.config import LIMITS
from vela2.errors import (
    ConfigError,
    IdConflict,
    InvalidRequest,
    JobNotFound,
    LimitExceeded,
    ModelMismatch,
    ResultExpired,
    Vela2Error,
)
from vela2.wire import tracing
from vela2.wire.connections import redis_pool
from vela2.wire.keys import HEARTBEAT_S, is_amqp_url, queue_name, workers_key
from vela2.wire.urls import (
    BROKER_SCHEMES,
    ENV_BROKER_URL,
    RESULT_STORE_SCHEMES,
    add_url_arguments,
    check_url,
    url_from_args,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0  # how long POST waits for the answer by default
DEFAULT_MAX_WAIT_S = 60.0  # the largest wait_s a caller may ask for
DEFAULT_PORT = 8000
ENV_MODEL = "VELA2_MODEL"
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
DEFAULT_REDIS_CONNECTIONS = 64  # Redis connections of one route process (requests share them)
DEFAULT_REDIS_WAIT_S = 5.0  # longest a request waits for a free one, then 429
DEFAULT_BODY_TIMEOUT_S = 30.0  # longest a request body may take to arrive, then 408
DEFAULT_HEADERS_TIMEOUT_S = 10.0  # longest a request line and headers may take to arrive, then the connection closes
RETRY_AFTER_S = 1
DEFAULT_MAX_BATCH_BYTES = 64 << 20  # the largest JSONL body of POST /v1/batches
# A batch's metadata over HTTP, as OpenAI's: string pairs (within producer.jobs.MAX_METADATA_BYTES as JSON)
MAX_METADATA_PAIRS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512
MetadataPair = Annotated[str, StringConstraints(
    pattern=rf"^[^=]{{1,{MAX_METADATA_KEY_CHARS}}}=[\s\S]{{0,{MAX_METADATA_VALUE_CHARS}}}$")]
READY_STALE_S = 3 * HEARTBEAT_S  # a worker whose last heartbeat is older is not counted live


class Pending(BaseModel):
    """A request queued but not answered yet: poll `result_url`."""

    id: str
    status: Literal["pending"] = "pending"
    result_url: str


class ErrorAnswer(BaseModel):
    """A refused request (the SystemOne error answer; id / model null when the body had none)."""

    version: Literal["1"] = SYSTEM_ONE_VERSION
    model: str | None = None
    id: str | None = None
    status: Literal["error"] = "error"
    error: ErrorInfo


class Health(BaseModel):
    """Liveness of the route and its Redis."""

    status: Literal["ok", "unavailable"]
    model: str
    redis: str  # "ok", or the connection error
    queue_depth: dict[str, int] | None = None  # online / backfill messages waiting


class Ready(BaseModel):
    """Readiness: a live worker serves the model (its heartbeat within the last READY_STALE_S)."""

    status: Literal["ready", "no_worker", "unavailable"]
    model: str
    workers: int  # workers of the model with a fresh heartbeat
    redis: str


class NotFound(BaseModel):
    detail: str


class BatchCounts(BaseModel):
    """OpenAI's request counts: completed = ok; failed = error + expired + cancelled."""

    total: int
    completed: int
    failed: int


class Batch(BaseModel):
    """A bulk job (vela2.wire.jobs.JobInfo.to_dict): OpenAI's batch fields plus exact counts by status
    (queued, ok, error, expired, cancelled)."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str
    status: Literal["validating", "in_progress", "cancelling", "completed", "cancelled", "expired", "failed"]
    created_at: int
    expires_at: int
    completion_window: str
    ended_at: int | None
    cancelling_at: int | None
    input_done: bool
    request_counts: BatchCounts
    counts: dict[str, int]
    served_by: dict[str, int]  # "<model> <digest, 12 digits> <precision>" -> ok lines it answered
    metadata: dict[str, Any]


async def read_body(request: Request, limit: int) -> bytes | LimitExceeded:
    """The request body, read only up to `limit` bytes: a larger one (by its Content-Length, or
    while it streams in) is refused with what is known of its size, and the rest is never read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return LimitExceeded(f"request body has {int(declared):,} bytes; limit {limit:,}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return LimitExceeded(f"request body has over {limit:,} bytes (read {size:,}); limit {limit:,}")
        chunks.append(chunk)
    return b"".join(chunks)


class _AnyId(Convertor[str]):
    """A path parameter holding any id: Starlette's "path" is ".*", which stops at a line break, and
    its route's "$" matches before a final one, so /v1/results/k%0A read the answer of "k"."""

    regex = "[\\s\\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("any_id", _AnyId())

DOT_SEGMENTS = (".", "..")  # ids a path cannot carry: clients resolve them before sending (RFC 3986)


def result_url(request: Request, rid: str) -> str:
    """Where the answer of `rid` is read: /v1/results/<id percent-encoded> (an id may hold any
    character, "/" included; a header is latin-1), or /v1/results?id=<id> for "." and ".."."""
    if rid in DOT_SEGMENTS:
        return str(request.url_for("get_result_by_query").include_query_params(id=rid))
    return str(request.url_for("get_result", request_id=quote(rid, safe="")))


def read_system_one(body: bytes, model: str) -> tuple[Any, JSONResponse | None]:
    """A POSTed body as (request object, None) once it is valid JSON and a valid SystemOne request
    for `model` within every limit checked at submit (producer.client.prepare_request), else
    (the object or None, the error response: 400 not JSON / nested too deeply / another model, 422
    invalid or over a limit)."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        return None, _error(400, InvalidRequest(f"request body is not valid JSON: {e}"))
    except RecursionError:
        return None, _error(400, InvalidRequest("request body is not valid JSON: nested too deeply"))
    try:
        parsed = parse_request(obj)
        if parsed.model != model:
            raise ModelMismatch(f"request names model {parsed.model!r}; this route serves {model!r}")
        prepare_request(obj, model)
    except ModelMismatch as e:
        return obj, _error(400, e, obj)
    except Vela2Error as e:
        return obj, _error(422, e, obj)
    except RecursionError:
        return obj, _error(400, InvalidRequest("request is nested too deeply"), obj)
    return obj, None


def _error(http_status: int, exc: BaseException, obj: Any = None) -> JSONResponse:
    body = (
        error_answer(obj, exc)
        if isinstance(obj, dict)
        else ErrorAnswer(
            error=ErrorInfo(type=exc.code if isinstance(exc, Vela2Error) else "invalid_request", message=str(exc))
        ).model_dump(mode="json")
    )
    return JSONResponse(body, status_code=http_status)


def _unavailable(exc: BaseException) -> JSONResponse:
    # NotReplicated: Redis answered, but fewer replicas than --wait-replicas hold the submission
    why = "not accepted" if isinstance(exc, NotReplicated) else "redis is unreachable"
    info = ErrorInfo(type="unavailable", message=f"{why}: {exc}")
    return JSONResponse(ErrorAnswer(error=info).model_dump(mode="json"), status_code=503)


_ANSWER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": SystemOneAnswer, "description": "answered"},
    400: {"model": ErrorAnswer, "description": "body is not JSON, or the request names another model"},
    401: {"model": ErrorAnswer, "description": "no API key, or an unknown one (error.type unauthorized)"},
    403: {"model": ErrorAnswer, "description": "the API key may not use this model (error.type forbidden)"},
    409: {"model": ErrorAnswer, "description": "the id already names a request with other content (id_conflict)"},
    413: {"model": ErrorAnswer, "description": "body over the message size limit"},
    422: {"model": ErrorAnswer, "description": "invalid request (the message names the field, limit and value)"},
    500: {"model": SystemOneAnswer, "description": "the worker failed on this request"},
    503: {"model": ErrorAnswer, "description": "redis is unreachable"},
    504: {"model": SystemOneAnswer, "description": "expired: the deadline passed before it was scored"},
}


def create_app(
    redis_url: str = DEFAULT_REDIS_URL,
    model: str = DEFAULT_MODEL,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    keys: KeyRing | None,
    redis_connections: int = DEFAULT_REDIS_CONNECTIONS,
    redis_wait_s: float = DEFAULT_REDIS_WAIT_S,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    broker_url: str | None = None,
    wait_replicas: int = 0,
) -> FastAPI:
    """The ASGI app serving `model` from the Redis at `redis_url` (see the module docstring), queueing
    on `broker_url` when the workers' broker is another Redis (as many connections again there).
    `max_batch_bytes`: the largest body of POST /v1/batches (it is held in memory while submitted).
    `keys`: the API keys callers must present (producer.auth); None serves without authentication
    (say so explicitly: `serve` allows it on loopback only). At most `redis_connections` Redis
    connections; a request waits up to `redis_wait_s` for one, then gets 429 with Retry-After. A
    body not received within `body_timeout_s` gets 408. `wait_replicas`: a submission is accepted only
    once this many replicas of the broker's Redis hold it (Client's `wait_replicas`; fewer: 503)."""
    check_wait_replicas(wait_replicas, broker_url)
    state: dict[str, AsyncClient] = {}
    tenants: dict[str, AsyncClient] = {}  # one client per tenant seen, over the one pool
    # The bulk-job routes run producer.jobs (synchronous, streaming) in worker threads, over a pool of
    # their own: at most `redis_connections` connections, a caller waits up to redis_wait_s for one.
    sync_pool = redis_pool(redis_url, SyncBoundedPool, max_connections=redis_connections, timeout=redis_wait_s)

    def jobs_client(tenant: str | None) -> Client:
        return Client(model=model, redis=redis_lib.Redis(connection_pool=sync_pool), tenant=tenant,
                      wait_replicas=wait_replicas)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Created inside the server's event loop: redis.asyncio connections belong to one loop.
        pool = redis_pool(redis_url, BoundedPool, max_connections=redis_connections, timeout=redis_wait_s)
        redis_client = aioredis.Redis(connection_pool=pool)
        # the broker when it is not the result store: RabbitMQ (one confirming publisher), or a Redis
        # pool as bounded as the result store's
        broker: Any = None
        broker_pool = None
        if broker_url and is_amqp_url(broker_url):
            broker = AmqpPublisher(broker_url)
        elif broker_url:
            broker_pool = redis_pool(broker_url, BoundedPool, max_connections=redis_connections, timeout=redis_wait_s)
            broker = aioredis.Redis(connection_pool=broker_pool)
        state["client"] = AsyncClient(model=model, track_submitted=True, redis=redis_client, broker=broker,
                                      wait_replicas=wait_replicas)
        try:
            yield
        finally:
            for c in [*tenants.values(), state.pop("client")]:
                await c.aclose()
            tenants.clear()
            await redis_client.aclose()
            await pool.disconnect()
            sync_pool.disconnect()
            if isinstance(broker, AmqpPublisher):
                broker.close()
            elif broker is not None and broker_pool is not None:
                await broker.aclose()
                await broker_pool.disconnect()

    app = FastAPI(
        title="Vela 2 SystemOne",
        version=__version__,
        # FastAPI's /docs and /redoc pages load their scripts from a CDN: not served (the OpenAPI
        # document at /openapi.json opens in any viewer, offline too)
        docs_url=None,
        redoc_url=None,
        description=f"SystemOne requests for model `{model}`, answered by the Vela 2 workers through Redis.",
        lifespan=lifespan,
    )

    if tracing.configure("vela2-http"):  # only when OTEL_* variables ask for traces (or the app set its own)

        @app.middleware("http")
        async def _join_trace(request: Request, call_next: Any) -> Any:
            """The caller's W3C trace context becomes the parent of the request's vela2.submit span."""
            token = tracing.incoming(request.headers)
            try:
                return await call_next(request)
            finally:
                tracing.detach(token)

    def client(tenant: str | None = None) -> AsyncClient:
        """The client of a caller's tenant: its ids are scoped to it (producer.client.Scope)."""
        if tenant is None:
            return state["client"]
        c = tenants.get(tenant)
        if c is None:
            c = tenants[tenant] = state["client"].with_tenant(tenant)
        return c

    class _Refused(Exception):
        def __init__(self, refusal: Refusal):
            self.refusal = refusal

    @app.exception_handler(_Refused)
    async def _refused(_: Request, exc: _Refused) -> JSONResponse:
        r = exc.refusal
        info = ErrorInfo(type=r.type, message=r.message)
        headers = {"WWW-Authenticate": "Bearer"} if r.status == 401 else None
        return JSONResponse(ErrorAnswer(model=model, error=info).model_dump(mode="json"), status_code=r.status,
                            headers=headers)

    def caller(request: Request) -> str | None:
        """The tenant of the request's API key (None without authentication); raises _Refused."""
        if keys is None:
            return None
        found = keys.check(request.headers.get("authorization"), model)
        if isinstance(found, Refusal):
            raise _Refused(found)
        return found.tenant

    def pending(request: Request, rid: str) -> JSONResponse:
        url = result_url(request, rid)
        return JSONResponse(
            Pending(id=rid, result_url=url).model_dump(mode="json"), status_code=202, headers={"Location": url}
        )

    def gone(rid: str, exc: ResultExpired) -> JSONResponse:
        info = ErrorInfo(type=exc.code, message=str(exc))
        return JSONResponse(ErrorAnswer(model=model, id=rid, error=info).model_dump(mode="json"), status_code=410)

    @app.exception_handler(Busy)
    async def _busy(_: Request, exc: Busy) -> JSONResponse:
        info = ErrorInfo(type="busy", message=str(exc))
        return JSONResponse(ErrorAnswer(model=model, error=info).model_dump(mode="json"), status_code=429,
                            headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(redis.exceptions.RedisError)
    async def _redis_down(_: Request, exc: redis.exceptions.RedisError) -> JSONResponse:
        log.warning("redis error: %s", exc)
        return _unavailable(exc)

    @app.exception_handler(RequestValidationError)
    async def _bad_params(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
        where = ".".join(str(p) for p in err.get("loc", ()))
        return _error(422, InvalidRequest(f"{where}: {err.get('msg')}; got {err.get('input')!r}"))

    @app.post(
        "/v1/system_one",
        summary="Score a SystemOne request",
        responses={
            **_ANSWER_RESPONSES,
            202: {"model": Pending, "description": "queued; not answered in wait_s"},
            408: {"model": ErrorAnswer, "description": "the body did not arrive within --body-timeout-s"},
            429: {"model": ErrorAnswer, "description": "every Redis connection stayed busy (busy; Retry-After)"},
            410: {
                "model": ErrorAnswer,
                "description": "answered, and expired from the result store within wait_s (result_expired; "
                "only when result_expires is shorter than the wait)",
            },
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SystemOneRequest"}}},
            }
        },
    )
    async def post_system_one(
        request: Request,
        tenant: str | None = Depends(caller),
        wait_s: float | None = Query(
            None, ge=0, le=max_wait_s, description=f"seconds to wait for the answer (default {timeout_s:g})"
        ),
        deadline_s: float | None = Query(
            None, gt=0, le=LIMITS.max_deadline_s,
            description="after this many seconds unscored, the worker answers expired (504)",
        ),
    ) -> JSONResponse:
        try:
            async with asyncio.timeout(body_timeout_s):
                body = await read_body(request, LIMITS.max_message_bytes)
        except TimeoutError:
            msg = f"the request body did not arrive within {body_timeout_s:g} s"
            return _error(408, InvalidRequest(msg))
        if isinstance(body, LimitExceeded):
            return _error(413, body)
        # parsed and validated in a thread: 8 MB of JSON takes seconds, which would stall every
        # other caller's request on this event loop
        obj, refused = await asyncio.to_thread(read_system_one, body, model)
        if refused is not None:
            return refused
        try:
            # queued unless its id is answered already (then the answer below comes at once), and
            # refused when the id names a request with other content (answered or pending);
            # validated above already (read_system_one)
            rid = await client(tenant).submit(obj, deadline_s=deadline_s, validate=False)
        except IdConflict as e:
            return _error(409, e, obj)
        except Vela2Error as e:  # over the message size once wrapped
            return _error(422, e, obj)
        wait = timeout_s if wait_s is None else wait_s
        try:
            answer = await client(tenant).answer(rid, timeout_s=wait)
        except TimeoutError:
            return pending(request, rid)
        except ResultExpired as e:  # answered and expired within the wait: result_expires is tiny
            return gone(rid, e)
        return JSONResponse(answer, status_code=status_code(answer))

    get_result_responses: dict[int | str, dict[str, Any]] = {
        **{k: v for k, v in _ANSWER_RESPONSES.items() if k not in (400, 409, 413)},
        202: {"model": Pending, "description": "submitted, not answered yet"},
        429: {"model": ErrorAnswer, "description": "every Redis connection stayed busy (busy; Retry-After)"},
        404: {"model": NotFound, "description": "unknown id (never submitted by a tracking producer)"},
        410: {
            "model": ErrorAnswer,
            "description": "answered, but the answer expired from the result store (error.type "
            "result_expired); POST the request again to score it anew",
        },
    }

    @app.get(
        "/v1/results/{request_id:any_id}",  # an id may hold "/" and line breaks (see _AnyId)
        name="get_result",
        summary="The answer of a submitted request",
        responses=get_result_responses,
    )
    async def get_result(request: Request, request_id: str, tenant: str | None = Depends(caller)) -> JSONResponse:
        try:
            state, answer = await client(tenant).lookup(request_id)  # one MGET: result and marker together
        except InvalidRequest as e:  # an id no request can have (over the limit): unknown, and why
            return JSONResponse({"detail": f"no request {request_id[:80]!r} is known: {e}"}, status_code=404)
        if answer is not None:
            return JSONResponse(answer, status_code=status_code(answer))
        if state == "expired":
            return gone(request_id, result_expired_error(request_id))
        if state == "pending":
            return pending(request, request_id)
        return JSONResponse(
            {"detail": f"no request {request_id!r} is known: never submitted by a tracking producer"},
            status_code=404,
        )

    @app.get(
        "/v1/results",
        name="get_result_by_query",
        summary="The answer of a submitted request, its id as a query parameter",
        description="The same as GET /v1/results/{request_id}, for ids a path cannot carry: `.` and `..` "
        "(clients resolve them as path segments before sending); the result_url of such an id is this form.",
        responses=get_result_responses,
    )
    async def get_result_by_query(
        request: Request, id: Annotated[str, Query(min_length=1)], tenant: str | None = Depends(caller)
    ) -> JSONResponse:
        return await get_result(request, id, tenant)

    def job_404(e: JobNotFound) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=404)

    @app.exception_handler(JobNotFound)
    async def _no_job(_: Request, exc: JobNotFound) -> JSONResponse:
        return job_404(exc)

    _job_responses: dict[int | str, dict[str, Any]] = {
        404: {"model": NotFound, "description": "no such job (unknown, another tenant's, or expired with its results)"},
        429: {"model": ErrorAnswer, "description": "every Redis connection stayed busy (busy; Retry-After)"},
        503: {"model": ErrorAnswer, "description": "redis is unreachable"},
    }

    @app.post(
        "/v1/batches",
        summary="Create a bulk job from a JSONL body",
        status_code=201,
        response_model=Batch,
        responses={
            201: {"model": Batch, "description": "created: every line registered, its requests queued"},
            408: {"model": ErrorAnswer, "description": "the body did not arrive within --body-timeout-s"},
            413: {"model": ErrorAnswer, "description": "body over --max-batch-bytes"},
            422: {"model": ErrorAnswer, "description": "no body, or window_s / metadata out of bounds"},
            **{k: v for k, v in _job_responses.items() if k != 404},
        },
        # Any bytes but none are a valid body (no type in its schema): each line is a request, and a line
        # that is not one becomes an error line of the job, never a refusal of the whole body.
        openapi_extra={"requestBody": {"required": True, "content": {"application/jsonl": {"schema": {
            "minLength": 1,
            "description": "one request a line: a row, a SystemOne request, or an OpenAI-batch line "
                           '{"custom_id": ..., "body": <row or SystemOne request>}; bad lines become error '
                           "lines of the job"}}}}},
    )
    async def create_batch(
        request: Request,
        tenant: str | None = Depends(caller),
        window_s: float = Query(jobs.DEFAULT_WINDOW_S, gt=0, le=LIMITS.max_deadline_s,
                                description="completion window: requests not started by then are answered expired"),
        metadata: Sequence[MetadataPair] | None = Query(
            None, max_length=MAX_METADATA_PAIRS, description=f"key=value pairs kept on the job (as OpenAI's: at "
            f"most {MAX_METADATA_PAIRS}, keys of 1-{MAX_METADATA_KEY_CHARS} characters without '=', values of at "
            f"most {MAX_METADATA_VALUE_CHARS}); repeat the parameter for each pair"),
    ) -> JSONResponse:
        try:
            async with asyncio.timeout(body_timeout_s):
                body = await read_body(request, max_batch_bytes)
        except TimeoutError:
            return _error(408, InvalidRequest(f"the request body did not arrive within {body_timeout_s:g} s"))
        if isinstance(body, LimitExceeded):
            return _error(413, body)
        if not body:
            return _error(422, InvalidRequest("the request body is empty: a batch needs at least one line"))
        meta = dict(pair.split("=", 1) for pair in metadata or [])

        def submit() -> dict[str, Any]:
            c = jobs_client(tenant)
            done = jobs.submit_job(c, io.BytesIO(body), window_s=window_s, metadata=meta)  # lines, lazily
            return jobs.job_info(c, done.id).to_dict()

        return JSONResponse(await asyncio.to_thread(submit), status_code=201)

    @app.get("/v1/batches/{job_id}", summary="A bulk job: status and exact counts", response_model=Batch,
             responses=_job_responses)
    async def get_batch(job_id: str, tenant: str | None = Depends(caller)) -> JSONResponse:
        info = await asyncio.to_thread(jobs.job_info, jobs_client(tenant), job_id)
        return JSONResponse(info.to_dict())

    @app.post("/v1/batches/{job_id}/cancel", summary="Cancel a bulk job", response_model=Batch,
              responses=_job_responses)
    async def cancel_batch(job_id: str, tenant: str | None = Depends(caller)) -> JSONResponse:
        info = await asyncio.to_thread(jobs.cancel_job, jobs_client(tenant), job_id)
        return JSONResponse(info.to_dict())

    @app.get(
        "/v1/batches/{job_id}/output",
        summary="A bulk job's output, one JSONL line per input line, in input order",
        responses={
            200: {"description": "streamed JSONL: the answers (OpenAI-batch lines for custom_id input lines)",
                  "content": {"application/jsonl": {"schema": {"type": "string"}}}},
            409: {"model": ErrorAnswer, "description": "the job has not ended yet (job_running)"},
            **_job_responses,
        },
    )
    async def batch_output(job_id: str, tenant: str | None = Depends(caller)) -> Any:
        c = jobs_client(tenant)
        info = await asyncio.to_thread(jobs.job_info, c, job_id)
        if not info.ended:
            info_err = ErrorInfo(type="job_running", message=f"job {job_id} is {info.status} ({info.answered:,} of "
                                 f"{info.total:,} lines answered); its output is served once it has ended")
            return JSONResponse(ErrorAnswer(model=model, error=info_err).model_dump(mode="json"), status_code=409)

        def lines() -> Any:  # a sync iterator: Starlette runs it in a worker thread, page by page
            for line, _ in jobs.job_lines(c, job_id):
                yield json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"

        return StreamingResponse(lines(), media_type="application/jsonl")

    @app.get(
        "/healthz",
        summary="Liveness: Redis reachable",
        response_model=Health,
        responses={503: {"model": Health, "description": "redis is unreachable"}},
    )
    async def healthz() -> JSONResponse:
        c = client()
        try:
            await c.ping()
            pipe = c.redis.pipeline(transaction=False)
            pipe.llen(queue_name(model))
            pipe.llen(queue_name(model, backfill=True))
            online, backfill = await pipe.execute()
        except redis.exceptions.RedisError as e:
            body = Health(status="unavailable", model=model, redis=str(e) or type(e).__name__)
            return JSONResponse(body.model_dump(mode="json"), status_code=503)
        depth = {"online": int(online), "backfill": int(backfill)}
        return JSONResponse(Health(status="ok", model=model, redis="ok", queue_depth=depth).model_dump(mode="json"))

    @app.get(
        "/readyz",
        summary="Readiness: Redis reachable and a live worker serving the model",
        response_model=Ready,
        responses={503: {"model": Ready, "description": "no live worker for the model, or Redis unreachable"}},
    )
    async def readyz() -> JSONResponse:
        since = time.time() - READY_STALE_S
        try:
            live = int(await client().redis.zcount(workers_key(model), since, "+inf"))
        except redis.exceptions.RedisError as e:
            body = Ready(status="unavailable", model=model, workers=0, redis=str(e) or type(e).__name__)
            return JSONResponse(body.model_dump(mode="json"), status_code=503)
        body = Ready(status="ready" if live else "no_worker", model=model, workers=live, redis="ok")
        return JSONResponse(body.model_dump(mode="json"), status_code=200 if live else 503)

    def openapi() -> dict[str, Any]:
        # The request body is read raw (so refusals carry our messages, not FastAPI's), so its
        # schema is added here from the pydantic model, with its definitions as components.
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            # Every rule the route and the worker apply to one field; the model is the one served.
            req = request_schema(model=model, ref_prefix="#/components/schemas/")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(req.pop("$defs"))
            components["SystemOneRequest"] = req
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def serve(
    redis_url: str = DEFAULT_REDIS_URL,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    model: str = DEFAULT_MODEL,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    log_level: str = "info",
    keys: KeyRing | None,
    redis_connections: int = DEFAULT_REDIS_CONNECTIONS,
    redis_wait_s: float = DEFAULT_REDIS_WAIT_S,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    headers_timeout_s: float = DEFAULT_HEADERS_TIMEOUT_S,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    broker_url: str | None = None,
    wait_replicas: int = 0,
) -> None:
    """Run the app with uvicorn until SIGINT / SIGTERM (graceful: in-flight requests finish).
    `keys` None (no authentication) is refused unless `host` is a loopback address; a URL of the
    wrong scheme raises ConfigError naming it (password masked)."""
    import uvicorn

    check_url(redis_url, "result store", RESULT_STORE_SCHEMES)
    if broker_url:
        check_url(broker_url, "broker", BROKER_SCHEMES)
    if keys is None:
        if host not in LOOPBACK_HOSTS:
            raise ConfigError(f"--no-auth serves only on loopback ({', '.join(LOOPBACK_HOSTS)}); got --host {host}")
        log.warning("authentication is OFF (--no-auth): every caller on this host may ask and read every answer")
    elif not len(keys):
        raise ConfigError(f"no API keys: give --api-keys-file F (or ${ENV_API_KEYS_FILE} / ${ENV_API_KEYS}), "
                          "or --no-auth on loopback")
    app = create_app(redis_url, model, timeout_s=timeout_s, max_wait_s=max_wait_s, keys=keys,
                     redis_connections=redis_connections, redis_wait_s=redis_wait_s, body_timeout_s=body_timeout_s,
                     max_batch_bytes=max_batch_bytes, broker_url=broker_url, wait_replicas=wait_replicas)
    uvicorn.run(app, host=host, port=port, log_level=log_level, http=headers_timeout_protocol(headers_timeout_s))


def headers_timeout_protocol(timeout_s: float) -> type:
    """uvicorn's h11 protocol, closing a connection whose request line and headers have not all
    arrived within `timeout_s` of the connection (or of the previous response): uvicorn itself
    would hold such a connection for ever (a slowloris)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadersTimeout(H11Protocol):
        _headers_timer: asyncio.TimerHandle | None = None
        _waiting_for: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._waiting_for = self.cycle  # a request whose headers arrive replaces this cycle
            self._headers_timer = self.loop.call_later(timeout_s, self._headers_timed_out)

        def _disarm(self) -> None:
            timer, self._headers_timer = self._headers_timer, None
            if timer is not None:
                timer.cancel()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not self._waiting_for:  # the headers are in: the body has its own timeout
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._disarm()
                self._arm()  # the next request on this connection gets the same time

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _headers_timed_out(self) -> None:
            self._headers_timer = None
            if not self.transport.is_closing():
                self.logger.warning("closing a connection whose request headers did not arrive within %g s",
                                    timeout_s)
                self.transport.close()

    return HeadersTimeout


def _positive(kind: type) -> Any:
    def parse(raw: str) -> Any:
        value = kind(raw)
        if not value > 0:  # NaN too
            raise argparse.ArgumentTypeError(f"must be > 0; got {raw}")
        return value

    return parse


def _at_least_zero(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0; got {raw}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The `vela2 http` arguments (shared with the CLI)."""
    ap = argparse.ArgumentParser(prog="vela2 http", description=__doc__.splitlines()[0])
    add_url_arguments(ap, DEFAULT_REDIS_URL)
    ap.add_argument("--broker", default=os.environ.get(ENV_BROKER_URL) or None,
                    help=f"the workers' broker URL when it is not the Redis of --redis (default ${ENV_BROKER_URL})")
    ap.add_argument("--host", default="127.0.0.1", help="interface (0.0.0.0 inside a container)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT)
    ap.add_argument("--model", default=os.environ.get(ENV_MODEL, DEFAULT_MODEL), help="the model served")
    ap.add_argument("--wait-replicas", type=_at_least_zero, default=0, metavar="N",
                    help="accept a submission once N replicas of the broker's Redis hold it (Redis WAIT; Sentinel)")
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="default wait for an answer")
    ap.add_argument("--max-wait-s", type=float, default=DEFAULT_MAX_WAIT_S, help="largest wait_s accepted")
    ap.add_argument("--log-level", default="info")
    ap.add_argument("--api-keys-file", default=None,
                    help=f"the API keys callers present (producer.auth; default ${ENV_API_KEYS_FILE}, "
                    f"plus ${ENV_API_KEYS})")
    ap.add_argument("--redis-connections", type=_positive(int), default=DEFAULT_REDIS_CONNECTIONS,
                    help="Redis connections of this process (requests wait for a free one)")
    ap.add_argument("--redis-wait-s", type=_positive(float), default=DEFAULT_REDIS_WAIT_S,
                    help="longest a request waits for a Redis connection, then 429 + Retry-After")
    ap.add_argument("--body-timeout-s", type=_positive(float), default=DEFAULT_BODY_TIMEOUT_S,
                    help="longest a request body may take to arrive, then 408")
    ap.add_argument("--headers-timeout-s", type=_positive(float), default=DEFAULT_HEADERS_TIMEOUT_S,
                    help="longest a request's line and headers may take to arrive, then the connection is closed")
    ap.add_argument("--max-batch-bytes", type=_positive(int), default=DEFAULT_MAX_BATCH_BYTES,
                    help="largest JSONL body of POST /v1/batches (held in memory while it is submitted)")
    ap.add_argument("--no-auth", action="store_true",
                    help="serve without authentication (loopback only; it says so at start)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """the HTTP route for SystemOne requests (serves until stopped)"""
    args = build_parser().parse_args(argv)
    try:
        redis_url = url_from_args(args.redis, args.redis_url_file, sys.argv[1:] if argv is None else argv, log)
        if args.no_auth and (args.api_keys_file or os.environ.get(ENV_API_KEYS_FILE) or os.environ.get(ENV_API_KEYS)):
            raise ConfigError("--no-auth and API keys both given: choose one")
        keys = None if args.no_auth else KeyRing.load(args.api_keys_file)
        serve(
            redis_url,
            args.host,
            args.port,
            args.model,
            timeout_s=args.timeout_s,
            max_wait_s=args.max_wait_s,
            log_level=args.log_level,
            keys=keys,
            redis_connections=args.redis_connections,
            redis_wait_s=args.redis_wait_s,
            body_timeout_s=args.body_timeout_s,
            headers_timeout_s=args.headers_timeout_s,
            max_batch_bytes=args.max_batch_bytes,
            broker_url=args.broker,
            wait_replicas=args.wait_replicas,
        )
    except (ConfigError, InvalidRequest) as e:
        print(f"vela2 http: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
