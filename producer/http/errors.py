"""The route's errors that its handlers do not answer themselves, in the one envelope
(producer.http.responses): the exception handlers (`add_exception_handlers`: a refused API key, Redis
busy or away, quotas, FastAPI's and Starlette's own 404 / 405 / 422, any other failure as a 500), the
hints where a caller plainly used the wrong route or form (`path_hint`: "did you mean" a route close
to an unknown path; `form_hint`: a row POSTed where a SystemOne request goes, or the reverse), and the
OpenAPI document's error responses, every one of them the Error schema (`unify_error_schemas`).
"""

from __future__ import annotations

import difflib
import json
import logging
import re
from typing import Any

import fastapi.routing
import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from producer.aio import Busy
from producer.http.deps import Refused
from producer.http.responses import error, error_response, unavailable
from producer.quotas import QuotaExceeded
from producer.submitting import store_full
from vela2.errors import CellUnavailable, InvalidRequest, JobNotFound, StoreFull, UploadTimeout

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # the Retry-After of a 429 (every Redis connection stayed busy)
PATH_CUTOFF = 0.75  # how close (difflib's ratio) an unknown path must be to a route's to be suggested
MAX_HINTED_PATH = 200  # characters of a path compared with the routes' (a longer one is no typo of theirs)
# error.type of an HTTP error Starlette or FastAPI raised, by status (others: http_error)
HTTP_ERROR_TYPES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 413: "limit_exceeded"}
ROW_KEYS = {"task", "text", "questions"}  # a row's own keys (vela2.api.schemas.Row); a SystemOne request has none
SYSTEM_ONE_KEYS = {"model", "input", "tasks"}
ROWS_HOW = ("POST rows as the lines of a bulk job (POST /v1/batches, Content-Type application/jsonl), or submit "
            "them with producer.Client")


def add_exception_handlers(app: FastAPI) -> None:
    """Register what the app answers for the exceptions its routes leave, each in the error envelope:
    a refused API key (401 / 403), every Redis connection busy (429), Redis away (503) or full (507),
    a quota (429 / 507), an upload too slow (408), a parameter out of bounds (422), no such job (404),
    a cell down (503), Starlette's 404 / 405, and anything else (500, its traceback logged)."""
    app.exception_handler(Refused)(refused)
    app.exception_handler(Busy)(busy)
    app.exception_handler(redis.exceptions.RedisError)(redis_down)
    app.exception_handler(StoreFull)(full_store)
    app.exception_handler(UploadTimeout)(upload_timeout)
    app.exception_handler(QuotaExceeded)(over_quota)
    app.exception_handler(RequestValidationError)(bad_params)
    app.exception_handler(JobNotFound)(no_job)
    app.exception_handler(CellUnavailable)(cell_down)
    app.exception_handler(StarletteHTTPException)(http_error)
    app.exception_handler(Exception)(internal_error)


def _model(request: Request) -> str:
    model: str = request.app.state.vela2.settings.model
    return model


async def refused(request: Request, exc: Refused) -> JSONResponse:
    """401 (with WWW-Authenticate: Bearer) or 403: the API key check's refusal."""
    r = exc.refusal
    headers = {"WWW-Authenticate": "Bearer"} if r.status == 401 else None
    return error_response(r.status, r.type, r.message, model=_model(request), headers=headers)


async def busy(request: Request, exc: Busy) -> JSONResponse:
    """429 with Retry-After: every Redis connection stayed busy for --redis-wait-s (load, not an outage)."""
    return error_response(429, "busy", str(exc), model=_model(request), headers={"Retry-After": str(RETRY_AFTER_S)})


async def redis_down(_: Request, exc: redis.exceptions.RedisError) -> JSONResponse:
    """503: Redis is unreachable (or took a submission on too few replicas); 507 store_full when it
    answered and refused a write for memory."""
    full = store_full(exc)
    if full is not None:
        log.warning("redis refuses writes: %s", exc)
        return error(507, full)
    log.warning("redis error: %s", exc)
    return unavailable(exc)


