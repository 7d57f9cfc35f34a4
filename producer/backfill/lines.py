"""A backfill's input line: the id it is answered, resumed and de-duplicated under (`line_id`), and
the error lines written for a request refused at once (`error_line`) or for a row in flight that
will get no answer (`lost_line`: timeout, result_expired), each in the shape of its request."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from vela2.api.schemas import Status, error_result, guess_id_task
from vela2.api.systemone import SYSTEM_ONE_VERSION, error_answer, is_system_one
from vela2.wire.keys import id_problem
from vela2.wire.messages import request_id


@dataclass
class Pending:
    """A row in flight: what its timeout line needs, and when it was queued."""

    task: str | None
    system_one: bool
    submitted_at: float


def line_id(lineno: int, raw: bytes, obj: Any) -> str:
    """The id line `lineno` is answered, resumed and de-duplicated under: the request's own id (or
    its content id, `request_id`); for a line with no id it can be answered under (not JSON, not an
    object, or an id that cannot name a request: `id_problem`, e.g. a lone surrogate UTF-8 cannot
    write to OUT) `line-<N>-<12 hex digits of the hash of its bytes>`. The hash is what keeps it from
    being a caller's id: with a plain `line-<N>`, a real row called `line-1` after a bad line 1 was
    taken for a duplicate of it, and skipped by every rerun as already in OUT. It is stable from run
    to run of the same IN, so a rerun skips the bad line's own error line."""
    if isinstance(obj, dict):
        rid = request_id(obj)
        if id_problem(rid) is None:
            return rid
    return f"line-{lineno}-{hashlib.sha256(raw.strip()).hexdigest()[:12]}"


def error_line(obj: Any, rid: str, exc: BaseException) -> dict[str, Any]:
    """The error line of a request: a SystemOne error answer, else an error RowResult (its task as
    predict() gives a refused request's, `guess_id_task`: escaped where UTF-8 cannot encode it)."""
    if is_system_one(obj):
        return {**error_answer(obj, exc), "id": rid}
    return error_result(rid, guess_id_task(obj)[1], exc).to_json_dict()


def lost_line(rid: str, pending: Pending, model: str, code: str, message: str) -> dict[str, Any]:
    """The error line of a row in flight that will get no answer (timeout, result_expired), in the
    shape of its request: a SystemOne error answer, else an error RowResult."""
    err = {"type": code, "message": message}
    if pending.system_one:
        return {"version": SYSTEM_ONE_VERSION, "model": model, "id": rid, "status": Status.error.value, "error": err}
    out: dict[str, Any] = {"id": rid, "task": pending.task, "status": Status.error.value, "error": err}
    return out if pending.task is not None else {k: v for k, v in out.items() if k != "task"}
