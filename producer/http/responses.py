"""The responses the routes share: an error answer (`error`, `unavailable`), a request not answered
yet (`pending`: 202 with where to read it, `result_url`) or whose answer expired (`gone`: 410), and the
OpenAPI descriptions of the answers of a SystemOne request (`ANSWER_RESPONSES`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import JSONResponse

from producer.brokers import NotReplicated
from producer.http.models import ErrorAnswer, Pending
from vela2.api.schemas import ErrorInfo
from vela2.api.systemone import SystemOneAnswer, error_answer
from vela2.errors import ResultExpired, Vela2Error

DOT_SEGMENTS = (".", "..")  # ids a path cannot carry: clients resolve them before sending (RFC 3986)


def result_url(request: Request, rid: str) -> str:
    """Where the answer of `rid` is read: /v1/results/<id percent-encoded> (an id may hold any
    character, "/" included; a header is latin-1), or /v1/results?id=<id> for "." and ".."."""
    if rid in DOT_SEGMENTS:
        return str(request.url_for("get_result_by_query").include_query_params(id=rid))
    return str(request.url_for("get_result", request_id=quote(rid, safe="")))


def error(http_status: int, exc: BaseException, obj: Any = None) -> JSONResponse:
    """An error answer with `http_status`: the SystemOne error answer of `obj` when the request was a
    JSON object, else one with no id and model (its type the error's code, or invalid_request)."""
    body = (
        error_answer(obj, exc)
        if isinstance(obj, dict)
        else ErrorAnswer(
            error=ErrorInfo(type=exc.code if isinstance(exc, Vela2Error) else "invalid_request", message=str(exc))
        ).model_dump(mode="json")
    )
    return JSONResponse(body, status_code=http_status)


def unavailable(exc: BaseException) -> JSONResponse:
    """503: Redis is unreachable, or did not accept a submission on enough replicas."""
    # NotReplicated: Redis answered, but fewer replicas than --wait-replicas hold the submission
    why = "not accepted" if isinstance(exc, NotReplicated) else "redis is unreachable"
    info = ErrorInfo(type="unavailable", message=f"{why}: {exc}")
    return JSONResponse(ErrorAnswer(error=info).model_dump(mode="json"), status_code=503)


ANSWER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": SystemOneAnswer, "description": "answered"},
    400: {"model": ErrorAnswer, "description": "body is not JSON, or the request names another model"},
    401: {"model": ErrorAnswer, "description": "no API key, or an unknown one (error.type unauthorized)"},
    403: {"model": ErrorAnswer, "description": "the API key may not use this model (error.type forbidden)"},
    409: {"model": ErrorAnswer, "description": "the id already names a request with other content (id_conflict)"},
    413: {"model": ErrorAnswer, "description": "body over the message size limit"},
    422: {"model": ErrorAnswer, "description": "invalid request (the message names the field, limit and value)"},
    500: {"model": SystemOneAnswer, "description": "the worker failed on this request"},
    503: {"model": ErrorAnswer, "description": "redis is unreachable"},
    507: {"model": ErrorAnswer, "description": "Redis refuses writes for memory (store_full): nothing was queued"},
    504: {"model": SystemOneAnswer, "description": "expired: the deadline passed before it was scored"},
}


def pending(request: Request, rid: str) -> JSONResponse:
    """202: `rid` is queued and not answered yet; poll its result_url (also the Location header)."""
    url = result_url(request, rid)
    return JSONResponse(
        Pending(id=rid, result_url=url).model_dump(mode="json"), status_code=202, headers={"Location": url}
    )


def gone(model: str, rid: str, exc: ResultExpired) -> JSONResponse:
    """410: `rid` was answered, and its answer has expired from the result store."""
    info = ErrorInfo(type=exc.code, message=str(exc))
    return JSONResponse(ErrorAnswer(model=model, id=rid, error=info).model_dump(mode="json"), status_code=410)


OPENAI_ERROR = {"content": {"application/json": {"schema": {"type": "object", "properties": {"error": {
    "type": "object", "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                     "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}}}}


def openai_error(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    """An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}} (type = code)."""
    return JSONResponse({"error": {"message": message, "type": code, "param": param, "code": code}},
                        status_code=status)
