"""SystemOne requests: the product API over the row-level model (versioned pydantic schema).

A SystemOne request names the model, gives one `input` (free text, or a JSON object of named
string fields) and a list of named `tasks`. It is answered by exactly ONE bundled vela2 row: every
task becomes one question block over the same text (one sequence, the text as a shared prefix),
so the answer maps 1:1 from `vela2.predict()` outputs: the numbers are copied, never recomputed.

Kinds and what they become in the row (the block's task key is ``"<type>:<task name>"``, so the
task name selects per-task calibration: temperatures, thresholds, PII rules for ``pii*`` names):

=========  ==============  =======================================================================
kind       row type        notes
=========  ==============  =======================================================================
choice     choice          ``options`` (>= 2); decision = argmax; ``abstain_probability``
score      score           ordinal ``options`` (>= 2); adds ``expected`` when options are numeric
set        set             ``options`` (>= 1); decision = list of options above the threshold
span       span            ``labels`` (>= 1); ``fields`` may restrict it to some input fields
classify   choice | set    open-label: only ``labels`` (and ``multi_label``). Single-label by
                           default: a choice block over the labels (>= 2; decision = the argmax
                           label). ``"multi_label": true``: a set block over the labels (>= 1;
                           decision = every label above the set threshold, possibly none).
extract    span            open-label: only ``labels`` (and ``fields``); decoded like span
=========  ==============  =======================================================================

Question text: the task's ``question``, else ``calibration.default_questions[kind]``. The
open-label kinds take no ``question`` at all: they always use the GLiNER2-style defaults kept in
calibration.json under ``default_questions["classify"]`` / ``["extract"]`` (export defaults,
e.g. "Which of these labels describe the text?" / "Extract all entities of these types from the
text."); a checkpoint may override them in its calibration.json.

JSON input: the fields are rendered in the given key order into one text; each field is a header
line ``"<name>:\\n"`` followed by the field's own string, fields separated by ``"\\n\\n"``. The row
carries the field character ranges (header excluded) as ``Row.fields``; span blocks carry the
task's ``fields`` (default: all fields). Spans are decoded inside fields only and every span in
the answer carries ``field`` and offsets into that field's own string, so
``input[field][start:end] == text``. Free-text input has no fields; offsets index the input.

Limits (``vela2.config.LIMITS``; over a limit -> ``limit_exceeded``): ``max_tasks`` tasks,
``max_fields`` input fields, ``max_options`` options, ``max_labels`` labels (a single-label
classify also needs its labels within ``max_options``), ``max_item_chars`` per option / label,
``max_question_chars`` per question, ``max_id_chars`` per id, ``max_text_chars`` for the rendered
input (headers included), ``max_text_words`` words after rendering.

Bad requests (unknown kind, empty labels, a field not in the input, duplicate task names, a
non-string field value, too many tasks / labels, a wrong model name, a string that is not valid
Unicode such as a lone surrogate, e.g. ``tasks[0].labels[1] is not valid Unicode (lone surrogate
at index 3)``...) become an error answer
``{"version", "model", "id", "status": "error", "error": {"type", "message"}}``; a message
names the place (``tasks[2] 'pii'``), the problem, and the limit and value where there is one.

Schema files: ``python -m vela2.api.systemone --write-schemas`` writes
``schemas/systemone.request.schema.json`` and ``schemas/systemone.answer.schema.json``; a test
fails when they are stale. This module imports no torch (the producer and HTTP route use it);
`system_one_request` imports the predict() path (`vela2.scoring.predict`) only when called.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vela2.api.schemas import (
    ErrorInfo,
    FieldRange,
    ModelInfo,
    Question,
    Row,
    RowResult,
    SpanOut,
    Status,
    Units,
    check_id,
    check_unicode,
    content_id,
    parse_row,
    printable,
    validation_error,
)
from vela2.config import LIMITS
from vela2.errors import InvalidRequest, LimitExceeded, ModelMismatch, Vela2Error
from vela2.model.calibration import Calibration

logger = logging.getLogger(__name__)

SYSTEM_ONE_VERSION: Final = "1"
KINDS = ("choice", "score", "set", "span", "classify", "extract")
OPTION_KINDS = ("choice", "score", "set")  # take `options`
SPAN_KINDS = ("span", "extract")  # may take `fields`; answers carry `spans`
OPEN_LABEL_KINDS = ("classify", "extract")  # no `question`: the calibration's default text
MAX_TASK_NAME_CHARS = 128  # same bound as a row task's name
FIELD_SEPARATOR = "\n\n"  # between two rendered fields
SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"
SCHEMA_FILES = {
    "request": "systemone.request.schema.json",
    "answer": "systemone.answer.schema.json",
}

Kind = Literal["choice", "score", "set", "span", "classify", "extract"]


def _header(name: str) -> str:
    """The header line that opens a rendered field."""
    return f"{name}:\n"


def _check_items(items: list[str], what: str, where: str, minimum: int, maximum: int) -> None:
    """Count, length and uniqueness of a task's options / labels; messages name the task."""
    if not items:
        raise InvalidRequest(f"{where}: {what} is empty; give at least {minimum}")
    if len(items) < minimum:
        raise InvalidRequest(f"{where}: needs at least {minimum} {what}; got {len(items)}")
    if len(items) > maximum:
        raise LimitExceeded(f"{where}: {len(items):,} {what} given; limit {maximum:,}")
    seen: set[str] = set()
    for item in items:
        if not item.strip():
            raise InvalidRequest(f"{where}: {what} must be non-empty strings; got {item!r}")
        if len(item) > LIMITS.max_item_chars:
            raise LimitExceeded(
                f"{where}: {what[:-1]} {item[:40]!r}... has {len(item):,} characters; "
                f"limit {LIMITS.max_item_chars:,}"
            )
        if item in seen:
            raise InvalidRequest(f"{where}: duplicate {what[:-1]} {item!r}")
        seen.add(item)


