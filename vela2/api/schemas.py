"""Row requests and results: the one schema shared by predict(), the worker, backfill and HTTP.

Pure pydantic, no torch: the producer imports this module.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vela2.config import LIMITS, TASK_TYPES
from vela2.errors import InvalidRequest, LimitExceeded, Vela2Error
from vela2.wire.keys import id_problem


def split_task(task: str) -> tuple[str, str]:
    """`"choice:boolq"` -> `("choice", "boolq")`; raises InvalidRequest for anything else."""
    if not isinstance(task, str) or ":" not in task:
        raise InvalidRequest(f"task must be 'type:name' with type one of {', '.join(TASK_TYPES)}; got {task!r}")
    kind, name = task.split(":", 1)
    if kind not in TASK_TYPES:
        raise InvalidRequest(f"task type must be one of {', '.join(TASK_TYPES)}; got {kind!r} in {task!r}")
    if not name or len(name) > 128:
        raise InvalidRequest(f"task name must have 1 to 128 characters; got {len(name)} in {task!r}")
    return kind, name


def surrogate_index(s: str) -> int | None:
    """Index of the first character of `s` that UTF-8 cannot encode (a lone surrogate), or None."""
    if s.isascii():
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _key_path(path: str, key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def unicode_problem(obj: Any) -> str | None:
    """Why a decoded request cannot be answered as text, or None: the first string in it (dict keys
    included, in document order) that UTF-8 cannot encode, named by its place, e.g.
    ``questions[0].options[1] is not valid Unicode (lone surrogate at index 3)``.
    Every string of a request must be valid Unicode: tokenizers, JSON results and Redis keys need it.
    """
    try:  # the common case in one C pass: a JSON-able value whose text UTF-8 encodes has no such string
        json.dumps(obj, ensure_ascii=False, check_circular=False).encode("utf-8")
        return None
    except (TypeError, ValueError, RecursionError):  # a lone surrogate, or not JSON: find the place below
        pass
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            i = surrogate_index(value)
            if i is not None:
                return f"{path or 'the value'} is not valid Unicode (lone surrogate at index {i})"
        elif isinstance(value, dict):
            children = []
            for key, item in value.items():
                if isinstance(key, str) and (i := surrogate_index(key)) is not None:
                    where = path or "the request"
                    return f"{where} has a key that is not valid Unicode (lone surrogate at index {i}): {key!r}"
                children.append((_key_path(path, key), item))
            stack.extend(reversed(children))
        elif isinstance(value, list | tuple):
            stack.extend(reversed([(f"{path}[{i}]", item) for i, item in enumerate(value)]))
    return None


def check_unicode(obj: Any) -> None:
    """Raise InvalidRequest naming the first string of `obj` that is not valid Unicode."""
    problem = unicode_problem(obj)
    if problem is not None:
        raise InvalidRequest(problem)


def check_id(value: Any) -> Any:
    """A request id must be a non-empty string of at most LIMITS.max_id_chars characters (ids become
    Redis keys); other types are left to the field's own type check."""
    if isinstance(value, str):
        problem = id_problem(value)  # the one rule, the wire's: ids become Redis keys
        if not value:
            raise InvalidRequest(f"id {problem}; give a non-empty string, or leave id out for a content id")
        if problem is not None:
            raise (LimitExceeded if len(value) > LIMITS.max_id_chars else InvalidRequest)(f"id {problem}")
    return value


def printable(s: str) -> str:
    """`s` with characters UTF-8 cannot encode written as backslash escapes (for error results)."""
    return s if surrogate_index(s) is None else s.encode("utf-8", "backslashreplace").decode("utf-8")


def _check_items(items: list[str], what: str, kind: str, minimum: int, maximum: int) -> list[str]:
    if len(items) < minimum:
        raise InvalidRequest(f"{kind} questions need at least {minimum} {what}; got {len(items)}")
    if len(items) > maximum:
        raise LimitExceeded(f"{what}: {len(items):,} given; limit {maximum:,}")
    seen: set[str] = set()
    for item in items:
        if not item.strip():
            raise InvalidRequest(f"{what} must be non-empty strings; got {item!r}")
        if len(item) > LIMITS.max_item_chars:
            raise LimitExceeded(f"{what[:-1]} has {len(item):,} characters; limit {LIMITS.max_item_chars:,}")
        if item in seen:
            raise InvalidRequest(f"duplicate {what[:-1]} {item!r}")
        seen.add(item)
    return items


class Question(BaseModel):
    """One question block: options for choice / score / set, labels for span."""

    model_config = ConfigDict(extra="forbid", strict=True)

    question: str | None = Field(default=None, max_length=LIMITS.max_question_chars)
    options: list[str] | None = None
    labels: list[str] | None = None
    task: str | None = None  # overrides the row's task for this block (mixed bundles, SystemOne)
    fields: list[str] | None = None  # span only: restrict spans to these named text fields


