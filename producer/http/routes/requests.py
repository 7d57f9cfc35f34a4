"""POST /v1/system_one: a SystemOne request (JSON body), validated here, queued on the model's online
queue and awaited up to ``wait_s``; the answer, or 202 with where to read it (producer.http.app
lists every status code). The request id is an idempotency key: the same request under an id that
has an answer gets it back without being queued again; other content under an id that is answered
or pending gets 409 (``id_conflict``).

``wait_s`` is bounded and described by the app's settings (``--max-wait-s``, ``--timeout-s``), so its
query parameters are declared per app: `query_parameters(settings)` is a dependency the app puts on
this router when it includes it; it leaves what it read on the request (``request.state``) for the
handler.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from producer.http.body import receive_body
from producer.http.deps import Shared, Tenant
from producer.http.errors import form_hint, jsonl_hint
from producer.http.models import Pending
from producer.http.responses import ANSWER_RESPONSES, declared, error, gone, pending, result_url, stored_answer
from producer.http.settings import Settings
from producer.prepare import prepare_request
from vela2.api.systemone import parse_request
from vela2.config import LIMITS
from vela2.errors import (
    CellUnavailable,
    IdConflict,
    InvalidRequest,
    ModelMismatch,
    NoWorker,
    QuotaExceeded,
    ResultExpired,
    StoreFull,
    Vela2Error,
)

router = APIRouter()


@dataclass(frozen=True)
class SubmitQuery:
    """The query parameters of POST /v1/system_one, as read and checked."""

    wait_s: float | None  # None: the app's timeout_s
    deadline_s: float | None


def query_parameters(settings: Settings) -> Callable[..., None]:
    """The dependency declaring POST /v1/system_one's query parameters with this app's bounds (they
    are in its OpenAPI document, and FastAPI refuses a value out of them: 422); it sets
    ``request.state.submit_query``, a SubmitQuery, for the handler."""

    def declare(
        request: Request,
        wait_s: float | None = Query(
            None, ge=0, le=settings.max_wait_s,
            description=f"seconds to wait for the answer (default {settings.timeout_s:g})",
        ),
        deadline_s: float | None = Query(
            None, gt=0, le=LIMITS.max_deadline_s,
            description="after this many seconds unscored, the worker answers expired (410)",
        ),
    ) -> None:
        request.state.submit_query = SubmitQuery(wait_s, deadline_s)

    return declare


def read_system_one(body: bytes, model: str) -> tuple[Any, JSONResponse | None]:
    """A POSTed body as (request object, None) once it is valid JSON and a valid SystemOne request
    for `model` within every limit checked at submit (producer.prepare.prepare_request), else
    (the object or None, the error response: 400 not JSON / nested too deeply / another model, 422
    invalid or over a limit; a body of another route's form gets a hint saying where it goes)."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        return None, error(400, InvalidRequest(f"request body is not valid JSON: {e}"), hint=jsonl_hint(body))
    except RecursionError:
        return None, error(400, InvalidRequest("request body is not valid JSON: nested too deeply"))
    try:
        parsed = parse_request(obj)
        if parsed.model != model:
            raise ModelMismatch(f"request names model {parsed.model!r}; this route serves {model!r}")
        prepare_request(obj, model)
    except ModelMismatch as e:
        return obj, error(400, e, obj)
    except Vela2Error as e:
        return obj, error(422, e, obj, hint=form_hint(obj, "/v1/system_one"))
    except RecursionError:
        return obj, error(400, InvalidRequest("request is nested too deeply"), obj)
    return obj, None


@router.post(
    "/v1/system_one",
    summary="Score a SystemOne request",
    responses={
        **ANSWER_RESPONSES,
        202: {"model": Pending, "description": "queued; not answered in wait_s (the wait ran out: poll result_url)"},
        408: declared("the body did not arrive within --body-timeout-s"),
        503: declared("redis is unreachable; or no worker of the model has beaten for the grace period (no_worker: "
                      "the request stays queued, the Location header and the hint say where to read it)"),
        429: declared("the tenant's requests_per_s or queued quota (quota_exceeded: the quota, its limit and the "
                      "usage; Retry-After), or every Redis connection stayed busy (busy; Retry-After)"),
        507: declared("Redis refuses writes for memory (store_full), or the tenant's stored results hold its "
                      "stored_bytes quota (quota_exceeded; Retry-After): nothing was queued"),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SystemOneRequest"}}},
        }
    },
)
async def post_system_one(request: Request, tenant: Tenant, state: Shared) -> JSONResponse:
    query: SubmitQuery = request.state.submit_query  # set by query_parameters, checked by FastAPI
    settings = state.settings
    body = await receive_body(request, LIMITS.max_message_bytes, settings.body_timeout_s)
    if isinstance(body, JSONResponse):
        return body
    # parsed and validated in a thread: 8 MB of JSON takes seconds, which would stall every
    # other caller's request on this event loop
    obj, refused = await asyncio.to_thread(read_system_one, body, settings.model)
    if refused is not None:
        return refused
    # the tenant's stored bytes, tokens and request rate, checked before anything is written (quota_exceeded)
    quotas = getattr(request.state, "quotas", None)
    await state.usage.check([r for _, r in state.redises()], tenant or "", quotas)
    await state.take_rate(tenant, quotas)
    try:
        # queued unless its id is answered already (then the answer below comes at once), and
        # refused when the id names a request with other content (answered or pending), or when the
        # tenant's queue holds its `queued` quota already; validated above already (read_system_one)
        rid = await state.client(tenant).submit(obj, deadline_s=query.deadline_s, validate=False,
                                                max_queued=quotas.queued if quotas is not None else None)
    except (QuotaExceeded, CellUnavailable):
        raise  # 429 quota_exceeded, 503 cell_unavailable (the app's handlers)
    except IdConflict as e:
        return error(409, e, obj)
    except StoreFull as e:  # Redis is up and refuses writes (maxmemory): not "unreachable"
        return error(507, e, obj)
    except Vela2Error as e:  # over the message size once wrapped
        return error(422, e, obj)
    wait = settings.timeout_s if query.wait_s is None else query.wait_s
    try:
        answer = await state.client(tenant).answer(rid, timeout_s=wait)
    except NoWorker as e:  # queued, and no worker would answer it now: 503 (wait_s=0 looks once: 202)
        url = result_url(request, rid)
        response = error(503, e, obj, hint=f"it stays queued: read it later at {url}")
        response.headers["Location"] = url
        return response
    except TimeoutError:
        return pending(request, rid)
    except ResultExpired as e:  # answered and expired within the wait: result_expires is tiny
        return gone(settings.model, rid, e)
    return stored_answer(answer)