class SystemOneTask(BaseModel):
    """One named task over the request's input (see the module docstring for the kinds)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(
        min_length=1, max_length=MAX_TASK_NAME_CHARS, description="unique within the request; keys the answer"
    )
    kind: Kind
    question: str | None = Field(
        default=None,
        max_length=LIMITS.max_question_chars,
        description="choice / score / set / span only; absent: calibration.json's default for the kind",
    )
    options: list[str] | None = Field(
        default=None,
        description="choice / score (>= 2), set (>= 1)",
        json_schema_extra={"maxItems": LIMITS.max_options},
    )
    labels: list[str] | None = Field(
        default=None,
        description="span / extract (>= 1), classify (>= 2 single-label, >= 1 multi-label)",
        json_schema_extra={"maxItems": min(LIMITS.max_labels, LIMITS.max_options)},
    )
    fields: list[str] | None = Field(
        default=None, description="span / extract: input fields to search (default: all fields)"
    )
    multi_label: bool | None = Field(
        default=None, description="classify only: true -> set over the labels; default single-label choice"
    )

    @field_validator("kind", mode="before")
    @classmethod
    def _kind(cls, v: Any) -> Any:
        if isinstance(v, str) and v not in KINDS:
            raise InvalidRequest(f"unknown kind {v!r}; kinds are {', '.join(KINDS)}")
        return v

    @model_validator(mode="after")
    def _by_kind(self) -> SystemOneTask:
        where = f"task {self.name!r} ({self.kind})"
        if self.kind in OPTION_KINDS:
            if self.labels is not None:
                raise InvalidRequest(f"{where}: {self.kind} tasks take options, not labels")
            _check_items(
                self.options or [], "options", where, 1 if self.kind == "set" else 2, LIMITS.max_options
            )
        else:
            if self.options is not None:
                raise InvalidRequest(f"{where}: {self.kind} tasks take labels, not options")
            single = self.kind == "classify" and not self.multi_label
            maximum = (
                min(LIMITS.max_labels, LIMITS.max_options) if self.kind == "classify" else LIMITS.max_labels
            )
            _check_items(self.labels or [], "labels", where, 2 if single else 1, maximum)
        if self.kind in OPEN_LABEL_KINDS and self.question is not None:
            raise InvalidRequest(
                f"{where}: {self.kind} tasks take only labels; their question text is the default "
                f"from calibration.json (use kind {'choice' if self.kind == 'classify' else 'span'} "
                "to ask your own question)"
            )
        if self.question is not None and not self.question.strip():
            raise InvalidRequest(f"{where}: question is empty; leave it out to use the default text")
        if self.fields is not None and self.kind not in SPAN_KINDS:
            raise InvalidRequest(f"{where}: fields is only for span and extract tasks")
        if self.fields is not None:
            if not self.fields:
                raise InvalidRequest(f"{where}: fields is empty; leave it out to search every field")
            if len(set(self.fields)) != len(self.fields):
                raise InvalidRequest(f"{where}: fields lists a field twice: {self.fields}")
        if self.multi_label is not None and self.kind != "classify":
            raise InvalidRequest(f"{where}: multi_label is only for classify tasks")
        return self

    @property
    def row_type(self) -> str:
        """The row-level type this task becomes (choice / score / set / span)."""
        if self.kind == "classify":
            return "set" if self.multi_label else "choice"
        if self.kind == "extract":
            return "span"
        return self.kind

    @property
    def row_task(self) -> str:
        """The block's task key, ``"<row type>:<task name>"``."""
        return f"{self.row_type}:{self.name}"