class FieldRange(BaseModel):
    """A named part of a row's text (SystemOne JSON input): characters [start, end) of `text`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)


class Row(BaseModel):
    """A row-level request: one text, one or more question blocks over it (bundled)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = Field(min_length=1, max_length=LIMITS.max_id_chars)
    task: str
    text: str
    questions: list[Question] = Field(min_length=1)
    units: bool = False  # span answers carry every word's offsets and probabilities
    logits: bool = False  # answers carry raw (uncalibrated) logits, for parity checks
    gold: Any = None  # labelled rows for `vela2 calibrate`; ignored when scoring
    fields: list[FieldRange] | None = None  # named parts of `text`; spans report offsets into them

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        check_unicode(data)
        return data

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, v: Any) -> Any:
        return check_id(v)

    @field_validator("text")
    @classmethod
    def _text(cls, v: str) -> str:
        if not v.strip():
            raise InvalidRequest("text is empty")
        if len(v) > LIMITS.max_text_chars:
            raise LimitExceeded(f"text has {len(v):,} characters; limit {LIMITS.max_text_chars:,}")
        return v

    @field_validator("questions")
    @classmethod
    def _questions(cls, v: list[Question]) -> list[Question]:
        if len(v) > LIMITS.max_questions:
            raise LimitExceeded(f"questions: {len(v):,} given; limit {LIMITS.max_questions:,}")
        return v

    @model_validator(mode="after")
    def _blocks(self) -> Row:
        split_task(self.task)
        names = {f.name for f in self.fields or []}
        for f in self.fields or []:
            if not f.start <= f.end <= len(self.text):
                raise InvalidRequest(f"field {f.name!r} range [{f.start}, {f.end}) is outside the text")
        for i, q in enumerate(self.questions):
            try:
                for name in q.fields or []:
                    if name not in names:
                        raise InvalidRequest(f"field {name!r} is not in the input")
                kind, _ = split_task(q.task or self.task)
                if kind == "span":
                    if q.options is not None:
                        raise InvalidRequest("span questions take labels, not options")
                    _check_items(q.labels or [], "labels", kind, 1, LIMITS.max_labels)
                else:
                    if q.labels is not None:
                        raise InvalidRequest(f"{kind} questions take options, not labels")
                    _check_items(q.options or [], "options", kind, 1 if kind == "set" else 2, LIMITS.max_options)
            except InvalidRequest as e:
                raise type(e)(f"questions[{i}]: {e}") from None
        return self

    def question_task(self, i: int) -> str:
        """The full task ('type:name') of question block i."""
        return self.questions[i].task or self.task


def content_id(obj: Any) -> str:
    """A deterministic id for a request sent without one: a hash of its canonical JSON."""
    try:
        blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):  # not JSON (a Python object handed to predict()): its repr
        blob = repr(obj)
    # surrogatepass: an id even for a request refused for a lone surrogate (the same bytes otherwise)
    return "h-" + hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def _first_error(e: ValidationError) -> Vela2Error:
    err = e.errors()[0]
    ctx_exc = (err.get("ctx") or {}).get("error")
    loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in err["loc"]).replace(".[", "[")
    if isinstance(ctx_exc, Vela2Error):
        msg = str(ctx_exc)
        return type(ctx_exc)(f"{loc}: {msg}" if loc and not msg.startswith(loc) else msg)
    value = repr(err.get("input"))
    if len(value) > 80:
        value = value[:77] + "..."
    where = f"{loc}: " if loc else ""
    if err["type"] == "missing":
        return InvalidRequest(f"{where}field required")
    if err["type"] == "extra_forbidden":
        return InvalidRequest(f"{where}unknown field")
    ctx = err.get("ctx") or {}
    if err["type"] == "string_too_long" and isinstance(err.get("input"), str):
        return LimitExceeded(f"{loc or 'string'} has {len(err['input']):,} characters; limit {ctx['max_length']:,}")
    if err["type"] == "too_long" and isinstance(ctx.get("actual_length"), int):
        return LimitExceeded(f"{loc or 'list'} has {ctx['actual_length']:,} items; limit {ctx['max_length']:,}")
    if err["type"] in ("string_too_long", "too_long"):
        return LimitExceeded(f"{where}{err['msg']}; got {value}")
    return InvalidRequest(f"{where}{err['msg']}; got {value}")


def validation_error(e: ValidationError) -> Vela2Error:
    """Turn a pydantic ValidationError into our error with one clear, located message."""
    return _first_error(e)


