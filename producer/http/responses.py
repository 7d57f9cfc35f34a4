"""The responses the routes share: the one error envelope (`error_body`, `error_response`, `error`,
`unavailable`; `stored_answer` for a stored answer, which is in it too when it is not ok), a request
not answered yet (`pending`: 202 with where to read it, `result_url`) or whose answer expired (`gone`:
410), and the OpenAPI descriptions of the answers of a SystemOne request (`ANSWER_RESPONSES`).

Every error answer of the route, whatever its route and status, is one envelope (the schema
producer.http.models.Error): OpenAI's error object, so that the openai SDK reads it, inside the
SystemOne error answer::

    {"version": "1", "model": ..., "id": ..., "status": "error",
     "error": {"type": ..., "message": ..., "param": ..., "code": ..., "hint": ...}}

`type` (= `code`) names the error, `param` the parameter or field at fault (or null), `hint` (only
when there is one) what to do instead; `model` / `id` those of the request (null when none was named).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import JSONResponse

from producer.answers import http_status
from producer.brokers import NotReplicated
from producer.http.models import Error, ErrorDetail, Pending
from vela2.api.schemas import Status
from vela2.api.systemone import SystemOneAnswer, error_answer
from vela2.errors import ResultExpired, Vela2Error

DOT_SEGMENTS = (".", "..")  # ids a path cannot carry: clients resolve them before sending (RFC 3986)
# The hint of an answer whose request's own deadline_s passed unscored: the same id (or, without one,
# the same content, whose content id is its id) gets this stored answer back until it expires.
EXPIRED_HINT = ("to have it scored, send it again under a new id with a longer deadline_s (or none): its id gets "
                "this answer back until the answer expires")


def result_url(request: Request, rid: str) -> str:
    """Where the answer of `rid` is read: /v1/results/<id percent-encoded> (an id may hold any
    character, "/" included; a header is latin-1), or /v1/results?id=<id> for "." and ".."."""
    if rid in DOT_SEGMENTS:
        return str(request.url_for("get_result_by_query").include_query_params(id=rid))
    return str(request.url_for("get_result", request_id=quote(rid, safe="")))


def error_body(kind: str, message: str, *, param: str | None = None, hint: str | None = None,
               model: str | None = None, rid: str | None = None) -> dict[str, Any]:
    """The envelope of one error of type `kind`: a `hint` ends the message too (a client may show only
    the message), and is left out when there is none."""
    message = message if hint is None else f"{message}; {hint}"
    detail = ErrorDetail(type=kind, message=message, param=param, code=kind, hint=hint)
    body = Error(model=model, id=rid, error=detail).model_dump(mode="json")
    if hint is None:
        del body["error"]["hint"]
    return body


def error_response(http_status: int, kind: str, message: str, param: str | None = None, *, hint: str | None = None,
                   model: str | None = None, rid: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An error answer with `http_status` (`error_body`)."""
    body = error_body(kind, message, param=param, hint=hint, model=model, rid=rid)
    return JSONResponse(body, status_code=http_status, headers=headers)


def in_envelope(answer: dict[str, Any], *, param: str | None = None, hint: str | None = None) -> dict[str, Any]:
    """A SystemOne answer that is not ok (it has `error` {type, message}) with its error object in the
    envelope: `param` and `code` (= type) added, and `hint` when there is one (at the message's end too)."""
    err = dict(answer.get("error") or {})
    err.setdefault("param", param)
    err.setdefault("code", err.get("type"))
    if hint is not None:
        err["hint"] = hint
        err["message"] = f"{err.get('message', '')}; {hint}"
    return {**answer, "error": err}


def error(http_status: int, exc: BaseException, obj: Any = None, *, param: str | None = None,
          hint: str | None = None) -> JSONResponse:
    """An error answer with `http_status`: the SystemOne error answer of `obj` when the request was a
    JSON object, else one with no id and model (its type the error's code, or invalid_request)."""
    if isinstance(obj, dict):
        return JSONResponse(in_envelope(error_answer(obj, exc), param=param, hint=hint), status_code=http_status)
    kind = exc.code if isinstance(exc, Vela2Error) else "invalid_request"
    return error_response(http_status, kind, str(exc), param=param, hint=hint)


def stored_answer(answer: dict[str, Any]) -> JSONResponse:
    """A stored answer with its HTTP status (producer.answers.http_status); one that is not ok in
    the error envelope (an expired one with what to do)."""
    status = http_status(answer)
    if status >= 400 and isinstance(answer.get("error"), dict):
        answer = in_envelope(answer, hint=EXPIRED_HINT if answer.get("status") == Status.expired else None)
    return JSONResponse(answer, status_code=status)


def unavailable(exc: BaseException) -> JSONResponse:
    """503: Redis is unreachable, or did not accept a submission on enough replicas."""
    # NotReplicated: Redis answered, but fewer replicas than --wait-replicas hold the submission
    why = "not accepted" if isinstance(exc, NotReplicated) else "redis is unreachable"
    return error_response(503, "unavailable", f"{why}: {exc}")


ERROR: dict[str, Any] = {"model": Error}  # an error response in the OpenAPI document: the one Error schema


def declared(description: str) -> dict[str, Any]:
    """An error response of an operation in the OpenAPI document, with its description."""
    return {**ERROR, "description": description}


EXPIRED_410 = ("the request will never be scored: its own deadline_s passed first (status expired, error.type "
               "expired; send it again under a new id), or it was answered and the answer expired from the "
               "result store (result_expired; POST the request again to score it anew)")

ANSWER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": SystemOneAnswer, "description": "answered"},
    400: declared("body is not JSON, or the request names another model"),
    401: declared("no API key, or an unknown one (error.type unauthorized)"),
    403: declared("the API key may not use this model (error.type forbidden)"),
    409: declared("the id already names a request with other content (id_conflict), or the request was "
                  "cancelled before a worker started it (status cancelled)"),
    410: declared(EXPIRED_410),
    413: declared("body over the message size limit"),
    422: declared("invalid request (the message names the field, limit and value; a hint when the body is "
                  "of another route's form)"),
    500: declared("the worker failed on this request (e.g. model_error)"),
    503: declared("redis is unreachable"),
    507: declared("Redis refuses writes for memory (store_full): nothing was queued"),
}


def pending(request: Request, rid: str) -> JSONResponse:
    """202: `rid` is queued and not answered yet; poll its result_url (also the Location header)."""
    url = result_url(request, rid)
    return JSONResponse(
        Pending(id=rid, result_url=url).model_dump(mode="json"), status_code=202, headers={"Location": url}
    )


def gone(model: str, rid: str, exc: ResultExpired) -> JSONResponse:
    """410: `rid` was answered, and its answer has expired from the result store."""
    return error_response(410, exc.code, str(exc), model=model, rid=rid)