class SystemOneRequest(BaseModel):
    """A SystemOne request: one input, named tasks over it, answered by the named model."""

    model_config = ConfigDict(extra="forbid", strict=True)

    version: Literal["1"] = SYSTEM_ONE_VERSION
    model: str = Field(min_length=1, max_length=256)
    # Absent (or null): the content id of the request as sent (`vela2.api.schemas.content_id`).
    id: str | None = Field(default=None, min_length=1, max_length=LIMITS.max_id_chars)
    input: str | dict[str, str] = Field(
        description="free text, or named string fields rendered in key order with field headers",
        json_schema_extra={"maxProperties": LIMITS.max_fields},
    )
    tasks: list[SystemOneTask] = Field(json_schema_extra={"minItems": 1, "maxItems": LIMITS.max_tasks})
    units: bool = Field(default=False, description="span / extract answers carry every word's units")

    @model_validator(mode="before")
    @classmethod
    def _content_id(cls, data: Any) -> Any:
        check_unicode(data)  # every string valid Unicode, before anything reads one
        if isinstance(data, dict) and data.get("id") is None:
            rest = {k: v for k, v in data.items() if k != "id"}
            return {**rest, "id": content_id(rest)}
        return data

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, v: Any) -> Any:
        return check_id(v)

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: Any) -> Any:
        if v != SYSTEM_ONE_VERSION:
            raise InvalidRequest(f"version {v!r} is not supported; this server speaks SystemOne version '1'")
        return v

    @field_validator("input", mode="before")
    @classmethod
    def _input(cls, v: Any) -> Any:
        if isinstance(v, str):
            if not v.strip():
                raise InvalidRequest("input is empty")
            return v
        if not isinstance(v, dict):
            raise InvalidRequest(
                f"input must be a string or a JSON object of string fields; got {type(v).__name__}"
            )
        if not v:
            raise InvalidRequest("input is an empty JSON object; give at least one field")
        if len(v) > LIMITS.max_fields:
            raise LimitExceeded(f"input has {len(v):,} fields; limit {LIMITS.max_fields:,}")
        for name, value in v.items():
            if not isinstance(name, str) or not name.strip() or "\n" in name:
                raise InvalidRequest(f"input field names must be non-empty one-line strings; got {name!r}")
            if len(name) > LIMITS.max_item_chars:
                raise LimitExceeded(
                    f"input field name {name[:40]!r}... has {len(name):,} characters; "
                    f"limit {LIMITS.max_item_chars:,}"
                )
            if not isinstance(value, str):
                raise InvalidRequest(
                    f"input field {name!r} must be a string; got {type(value).__name__} {_short(value)}"
                )
        return v

    @field_validator("tasks", mode="before")
    @classmethod
    def _tasks(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise InvalidRequest("tasks is empty; a request needs at least one task")
            if len(v) > LIMITS.max_tasks:
                raise LimitExceeded(f"{len(v):,} tasks given; limit {LIMITS.max_tasks:,}")
        return v

    @model_validator(mode="after")
    def _cross(self) -> SystemOneRequest:
        seen: set[str] = set()
        for i, task in enumerate(self.tasks):
            if task.name in seen:
                raise InvalidRequest(
                    f"tasks[{i}]: duplicate task name {task.name!r}; task names must be unique"
                )
            seen.add(task.name)
            for name in task.fields or []:
                if isinstance(self.input, str):
                    raise InvalidRequest(
                        f"tasks[{i}] {task.name!r}: fields given but input is free text (no fields)"
                    )
                if name not in self.input:
                    raise InvalidRequest(
                        f"tasks[{i}] {task.name!r}: field {name!r} is not in input; "
                        f"input fields: {', '.join(self.input)}"
                    )
        return self


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
    served_by: ModelInfo | None = None  # the model that answered (name, checkpoint digest, precision)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_system_one(obj: Any) -> bool:
    """True for a SystemOne request (a dict with "model", "tasks" and "input"); rows have none of these."""
    return isinstance(obj, SystemOneRequest) or (
        isinstance(obj, dict) and "model" in obj and "tasks" in obj and "input" in obj
    )


def parse_request(obj: Any) -> SystemOneRequest:
    """Validate a decoded SystemOne request; raises InvalidRequest / LimitExceeded with a located message.

    A request without an id (or with a null one) gets the deterministic content id of the object as
    sent, without its id key.
    """
    if isinstance(obj, SystemOneRequest):
        return obj
    if not isinstance(obj, dict):
        raise InvalidRequest(f"a SystemOne request must be a JSON object; got {type(obj).__name__}")
    try:
        return SystemOneRequest.model_validate(obj)
    except ValidationError as e:
        raise validation_error(e) from None


def check_model(request: SystemOneRequest, model_name: str) -> None:
    """Raise ModelMismatch unless the request names the loaded checkpoint's model."""
    if request.model != model_name:
        raise ModelMismatch(f"request names model {request.model!r}; this worker serves {model_name!r}")


def render_input(value: str | dict[str, str]) -> tuple[str, list[FieldRange] | None]:
    """The row text of an input and its field ranges (None for free text).

    JSON input: for each field in key order, ``"<name>:\\n" + value``, joined by ``"\\n\\n"``; the
    range of a field covers its own string only, so ``text[r.start:r.end] == value[r.name]``.
    """
    if isinstance(value, str):
        return value, None
    parts: list[str] = []
    ranges: list[FieldRange] = []
    pos = 0
    for i, (name, field_text) in enumerate(value.items()):
        head = (FIELD_SEPARATOR if i else "") + _header(name)
        start = pos + len(head)
        parts.extend([head, field_text])
        pos = start + len(field_text)
        ranges.append(FieldRange(name=name, start=start, end=pos))
    return "".join(parts), ranges


def render_checked(value: str | dict[str, str]) -> tuple[str, list[FieldRange] | None]:
    """render_input, then the character limit of the rendered text (LimitExceeded naming both):
    checked by the producers at submit and by the worker, with the same message."""
    text, ranges = render_input(value)
    if len(text) > LIMITS.max_text_chars:
        raise LimitExceeded(
            f"input renders to {len(text):,} characters (field headers included); "
            f"limit {LIMITS.max_text_chars:,}"
        )
    return text, ranges


def to_row(request: SystemOneRequest, calibration: Calibration) -> Row:
    """The one bundled row that answers `request`: one question block per task, in task order."""
    text, ranges = render_checked(request.input)
    all_fields = [r.name for r in ranges] if ranges is not None else None
    questions = []
    for task in request.tasks:
        span = task.row_type == "span"
        items = task.options if task.kind in OPTION_KINDS else task.labels
        questions.append(
            Question(
                question=task.question if task.question is not None else calibration.question_text(task.kind),
                options=None if span else list(items or []),
                labels=list(items or []) if span else None,
                task=task.row_task,
                fields=(list(task.fields) if task.fields is not None else all_fields) if span else None,
            )
        )
    row = {
        "id": request.id,
        "task": questions[0].task,
        "text": text,
        "questions": [q.model_dump(exclude_none=True) for q in questions],
        "units": request.units,
    }
    if ranges is not None:
        row["fields"] = [r.model_dump() for r in ranges]
    return parse_row(row)


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


def _predict_fn() -> Any:
    # Imported on use: this module stays torch-free for the producer and the HTTP route.
    return importlib.import_module("vela2.scoring.predict").predict


def _predict_kwargs(precision: str | None, max_batch_tokens: int | None) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if precision is not None:
        kw["precision"] = precision
    if max_batch_tokens is not None:
        kw["max_batch_tokens"] = max_batch_tokens
    return kw


def system_one_request(
    model: Any, request: Any, *, precision: str | None = None, max_batch_tokens: int | None = None
) -> dict[str, Any]:
    """Answer one SystemOne request: parse -> check_model -> to_row -> vela2.predict -> to_answer.

    Never raises for a bad request: any Vela2Error becomes an error answer naming the problem.
    `precision` / `max_batch_tokens` are passed to `vela2.predict` when given.
    """
    parsed: Any = request
    try:
        parsed = parse_request(request)
        check_model(parsed, model.name)
        row = to_row(parsed, model.calibration)
        (result,) = _predict_fn()(model, [row], **_predict_kwargs(precision, max_batch_tokens))
        return to_answer(parsed, result)
    except Vela2Error as e:
        logger.info("SystemOne request refused: %s", e)
        return error_answer(parsed, e)


def predict_mixed(
    model: Any, objs: list[Any], *, precision: str | None = None, max_batch_tokens: int | None = None
) -> list[dict[str, Any]]:
    """Answer a mix of rows and SystemOne requests (told apart by `is_system_one`) in one predict() call.

    Returns one JSON dict per input, in order: rows get `RowResult.to_json_dict()`, SystemOne
    requests their answer (an error answer when invalid; the others still run). This is what
    `vela2 predict` needs for a file whose lines mix both.
    """
    rows: list[Any] = []
    plan: list[tuple[str, Any, int]] = []  # (kind, parsed request or error answer, index into rows)
    for obj in objs:
        if not is_system_one(obj):
            plan.append(("row", None, len(rows)))
            rows.append(obj)
            continue
        parsed: Any = obj
        try:
            parsed = parse_request(obj)
            check_model(parsed, model.name)
            rows.append(to_row(parsed, model.calibration))
            plan.append(("s1", parsed, len(rows) - 1))
        except Vela2Error as e:
            plan.append(("err", error_answer(parsed, e), -1))
    results = _predict_fn()(model, rows, **_predict_kwargs(precision, max_batch_tokens)) if rows else []
    out: list[dict[str, Any]] = []
    for kind, item, idx in plan:
        if kind == "row":
            out.append(results[idx].to_json_dict())
        elif kind == "err":
            out.append(item)
        else:
            try:
                out.append(to_answer(item, results[idx]))
            except Vela2Error as e:
                out.append(error_answer(item, e))
    return out


# --- JSON Schema export ------------------------------------------------------------------------


# What JSON Schema cannot say, and the validators check all the same (request_schema's description).
CROSS_FIELD_RULES = (
    "task names are unique within a request; a task's `fields` name keys of `input`; "
    f"the rendered input (fields with their headers) has at most {LIMITS.max_text_chars:,} characters and "
    f"{LIMITS.max_text_words:,} words; every string is valid Unicode (no lone surrogates); and a request fits "
    f"the model's window and its token limit ({LIMITS.max_request_tokens:,} tokens over all windows and blocks: "
    "a question block longer than the model's window is refused by the worker, limit_exceeded)"
)


# A character that str.strip() keeps (not str.isspace()): the validators' "non-empty" is `.strip()`,
# whose whitespace is not a regex's \s in every dialect (\x1c-\x1f, \x85; \ufeff), so it is spelt out.
NON_BLANK = "[^" + "".join(f"\\u{i:04x}" for i in range(0x10000) if chr(i).isspace()) + "]"


def request_schema(model: str | None = None, ref_prefix: str = "#/$defs/") -> dict[str, Any]:
    """The JSON Schema of a SystemOne request: every rule the validators apply to one field (non-empty
    input, options / labels per kind with their counts and lengths, question texts, limits, id
    rules), one definition per task kind. What JSON Schema cannot express is in CROSS_FIELD_RULES.
    `model`: the one model name accepted (a route serving one model); definitions under `ref_prefix`."""
    item = {"type": "string", "minLength": 1, "maxLength": LIMITS.max_item_chars, "pattern": NON_BLANK}
    field_name = {**item, "not": {"pattern": "\n"}}
    null = {"type": "null"}

    def items(minimum: int, maximum: int) -> dict[str, Any]:
        return {"type": "array", "items": item, "minItems": minimum, "maxItems": maximum, "uniqueItems": True}

    def optional(spec: dict[str, Any]) -> dict[str, Any]:
        return {"anyOf": [spec, null], "default": None}

    question = {"type": "string", "maxLength": LIMITS.max_question_chars, "pattern": NON_BLANK,
                "description": "absent or null: calibration.json's default question of the kind"}
    fields = {"type": "array", "items": field_name, "minItems": 1, "uniqueItems": True,
              "description": "input fields to search (keys of an object input; default: all fields)"}
    classify_max = min(LIMITS.max_labels, LIMITS.max_options)

    def task(kind: str, description: str, **props: dict[str, Any]) -> dict[str, Any]:
        required = ["name", "kind", *(k for k, v in props.items() if "default" not in v)]
        base = {"question": null, "options": null, "labels": null, "fields": null, "multi_label": null}
        return {
            "type": "object", "title": f"{kind} task", "description": description, "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": MAX_TASK_NAME_CHARS,
                         "description": "unique within the request; keys the answer"},
                "kind": {"const": kind},
                **{k: (v if v != null else {**null, "default": None}) for k, v in {**base, **props}.items()},
            },
            "required": required,
        }

    options_question = {"question": optional(question)}
    defs = {
        "ChoiceTask": task("choice", "single label over the options", **options_question,
                           options=items(2, LIMITS.max_options)),
        "ScoreTask": task("score", "ordinal options; `expected` when every option is a number", **options_question,
                          options=items(2, LIMITS.max_options)),
        "SetTask": task("set", "multi-label over the options", **options_question,
                        options=items(1, LIMITS.max_options)),
        "SpanTask": task("span", "spans of the labels", **options_question, labels=items(1, LIMITS.max_labels),
                         fields=optional(fields)),
        "ClassifyTask": task("classify", "open-label, single label (a choice over the labels; no question)",
                             labels=items(2, classify_max),
                             multi_label={"enum": [False, None], "default": None}),
        "MultiLabelClassifyTask": task("classify", "open-label, several labels (a set over the labels)",
                                       labels=items(1, classify_max), multi_label={"const": True}),
        "ExtractTask": task("extract", "open-label spans (no question)", labels=items(1, LIMITS.max_labels),
                            fields=optional(fields)),
    }
    defs["SystemOneTask"] = {"oneOf": [{"$ref": ref_prefix + name} for name in list(defs)],
                             "description": "one named task over the input; `kind` picks its fields"}
    text = {"type": "string", "minLength": 1, "maxLength": LIMITS.max_text_chars, "pattern": NON_BLANK,
            "description": "free text"}
    fields_input = {"type": "object", "minProperties": 1, "maxProperties": LIMITS.max_fields,
                    "propertyNames": field_name, "additionalProperties": {"type": "string"},
                    "description": "named string fields, rendered in key order with field headers"}
    return {
        "title": "SystemOneRequest",
        "description": f"A SystemOne request (version {SYSTEM_ONE_VERSION}). Also checked: {CROSS_FIELD_RULES}.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "version": {"const": SYSTEM_ONE_VERSION, "default": SYSTEM_ONE_VERSION},
            "model": {"const": model} if model is not None else {"type": "string", "minLength": 1, "maxLength": 256},
            "id": optional({"type": "string", "minLength": 1, "maxLength": LIMITS.max_id_chars,
                            "description": "absent or null: the content id of the request"}),
            "input": {"anyOf": [text, fields_input]},
            "tasks": {"type": "array", "items": {"$ref": ref_prefix + "SystemOneTask"}, "minItems": 1,
                      "maxItems": LIMITS.max_tasks},
            "units": {"type": "boolean", "default": False,
                      "description": "span / extract answers carry every word's units"},
        },
        "required": ["model", "input", "tasks"],
        # free text has no fields: no task may name any
        "if": {"properties": {"input": {"type": "string"}}, "required": ["input"]},
        "then": {"properties": {"tasks": {"items": {"properties": {"fields": null}}}}},
        "$defs": defs,
    }


