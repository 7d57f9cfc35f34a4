"""A SystemOne request as the ONE bundled row that answers it: the input rendered into the row's
text (JSON fields with their headers and character ranges), one question block per task."""

from __future__ import annotations

from vela2.api.schemas import FieldRange, Question, Row, parse_row
from vela2.api.systemone.request import OPTION_KINDS, SystemOneRequest
from vela2.config import LIMITS
from vela2.errors import LimitExceeded
from vela2.model.calibration import Calibration

FIELD_SEPARATOR = "\n\n"  # between two rendered fields


def _header(name: str) -> str:
    """The header line that opens a rendered field."""
    return f"{name}:\n"


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

