"""What a read gives back besides a stored answer: the error of an id whose answer expired from the
result store before it was read (raised by the waits on one id; a stand-in result in the waits on
many), and the HTTP status of a stored answer (the HTTP route's table; OpenAI-batch output lines
carry it too). No celery, no torch.
"""

from __future__ import annotations

from typing import Any

from vela2.api.schemas import RowResult, Status, error_result
from vela2.errors import InvalidRequest, LimitExceeded, ModelMismatch, ResultExpired

RESULT_EXPIRED = ResultExpired.code  # the error.type of an expired id in results_many / answers_many
REQUEST_ERROR_TYPES = {InvalidRequest.code, LimitExceeded.code}  # the caller's fault -> 422


def result_expired_error(request_id: str) -> ResultExpired:
    """The error of an id whose answer expired from the result store before it was read."""
    return ResultExpired(
        f"the answer to {request_id!r} expired from the result store (result_expires) before it was read; "
        "submit the request again to score it anew"
    )


def expired_row(request_id: str) -> RowResult:
    """The stand-in results_many returns for an expired id: status "error", type "result_expired"."""
    return error_result(request_id, None, result_expired_error(request_id))


def expired_answer(request_id: str) -> dict[str, Any]:
    """The stand-in answers_many returns for an expired id (the RowResult dict of `expired_row`)."""
    return expired_row(request_id).to_json_dict()


def http_status(answer: dict[str, Any]) -> int:
    """The HTTP status of a stored answer (producer.http.app's table; OpenAI-batch output lines carry it)."""
    status = answer.get("status")
    if status == Status.ok:
        return 200
    if status == Status.expired:
        # the caller's own deadline_s passed before a worker scored it: the request will never be
        # scored (410 Gone, as an answer expired from the result store); not a server error (5xx)
        return 410
    if status == Status.cancelled:
        return 409
    code = (answer.get("error") or {}).get("type")
    if code == ModelMismatch.code:
        return 400
    return 422 if code in REQUEST_ERROR_TYPES else 500