def schema_texts() -> dict[str, str]:
    """File name -> JSON Schema text (sorted keys, indent 2) of the request and answer models."""
    schemas = {
        SCHEMA_FILES["request"]: {"$schema": "https://json-schema.org/draft/2020-12/schema", **request_schema()},
        SCHEMA_FILES["answer"]: SystemOneAnswer.model_json_schema(mode="serialization"),
    }
    return {
        name: json.dumps(s, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        for name, s in schemas.items()
    }


def write_schemas(directory: str | Path = SCHEMA_DIR) -> list[Path]:
    """Write both schema files into `directory` (created if missing); returns their paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in schema_texts().items():
        p = d / name
        p.write_text(text, encoding="utf-8")
        paths.append(p)
    return paths


def main(argv: list[str] | None = None) -> int:
    """`python -m vela2.api.systemone --write-schemas [--dir DIR]`."""
    ap = argparse.ArgumentParser(prog="python -m vela2.api.systemone", description=__doc__.splitlines()[0])
    ap.add_argument("--write-schemas", action="store_true", help="write the request and answer JSON Schemas")
    ap.add_argument("--dir", default=str(SCHEMA_DIR), help="target folder (default: the repo's schemas/)")
    args = ap.parse_args(argv)
    if not args.write_schemas:
        ap.print_help()
        return 2
    for p in write_schemas(args.dir):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
