"""Labelled rows (rows with `gold`, in `vela2 calibrate`'s format): a labelled JSONL file read line by
line, and a row's gold checked against its questions. `vela2 calibrate`, `vela2 eval` and `vela2
train` read their files and skip the rows they cannot use alike.

Gold per question: choice / score one option (a string); set a list of distinct options; span a
list of {label, start, end} character spans of the row's whole `text`. A bundled row takes a list
with one gold per question (None: an unlabelled question).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vela2.api.schemas import Row, split_task
from vela2.errors import InvalidRequest


def read_jsonl(path: str | Path) -> tuple[list[Any], list[dict[str, Any]]]:
    """Rows of a JSONL file (blank lines skipped) and {"id": None, "line", "reason"} for bad lines.

    The file is read as bytes and each line decoded on its own (`decode_json`, as the CLI's predict
    and backfill do): invalid JSON, a byte that is not UTF-8, or JSON nested deeper than 64 levels
    makes that line a bad row, not the whole file fail."""
    from vela2.wire.messages import decode_json

    rows: list[Any] = []
    bad: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                line.decode("utf-8")  # json.loads of bytes would also take UTF-16 / UTF-32
                rows.append(decode_json(line, f"line {n}"))
            except UnicodeDecodeError as e:
                bad.append({"id": None, "line": n, "reason": f"not valid UTF-8: {e.reason} at byte {e.start}"})
            except InvalidRequest as e:  # "line N is not valid JSON: ..." / "... nested deeper than 64 levels"
                reason = str(e).removeprefix(f"line {n} is ").removeprefix("not valid JSON: ")
                reason = "invalid JSON: " + reason
                bad.append({"id": None, "line": n, "reason": reason})
    return rows, bad


def question_golds(row: Row, gold: Any) -> list[Any]:
    """`gold` aligned with the row's questions: the gold itself for a one-question row, else the list.

    A multi-question row's gold must be a list with one entry per question (None = unlabelled).
    Raises ValueError when it is not.
    """
    n = len(row.questions)
    if n == 1:
        return [gold]
    if not isinstance(gold, list) or len(gold) != n:
        got = f"a list of {len(gold)}" if isinstance(gold, list) else type(gold).__name__
        raise ValueError(f"gold of a row with {n} questions must be a list of {n} per-question golds; got {got}")
    return list(gold)


def _option_gold_problem(kind: str, options: list[str], gold: Any) -> str | None:
    """choice / score: the gold must be one of the options."""
    if not isinstance(gold, str):
        return f"{kind} gold must be one option (a string); got {type(gold).__name__}"
    if gold not in options:
        return f"gold {gold!r} is not among the options {options}"
    return None


def _set_gold_problem(options: list[str], gold: Any) -> str | None:
    """set: the gold must be a list of distinct options (possibly empty)."""
    if not isinstance(gold, list) or not all(isinstance(g, str) for g in gold):
        return f"set gold must be a list of options; got {type(gold).__name__}"
    missing = [g for g in gold if g not in options]
    if missing:
        return f"gold options {missing} are not among the options {options}"
    if len(set(gold)) != len(gold):
        return f"gold lists an option twice: {gold}"
    return None


def _span_gold_problem(labels: list[str], text: str, gold: Any) -> str | None:
    """span: the gold must be a list of {label, start, end}, each label one of the question's and
    0 <= start < end <= len(text)."""
    if not isinstance(gold, list):
        return f"span gold must be a list of {{label, start, end}}; got {type(gold).__name__}"
    for j, s in enumerate(gold):
        if not isinstance(s, dict) or not {"label", "start", "end"} <= set(s):
            return f"gold span [{j}] must be an object with label, start, end; got {s!r}"
        label, start, end = s["label"], s["start"], s["end"]
        if label not in labels:
            return f"gold span [{j}] label {label!r} is not among the labels {labels}"
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
            return f"gold span [{j}] start and end must be integers; got {start!r}, {end!r}"
        if not 0 <= start < end <= len(text):
            return f"gold span [{j}] offsets [{start}, {end}) are outside the text of {len(text)} characters"
    return None


def _check_question_gold(kind: str, q: Any, text: str, gold: Any) -> str | None:
    """Why `gold` does not fit question `q` of type `kind`, or None (also for an unlabelled question)."""
    if gold is None:
        return None
    if kind in ("choice", "score"):
        return _option_gold_problem(kind, q.options, gold)
    if kind == "set":
        return _set_gold_problem(q.options, gold)
    return _span_gold_problem(q.labels, text, gold)


def check_gold(row: Row, gold: Any) -> str | None:
    """Why `gold` cannot be used for this (valid) row, or None when it can.

    choice / score: one of the options (a string); set: a list of distinct options (may be empty);
    span: a list of {label, start, end} with the label among the question's labels and
    0 <= start < end <= len(text). A multi-question row takes a list of per-question golds (None for
    an unlabelled question); a row needs at least one labelled question.
    """
    if gold is None:
        return "row has no gold"
    try:
        golds = question_golds(row, gold)
    except ValueError as e:
        return str(e)
    if all(g is None for g in golds):
        return "row has no gold"
    for i, (q, g) in enumerate(zip(row.questions, golds, strict=True)):
        kind, _ = split_task(row.question_task(i))
        reason = _check_question_gold(kind, q, row.text, g)
        if reason:
            return reason if len(row.questions) == 1 else f"questions[{i}]: {reason}"
    return None
