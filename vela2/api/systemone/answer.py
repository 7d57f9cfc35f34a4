"""The SystemOne answer: its pydantic models, the answer mapped 1:1 from the row result of
`to_row(request)` (every number copied, never recomputed), and the error answer of a request that
could not be answered."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from vela2.api.schemas import ErrorInfo, ModelInfo, RowResult, SpanOut, Status, Units, content_id, printable
from vela2.api.systemone.request import SYSTEM_ONE_VERSION, Kind, SystemOneRequest
from vela2.config import LIMITS
from vela2.errors import Vela2Error


class TaskAnswer(BaseModel):
    """The answer to one task: the row answer's fields, copied as predict() returned them."""

    kind: Kind
    probs: dict[str, float]  # choice/score/classify: softmax over options; set: sigmoid; span: max over words
    decision: str | list[str] | None = None  # choice/score/single classify: str; set/multi classify: list
    abstain_probability: float | None = None  # choice / score / single-label classify
    expected: float | None = None  # score with numeric options
    spans: list[SpanOut] | None = None  # span / extract; `field` set when the input is a JSON object
    gate_fired: bool | None = None  # PII span tasks (names matching the calibration's PII patterns)
    units: Units | None = None  # span / extract when asked; offsets index render_input(input)[0]
    logits: list[float] | None = None  # raw option logits, only when a caller's row asked for them


class SystemOneAnswer(BaseModel):
    """The answer to one SystemOne request (ok: `tasks`; error / expired / cancelled: `error`)."""

    version: Literal["1"]  # always present in an answer
    model: str | None = None  # the model named by the request (None if the request had no string model)
    id: str
    status: Status
    tasks: dict[str, TaskAnswer] | None = None  # task name -> answer, in request order
    timings: dict[str, float] | None = None  # queue_ms / render_ms / model_ms / decode_ms of the row
    error: ErrorInfo | None = None
    served_by: ModelInfo | None = None  # the model that answered (name, checkpoint digest, precision, mode)


def to_answer(request: SystemOneRequest, row_result: RowResult) -> dict[str, Any]:
    """Map the row result of `to_row(request)` to the SystemOne answer dict, 1:1 (numbers copied).

    Raises Vela2Error when the result does not fit the request (a wrong answer count or task key).
    """
    base: dict[str, Any] = {"version": SYSTEM_ONE_VERSION, "model": request.model, "id": request.id}
    if row_result.status != Status.ok:
        out = {**base, "status": row_result.status.value}
        if row_result.error is not None:
            out["error"] = row_result.error.model_dump(mode="json")
        if row_result.timings is not None:
            out["timings"] = dict(row_result.timings)
        return out
    answers = row_result.answers or []
    if len(answers) != len(request.tasks):
        raise Vela2Error(f"row result has {len(answers)} answers for {len(request.tasks)} tasks")
    tasks: dict[str, Any] = {}
    for i, task in enumerate(request.tasks):
        answer = next((a for a in answers if a.question == i), None)
        if answer is None or answer.task != task.row_task:
            got = None if answer is None else answer.task
            raise Vela2Error(f"row result has no answer {task.row_task!r} for question {i}; got {got!r}")
        # The same dump RowResult.to_json_dict() makes, so every number is predict()'s own float.
        copied = answer.model_dump(mode="json", exclude_none=True)
        del copied["question"], copied["task"]
        tasks[task.name] = {"kind": task.kind, **copied}
    out = {**base, "status": Status.ok.value, "tasks": tasks}
    if row_result.timings is not None:
        out["timings"] = dict(row_result.timings)
    if row_result.served_by is not None:
        out["served_by"] = row_result.served_by.model_dump(mode="json")
    return out


def error_answer(obj: Any, exc: BaseException) -> dict[str, Any]:
    """The error answer of a request that could not be answered (`obj` as sent, or parsed)."""
    model: str | None
    if isinstance(obj, SystemOneRequest):
        model, rid = obj.model, obj.id
    else:
        raw = obj if isinstance(obj, dict) else {}
        model = printable(raw["model"]) if isinstance(raw.get("model"), str) else None
        rid = raw.get("id")
        if not isinstance(rid, str) or not rid:
            # The id parse_request would have given it, so a client can match the error to its request.
            rest = {k: v for k, v in raw.items() if k != "id"} if isinstance(obj, dict) else repr(obj)
            rid = content_id(rest)
        # Cut at the limit, characters UTF-8 cannot encode escaped: the answer is always valid JSON.
        rid = printable(rid)[: LIMITS.max_id_chars]
    code = exc.code if isinstance(exc, Vela2Error) else type(exc).__name__
    return {
        "version": SYSTEM_ONE_VERSION,
        "model": model,
        "id": rid,
        "status": Status.error.value,
        "error": {"type": code, "message": str(exc)},
    }
