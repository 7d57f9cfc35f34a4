"""GET /v1/results/{id} and GET /v1/results?id=: the stored answer of a request (200, or the answer's
own status code: 410 for one whose deadline_s passed unscored); 202 while one submitted by a tracking
producer is pending; 410 once it was answered and its answer has expired from the result store; 404
(not_found) for an id never submitted by a tracking producer. One MGET per GET (the result and the
submitted marker together)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from starlette.convertors import Convertor, register_url_convertor

from producer.answers import result_expired_error
from producer.http.deps import Shared, Tenant
from producer.http.models import Pending
from producer.http.responses import ANSWER_RESPONSES, declared, error_response, gone, pending, stored_answer
from vela2.errors import InvalidRequest

router = APIRouter()


class _AnyId(Convertor[str]):
    """A path parameter holding any id: Starlette's "path" is ".*", which stops at a line break, and
    its route's "$" matches before a final one, so /v1/results/k%0A read the answer of "k"."""

    regex = "[\\s\\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("any_id", _AnyId())

GET_RESULT_RESPONSES: dict[int | str, dict[str, Any]] = {
    **{k: v for k, v in ANSWER_RESPONSES.items() if k != 413},  # a stored answer may be any error but 413
    202: {"model": Pending, "description": "submitted, not answered yet"},
    429: declared("every Redis connection stayed busy (busy; Retry-After)"),
    404: declared("unknown id (not_found: never submitted by a tracking producer)"),
}


@router.get(
    "/v1/results/{request_id:any_id}",  # an id may hold "/" and line breaks (see _AnyId)
    name="get_result",
    summary="The answer of a submitted request",
    responses=GET_RESULT_RESPONSES,
)
async def get_result(request: Request, request_id: str, tenant: Tenant, state: Shared) -> JSONResponse:
    try:
        found, answer = await state.client(tenant).lookup(request_id)  # one MGET: result and marker together
    except InvalidRequest as e:  # an id no request can have (over the limit): unknown, and why
        return error_response(404, "not_found", f"no request {request_id[:80]!r} is known: {e}",
                              model=state.settings.model)
    if answer is not None:
        return stored_answer(answer)
    if found == "expired":
        return gone(state.settings.model, request_id, result_expired_error(request_id))
    if found == "pending":
        return pending(request, request_id)
    return error_response(404, "not_found", f"no request {request_id!r} is known: never submitted by a tracking "
                          "producer", model=state.settings.model, rid=request_id)


@router.get(
    "/v1/results",
    name="get_result_by_query",
    summary="The answer of a submitted request, its id as a query parameter",
    description="The same as GET /v1/results/{request_id}, for ids a path cannot carry: `.` and `..` "
    "(clients resolve them as path segments before sending); the result_url of such an id is this form.",
    responses=GET_RESULT_RESPONSES,
)
async def get_result_by_query(
    request: Request, id: Annotated[str, Query(min_length=1)], tenant: Tenant, state: Shared
) -> JSONResponse:
    return await get_result(request, id, tenant, state)