async def cell_down(_: Request, exc: CellUnavailable) -> JSONResponse:
    """503 cell_unavailable: the Redis cell holding the request's id (or the job) does not answer;
    other ids are served."""
    log.warning("%s", exc)
    return error(503, exc)


async def over_quota(_: Request, exc: QuotaExceeded) -> JSONResponse:
    """429 (507 for stored_bytes) quota_exceeded naming the quota, its limit and the usage, with
    Retry-After."""
    response = error(exc.status, exc, param=exc.quota)
    response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


async def upload_timeout(_: Request, exc: UploadTimeout) -> JSONResponse:
    """408 upload_timeout: an upload took longer than --upload-timeout-s to register (its job failed)."""
    return error(408, exc)


async def full_store(_: Request, exc: StoreFull) -> JSONResponse:
    """507 store_full: Redis refuses writes for memory (a route whose own code raised it)."""
    return error(507, exc)


async def bad_params(_: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming the first parameter out of bounds (`param` too), its rule and the value given."""
    err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
    loc = [str(p) for p in err.get("loc", ())]
    where = ".".join(loc)
    # loc is (query / path / header / body, the parameter's name, ...): `param` is the name
    named = loc[1:] if loc and loc[0] in ("query", "path", "header", "cookie", "body") else loc
    return error(422, InvalidRequest(f"{where}: {err.get('msg')}; got {err.get('input')!r}"),
                 param=".".join(named) or None)


async def no_job(request: Request, exc: JobNotFound) -> JSONResponse:
    """404 not_found: no such job (unknown, another tenant's, or expired with its results)."""
    return error_response(404, "not_found", str(exc), model=_model(request))


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    """500 internal_error: a failure of the route itself (a bug); the message names the exception's
    class only, its traceback goes to the log (Starlette logs it after this answer)."""
    message = (f"the route failed on {request.method} {request.url.path[:MAX_HINTED_PATH]} ({type(exc).__name__}); "
               "its log says why")
    return error_response(500, "internal_error", message, model=_model(request))


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's and FastAPI's own HTTP errors in the envelope: a 404 of an unknown path names the
    route it is close to; a 405 names every method of the path, in the message and the Allow header
    (Starlette's names only those of the first route that matched it: POST of /v1/batches, not GET)."""
    method, path, model = request.method, request.url.path, _model(request)
    if exc.status_code == 404:
        return error_response(404, "not_found", f"no route {method} {path[:MAX_HINTED_PATH]}",
                              hint=path_hint(request.app, path), model=model, headers=exc.headers)
    if exc.status_code == 405:
        allowed = sorted({m for route in all_routes(request.app) for m in getattr(route, "methods", None) or ()
                          if route.matches(request.scope)[0] != Match.NONE})
        return error_response(405, "method_not_allowed", f"{method} is not allowed on {path[:MAX_HINTED_PATH]}; "
                              f"it takes {', '.join(allowed)}", hint=METHOD_HINTS.get((method, _family(path))),
                              model=model, headers={"Allow": ", ".join(allowed)})
    kind = HTTP_ERROR_TYPES.get(exc.status_code, "http_error")
    return error_response(exc.status_code, kind, str(exc.detail), model=model, headers=exc.headers)


def _family(path: str) -> str:
    """The first two segments of a path (/v1/results/abc -> /v1/results)."""
    return "/".join(path.split("/")[:3])


# What a caller who used the wrong method on a path most likely meant
METHOD_HINTS = {
    ("GET", "/v1/system_one"): "POST a SystemOne request here; read a stored answer with GET /v1/results/{id}",
    ("POST", "/v1/results"): "POST a SystemOne request to /v1/system_one; /v1/results/{id} is read with GET",
}


def all_routes(app: FastAPI) -> list[Any]:
    """Every route of the app, each with `path`, `methods` and `matches`: FastAPI 0.16x keeps the
    routes of an included router behind one entry of `app.routes` (iter_route_contexts lists them),
    earlier versions in `app.routes` itself."""
    contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    return list(app.routes) if contexts is None else list(contexts(app.routes))


def _routes(app: FastAPI) -> dict[str, set[str]]:
    """Path template (its convertors left out: /v1/results/{request_id}) -> its methods, of every route."""
    out: dict[str, set[str]] = {}
    for route in all_routes(app):
        path, methods = getattr(route, "path", None), getattr(route, "methods", None)
        if isinstance(path, str) and methods:
            out.setdefault(re.sub(r"{(\w+):[^}]*}", r"{\1}", path), set()).update(methods - {"HEAD"})
    return out


def path_hint(app: FastAPI, path: str) -> str | None:
    """"did you mean METHOD /route?" for an unknown `path` close to a route's (difflib's ratio at least
    PATH_CUTOFF), else None. Against a template of as many segments, only the segments that are not
    parameters are compared (/v1/result/x with /v1/results/{request_id}: /v1/result with /v1/results),
    so that an id never makes a path look close."""
    if len(path) > MAX_HINTED_PATH:
        return None
    segments = path.split("/")
    best, best_ratio = None, PATH_CUTOFF
    for template in _routes(app):
        parts = template.split("/")
        probe, known = path, template
        if len(parts) == len(segments):
            fixed = [i for i, part in enumerate(parts) if not part.startswith("{")]
            probe, known = "/".join(segments[i] for i in fixed), "/".join(parts[i] for i in fixed)
        ratio = difflib.SequenceMatcher(None, probe, known).ratio()
        if ratio >= best_ratio:
            best, best_ratio = template, ratio
    if best is None:
        return None
    return f"did you mean {' or '.join(sorted(_routes(app)[best]))} {best}?"


def form_hint(obj: Any, route: str) -> str | None:
    """What to do instead when the JSON object `obj` POSTed to `route` (/v1/system_one, or /v1/batches
    as application/json) is plainly of another route's form: a row, a SystemOne request, a line of an
    OpenAI batch file, a batch-create body. None when it looks like none of these."""
    if not isinstance(obj, dict):
        return None
    keys = set(obj)
    if route == "/v1/system_one":
        if keys & ROW_KEYS and not keys & SYSTEM_ONE_KEYS - {"model"}:
            return (f"this looks like a row ({', '.join(sorted(keys & ROW_KEYS))}), not a SystemOne request "
                    f"{{model, input, tasks}}: {ROWS_HOW}")
        if "custom_id" in keys and "body" in keys:
            return ("this looks like a line of an OpenAI batch file: POST the file's lines to /v1/batches "
                    "(Content-Type application/jsonl), or POST its body alone here")
        if "input_file_id" in keys:
            return "this looks like a batch-create body: POST it to /v1/batches"
        return None
    if keys >= SYSTEM_ONE_KEYS:
        return ("this looks like a SystemOne request: POST it to /v1/system_one, or as a line of a bulk job here "
                "(Content-Type application/jsonl, one request a line)")
    if keys & ROW_KEYS:
        return f"this looks like a row: {ROWS_HOW}"
    return None


def jsonl_hint(body: bytes) -> str | None:
    """What to do instead when a body that is not one JSON document is JSONL (its first line is a JSON
    object): POST it to /v1/batches. None otherwise."""
    first, _, rest = body.strip().partition(b"\n")
    if not rest.strip():
        return None
    try:
        obj = json.loads(first)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    return "this looks like JSONL (one request a line): POST it to /v1/batches with Content-Type application/jsonl"


def unify_error_schemas(schema: dict[str, Any]) -> None:
    """Point the 422 FastAPI declares by itself on every operation with parameters (its
    HTTPValidationError schema, which the route never answers) at the Error schema, as every other
    error response is, and drop FastAPI's validation schemas."""
    components = schema.get("components", {}).get("schemas", {})
    for methods in schema.get("paths", {}).values():
        for operation in methods.values():
            response = operation.get("responses", {}).get("422", {})
            content = response.get("content", {}).get("application/json", {})
            if content.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
                content["schema"] = {"$ref": "#/components/schemas/Error"}
                response["description"] = ("a query or path parameter out of bounds (invalid_request: `param` "
                                           "names it, the message its rule and the value given)")
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
