"""A bulk job's input line as the request it queues, or as the answer it gets at once: a line that
cannot be queued (not JSON, no object, an invalid request, a bad custom_id, over the message size)
gets its error answer kept in the job's ids entry (`invalid_answer`; no stored result); a line read
after the job was cancelled is answered `cancelled` (`cancelled_meta`), stored in the worker's shapes
(vela2.wire.results)."""

from __future__ import annotations

from typing import Any

from producer.prepare import prepare_request
from vela2.api.schemas import cancelled_result, error_result, guess_id_task
from vela2.api.systemone import error_answer, is_system_one, parse_request, to_answer
from vela2.config import LIMITS
from vela2.errors import InvalidRequest, Vela2Error
from vela2.wire.jobs import KIND_OPENAI, KIND_ROW
from vela2.wire.keys import id_problem, queue_name
from vela2.wire.messages import build_message, decode_json, request_id
from vela2.wire.results import row_meta

ERROR_MESSAGE_CHARS = 300  # an invalid line's error message is cut to this in its job's ids entry
_SIZE_CHECK_SLACK = 1024  # lines longer than max_message_bytes minus this get an exact size check


def parse_line(raw: bytes, lineno: int, model: str) -> tuple[str, str, Any, Vela2Error | None]:
    """One input line -> (kind, caller's id, request (with its id) or the raw object, error or None):
    a row or a SystemOne request (kind KIND_ROW), or an OpenAI-batch line (KIND_OPENAI: its
    `custom_id` is the caller's id, its `body` the request)."""
    try:
        # refused by name: not JSON, not UTF-8, nested deeper than MAX_JSON_DEPTH (was a RecursionError)
        obj: Any = decode_json(raw, f"line {lineno}")
    except InvalidRequest as e:
        return KIND_ROW, f"line-{lineno}", None, e
    kind = KIND_ROW
    if isinstance(obj, dict) and "custom_id" in obj:
        kind, cid, body = KIND_OPENAI, obj["custom_id"], obj.get("body")
        problem = id_problem(cid)
        if problem:
            return kind, f"line-{lineno}", body, InvalidRequest(f"line {lineno}: custom_id {problem}")
        if not isinstance(body, dict):
            return kind, cid, body, InvalidRequest(
                f"line {lineno}: body must be a JSON object (a row or a SystemOne request); got {type(body).__name__}")
        obj = body
    if not isinstance(obj, dict):
        return kind, f"line-{lineno}", obj, InvalidRequest(
            f"line {lineno}: a request must be a JSON object; got {type(obj).__name__}")
    caller = cid if kind == KIND_OPENAI else request_id(obj)
    if id_problem(caller):  # an id the request is refused for (prepare_request says why), e.g. a lone
        # surrogate: kept as predict() keeps a refused request's (escaped, cut), so Redis and the
        # output (UTF-8) can hold it
        caller = guess_id_task(obj)[0]
    try:
        _, obj = prepare_request(obj, model)
        if len(raw) > LIMITS.max_message_bytes - _SIZE_CHECK_SLACK:
            build_message([obj], queue_name(model), chunk=True)  # exact check, only for huge lines
    except Vela2Error as e:
        return kind, caller, obj, type(e)(f"line {lineno}: {e}")
    return kind, caller, obj, None


def invalid_answer(wire: str, obj: Any, exc: BaseException) -> dict[str, Any]:
    """The error answer of a line refused at once, as its job's ids entry keeps it (vela2.wire.jobs.
    invalid_entry): the worker's shapes (the SystemOne error answer, else the row's error result,
    the task as the worker gives a refused request's: `guess_id_task`), the message cut to
    ERROR_MESSAGE_CHARS."""
    answer = ({**error_answer(obj, exc), "id": wire} if is_system_one(obj)
              else error_result(wire, guess_id_task(obj)[1], exc).to_json_dict())
    message = answer["error"]["message"]
    if len(message) > ERROR_MESSAGE_CHARS:
        answer["error"]["message"] = message[: ERROR_MESSAGE_CHARS - 3] + "..."
    return answer


def cancelled_meta(wire: str, obj: Any) -> dict[str, Any]:
    """The stored meta of a line the submitter answers `cancelled` (the job was cancelled first)."""
    task = obj.get("task") if isinstance(obj, dict) and isinstance(obj.get("task"), str) else None
    res = cancelled_result(wire, task, "the job was cancelled before this line was queued")
    return row_meta(wire, res, to_answer(parse_request(obj), res) if is_system_one(obj) else None)