def parse_row(obj: Any) -> Row:
    """Validate a decoded JSON row; raises InvalidRequest / LimitExceeded with a located message.

    A row without an id gets the deterministic content id (see `content_id`).
    """
    if isinstance(obj, Row):
        return obj
    if not isinstance(obj, dict):
        raise InvalidRequest(f"a row must be a JSON object; got {type(obj).__name__}")
    if "id" not in obj:
        obj = {**obj, "id": content_id(obj)}
    try:
        return Row.model_validate(obj)
    except ValidationError as e:
        raise validation_error(e) from None


class Status(StrEnum):
    """Outcome of one request; serialises as its string value."""

    ok = "ok"
    error = "error"
    expired = "expired"
    cancelled = "cancelled"  # cancelled (Client.cancel, a job's cancel) before a worker started it


class ErrorInfo(BaseModel):
    type: str
    message: str


# Results never carry NaN or infinity (JSON has neither): every float of an output model is checked
# finite when it is built or assigned; vela2.scoring.pipeline.finish turns a failure into a model_error.
_FINITE = ConfigDict(allow_inf_nan=False, validate_assignment=True)


class SpanOut(BaseModel):
    """A decoded span: character offsets into the original text (or into `field`'s own string)."""

    model_config = _FINITE

    label: str
    start: int
    end: int
    text: str
    score: float
    field: str | None = None


class Units(BaseModel):
    """Every word of the whole text in order: offsets, and per label the probability of each word."""

    model_config = _FINITE

    offsets: list[tuple[int, int]]
    probs: dict[str, list[float]]
    logits: dict[str, list[float]] | None = None


class Answer(BaseModel):
    """The answer to one question block."""

    model_config = _FINITE

    question: int
    task: str
    probs: dict[str, float]  # choice/score: softmax over options; set: sigmoid; span: max over words
    decision: str | list[str] | None = None
    abstain_probability: float | None = None
    expected: float | None = None
    spans: list[SpanOut] | None = None
    gate_fired: bool | None = None  # PII span tasks only
    units: Units | None = None
    logits: list[float] | None = None  # raw option logits (options then [ABS]) when the row asked


class ModelInfo(BaseModel):
    """Which model answered: the served model's name, its checkpoint digest (weights, calibration,
    tokenizer, config: vela2.model.checkpoint.digest; None for a model built in memory), the precision,
    and whether it ran in batch-invariant mode (vela2.model.invariant: the answer's bits do not depend
    on what else was batched with it)."""

    name: str
    digest: str | None = None
    precision: str
    batch_invariant: bool = False


class RowResult(BaseModel):
    """One result per request id, whatever path produced it."""

    model_config = _FINITE

    id: str
    task: str | None = None
    status: Status
    answers: list[Answer] | None = None
    error: ErrorInfo | None = None
    timings: dict[str, float] | None = None
    render: dict[str, Any] | None = None  # rendering digests, when the row asked for logits (parity)
    served_by: ModelInfo | None = None  # set on every answer the model made (status ok)

    def to_json_dict(self) -> dict[str, Any]:
        """The result as the JSON object callers get (fields that are None left out)."""
        return self.model_dump(mode="json", exclude_none=True)


def error_result(request_id: str, task: str | None, exc: BaseException) -> RowResult:
    """A failed result: `error.type` from our error class, the message as raised."""
    code = exc.code if isinstance(exc, Vela2Error) else type(exc).__name__
    return RowResult(id=request_id, task=task, status=Status.error, error=ErrorInfo(type=code, message=str(exc)))


def expired_result(request_id: str, task: str | None, message: str) -> RowResult:
    """A request whose deadline passed before it was scored."""
    return RowResult(
        id=request_id, task=task, status=Status.expired, error=ErrorInfo(type="expired", message=message)
    )


def cancelled_result(request_id: str, task: str | None, message: str) -> RowResult:
    """A request cancelled before a worker started it (it never reached the device)."""
    return RowResult(
        id=request_id, task=task, status=Status.cancelled, error=ErrorInfo(type="cancelled", message=message)
    )


def guess_id_task(obj: Any) -> tuple[str, str | None]:
    """Best-effort id and task of a request that failed validation, for its error result: the id as
    sent (cut at LIMITS.max_id_chars; characters UTF-8 cannot encode written as backslash escapes, so
    the error result is always valid JSON), else the content id. A pydantic request (a Row built in
    Python) is read as its JSON."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json", exclude_none=True)
    if isinstance(obj, dict):
        rid = obj.get("id")
        task = obj.get("task")
        if not isinstance(rid, str) or not rid:
            rid = content_id(obj)
        return printable(rid)[: LIMITS.max_id_chars], printable(task) if isinstance(task, str) else None
    return content_id(repr(obj)), None

