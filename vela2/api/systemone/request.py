"""The SystemOne request: its pydantic models (one request, its named tasks) and the checks that
refuse a bad one with a located message (see the package docstring for the kinds and limits)."""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vela2.api.schemas import check_id, check_unicode, content_id, validation_error
from vela2.config import LIMITS
from vela2.errors import InvalidRequest, LimitExceeded, ModelMismatch

SYSTEM_ONE_VERSION: Final = "1"
KINDS = ("choice", "score", "set", "span", "classify", "extract")
OPTION_KINDS = ("choice", "score", "set")  # take `options`
SPAN_KINDS = ("span", "extract")  # may take `fields`; answers carry `spans`
OPEN_LABEL_KINDS = ("classify", "extract")  # no `question`: the calibration's default text
MAX_TASK_NAME_CHARS = 128  # same bound as a row task's name

Kind = Literal["choice", "score", "set", "span", "classify", "extract"]


def _short(value: Any) -> str:
    """The repr of a value a message quotes, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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

