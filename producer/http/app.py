"""`vela2 http`: the HTTP route for SystemOne requests (an ASGI app; FastAPI, served by uvicorn).

    keys = KeyRing.load("keys.jsonl")                                          # producer.auth
    app = create_app("redis://127.0.0.1:6379/0", model="vela2-demo", keys=keys)  # any ASGI server
    serve("redis://127.0.0.1:6379/0", host="127.0.0.1", port=8000, keys=keys)    # uvicorn

Authentication: every route but ``/healthz``, ``/readyz``, ``/metrics`` and the OpenAPI document needs an API key
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
- ``GET /metrics`` (``--metrics-path``; empty: not served): the route's Prometheus metrics
  (producer.http.metrics: requests by route template, method and status, their durations, in flight).

Status codes. The body is always JSON; every error, on every route (404 and 405 of unknown paths and
methods, 422 of parameters and the /v1/files and /v1/batches routes included), is one envelope
(producer.http.responses; the OpenAPI document's ``Error``): OpenAI's error object, which the openai
SDK reads, in the SystemOne error answer,
``{"version", "model", "id", "status": "error", "error": {"type", "message", "param", "code"[, "hint"]}}``
(``code`` = ``type``; ``param`` the parameter or field at fault, or null; ``hint``, only where the
caller plainly used the wrong route or form, what to do instead: it ends the message too).

====  ==========================================================================================
200   answered (``status: ok``)
202   not answered within ``wait_s``: ``{"id", "status": "pending", "result_url"}`` (+ Location);
      the route's own wait ran out, which is no error: poll the result_url
201   a bulk job was created (POST /v1/batches)
400   body is not JSON (``invalid_request``; JSONL gets a hint: POST it to /v1/batches), or the
      request names another model (``model_mismatch``: this route serves one model, named at start)
401   no API key, or an unknown one (``unauthorized``; with ``WWW-Authenticate: Bearer``)
403   the API key may not use this route's model (``forbidden``)
404   GET of an unknown id (never submitted by a tracking producer, or so long ago that even its
      marker is gone), an unknown job or file, or an unknown path (``not_found``; a path close to a
      route's gets the hint "did you mean POST /v1/system_one?")
405   a method the path does not take (``method_not_allowed``): the message and the Allow header
      name the methods it takes
410   the request will never be scored: its own ``deadline_s`` passed before a worker scored it
      (``status: expired``, ``error.type`` ``expired``; the caller's deadline, not a server fault:
      send it again under a new id), or it was answered and its answer expired from the result
      store (``status: error``, ``error.type`` ``result_expired``; POST: only when it expired within
      ``wait_s``)
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
      ``LIMITS.max_deadline_s``; ``param`` names it); a row, an OpenAI batch line or a batch-create
      body POSTed to /v1/system_one gets a hint naming where it goes
500   the worker failed on it (e.g. ``model_error``): the error answer; ``internal_error``: the
      route itself failed (its log holds the traceback)
429   every Redis connection of the route stayed busy for ``--redis-wait-s`` (``busy``; with
      ``Retry-After``): load, not an outage
507   Redis refuses writes for memory (``store_full``): nothing was queued
503   Redis unreachable, or (``--wait-replicas N``) fewer than N replicas took the submission;
      over cells, ``cell_unavailable``: the cell holding the id (or the job) does not answer;
      ``no_worker``: the wait found no worker of the model beating for 30 s (the request stays
      queued; the hint and the Location header say where to read it; wait_s=0 gets 202)
====  ==========================================================================================

Layout: this module assembles the app (`create_app`, or `build_app` of one Settings: settings and
clients in one RouteState on ``app.state.vela2``, exception handlers, the routers, the OpenAPI
document) and runs it (`serve`, `run`, `main`); every setting is declared once, in
producer.http.settings.Settings; one module per route family in producer.http.routes, the response
models in producer.http.models, the error envelope in producer.http.responses, the exception
handlers and hints in producer.http.errors, the dependencies in producer.http.deps, the arguments
and uvicorn's protocol in producer.http.server.

Over Redis cells (``--cells FILE``, vela2.wire.cells; ``cells=`` of create_app): each request is
queued and read in its id's cell, each bulk job lives in its job id's cell; /healthz and /readyz read
every cell and merge (``degraded`` while some do not answer). A cell that does not answer stalls only
its slice: requests and jobs whose ids it holds get 503 ``cell_unavailable`` naming the cell, every
other id is served. Quotas over cells: requests_per_s is counted fleet-wide in the tenant's home cell
(the cell its name hashes to; while that cell is down the rate is not counted), stored_bytes and
tokens_per_s summed over the cells that answer, queued, live_jobs and job_lines per cell.

No torch: a web backend runs this with the base install plus the ``producer`` extra.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi

from producer.arguments import cells_from_args
from producer.auth import ENV_API_KEYS, ENV_API_KEYS_FILE, KeyRing
from producer.client import DEFAULT_MODEL, DEFAULT_REDIS_URL
from producer.http.errors import add_exception_handlers, unify_error_schemas
from producer.http.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from producer.http.metrics import MetricsMiddleware, RouteMetrics
from producer.http.routes import batches, files, health, requests, results
from producer.http.server import LOOPBACK_HOSTS, build_parser, headers_timeout_protocol, settings_from_args
from producer.http.settings import Settings
from producer.http.state import RouteState
from producer.quotas import load_quotas_file
from producer.webhooks import WebhookPolicy
from vela2 import __version__
from vela2.api.systemone import request_schema
from vela2.errors import ConfigError, InvalidRequest
from vela2.wire import tracing
from vela2.wire.urls import BROKER_SCHEMES, RESULT_STORE_SCHEMES, check_url, url_from_args

__all__ = ["Settings", "build_app", "build_parser", "create_app", "main", "run", "serve"]

log = logging.getLogger(__name__)


def create_app(redis_url: str = DEFAULT_REDIS_URL, model: str = DEFAULT_MODEL, *, keys: KeyRing | None,
               **options: Any) -> FastAPI:
    """The ASGI app serving `model` from the Redis at `redis_url` (see the module docstring).
    `keys`: the API keys callers must present (producer.auth); None serves without authentication
    (say so explicitly: `serve` allows it on loopback only). `options`: any other field of
    producer.http.settings.Settings by name (timeout_s=, broker_url=, cells=, tenant_quotas=, webhooks=,
    ...: each one's declaration says what it does, and its default); one it does not have is a
    TypeError, a value its check refuses a ConfigError."""
    return build_app(Settings(redis_url=redis_url, model=model, keys=keys, **options))


def build_app(settings: Settings) -> FastAPI:
    """The ASGI app of `settings` (create_app's, given as one Settings)."""
    model = settings.model
    state = RouteState(settings)
    # FastAPI's /docs and /redoc pages load their scripts from a CDN: not served (the OpenAPI
    # document at /openapi.json opens in any viewer, offline too)
    app = FastAPI(title="Vela 2 SystemOne", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan,
                  description=f"SystemOne requests for model `{model}`, answered by the Vela 2 workers through Redis.")
    app.state.vela2 = state
    if tracing.configure("vela2-http"):  # only when OTEL_* variables ask for traces (or the app set its own)
        app.middleware("http")(join_trace)
    add_exception_handlers(app)
    if settings.metrics_path:  # added last: outermost, it counts every request as it is answered
        metrics = RouteMetrics()
        app.add_middleware(MetricsMiddleware, metrics=metrics)
        app.add_api_route(settings.metrics_path, metrics_endpoint(metrics), methods=["GET"], include_in_schema=False)
    # In this order: the order of the OpenAPI document. POST /v1/system_one's query parameters are
    # bounded by this app's settings, so they come with the router (routes.requests).
    app.include_router(requests.router, dependencies=[Depends(requests.query_parameters(settings))])
    app.include_router(results.router)
    app.include_router(batches.router)
    app.include_router(files.router)
    app.include_router(health.router)
    app.openapi = functools.partial(openapi_document, app, model)  # type: ignore[method-assign]
    return app


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The app's Redis clients, made inside the server's event loop (redis.asyncio connections belong
    to one loop) and closed when it stops."""
    state: RouteState = app.state.vela2
    state.open()
    await state.publish_shares()
    try:
        yield
    finally:
        await state.aclose()


def metrics_endpoint(metrics: RouteMetrics) -> Callable[[], Awaitable[Response]]:
    """GET /metrics of `metrics`: the route's Prometheus text (producer.http.metrics)."""

    async def read_metrics() -> Response:
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    return read_metrics


async def join_trace(request: Request, call_next: Any) -> Any:
    """The caller's W3C trace context becomes the parent of the request's vela2.submit span."""
    token = tracing.incoming(request.headers)
    try:
        return await call_next(request)
    finally:
        tracing.detach(token)


def openapi_document(app: FastAPI, model: str) -> dict[str, Any]:
    """The app's OpenAPI document, made once. The request body of POST /v1/system_one is read raw (so
    refusals carry our messages, not FastAPI's), so its schema is added here from the pydantic model,
    with its definitions as components: every rule the route and the worker apply to one field, for
    the model served."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        req = request_schema(model=model, ref_prefix="#/components/schemas/")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(req.pop("$defs"))
        components["SystemOneRequest"] = req
        unify_error_schemas(schema)
        app.openapi_schema = schema
    return app.openapi_schema


def serve(redis_url: str = DEFAULT_REDIS_URL, *, keys: KeyRing | None, **options: Any) -> None:
    """Run the app with uvicorn until SIGINT / SIGTERM (graceful: in-flight requests finish).
    `keys` and `options` as create_app's (host=, port=, log_level=, headers_timeout_s= among them:
    producer.http.settings.Settings); see `run`."""
    run(Settings(redis_url=redis_url, keys=keys, **options))


def run(settings: Settings) -> None:
    """Serve `settings` with uvicorn until SIGINT / SIGTERM (graceful: in-flight requests finish).
    No keys (no authentication) is refused unless the host is a loopback address; a URL of the
    wrong scheme raises ConfigError naming it (password masked)."""
    import uvicorn

    s = settings
    if s.cells is None:  # a cells file's URLs are checked as it loads
        check_url(s.redis_url, "result store", RESULT_STORE_SCHEMES)
        if s.broker_url:
            check_url(s.broker_url, "broker", BROKER_SCHEMES)
    if s.keys is None:
        if s.host not in LOOPBACK_HOSTS:
            raise ConfigError(f"--no-auth serves only on loopback ({', '.join(LOOPBACK_HOSTS)}); got --host {s.host}")
        log.warning("authentication is OFF (--no-auth): every caller on this host may ask and read every answer")
    elif not len(s.keys):
        raise ConfigError(f"no API keys: give --api-keys-file F (or ${ENV_API_KEYS_FILE} / ${ENV_API_KEYS}), "
                          "or --no-auth on loopback")
    uvicorn.run(build_app(s), host=s.host, port=s.port, log_level=s.log_level,
                http=headers_timeout_protocol(s.headers_timeout_s))


def main(argv: list[str] | None = None) -> int:
    """the HTTP route for SystemOne requests (serves until stopped)"""
    args = build_parser().parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    try:
        redis_url = url_from_args(args.redis, args.redis_url_file, given, log)
        if args.no_auth and (args.api_keys_file or os.environ.get(ENV_API_KEYS_FILE) or os.environ.get(ENV_API_KEYS)):
            raise ConfigError("--no-auth and API keys both given: choose one")
        keys = None if args.no_auth else KeyRing.load(args.api_keys_file)
        cells = cells_from_args(args, given)
        run(settings_from_args(args, redis_url=redis_url, cells=cells, keys=keys,
                               tenant_quotas=load_quotas_file(args.quotas_file), webhooks=webhook_policy(args, keys)))
    except (ConfigError, InvalidRequest) as e:
        print(f"vela2 http: {e}", file=sys.stderr)
        return 2
    return 0


def webhook_policy(args: Any, keys: KeyRing | None) -> WebhookPolicy:
    """The webhooks the arguments allow (--webhook-allow, --webhook-secret, the keys' secrets); a key's
    webhook_url that the policy refuses is a ConfigError at start, not a 400 on each of its jobs."""
    policy = WebhookPolicy(tuple(args.webhook_allow or ()), args.webhook_secret,
                           keys.webhook_secrets() if keys is not None else {})
    for key in keys.keys if keys is not None else []:
        if key.webhook_url is not None and (problem := policy.problem(key.webhook_url, key.tenant)):
            raise ConfigError(f"the keys file's webhook_url of tenant {key.tenant!r}: {problem}")
    return policy


if __name__ == "__main__":
    sys.exit(main())
