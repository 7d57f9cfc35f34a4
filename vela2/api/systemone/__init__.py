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
fails when they are stale.

The package, one module per part (every name below is importable from `vela2.api.systemone`):
``request`` (the request models and their checks: `parse_request`, `check_model`), ``rows`` (a
request as its one bundled row: `render_input`, `to_row`), ``answer`` (the answer models,
`to_answer`, `error_answer`) and ``json_schema`` (the JSON Schemas and their files). It imports no
torch and nothing of the model (the producer and the HTTP route use it): a request is answered with
a loaded model by `vela2.scoring.systemone.system_one_request`.
"""

from __future__ import annotations

import argparse

from vela2.api.systemone.answer import SystemOneAnswer, TaskAnswer, error_answer, to_answer
from vela2.api.systemone.json_schema import (
    CROSS_FIELD_RULES,
    NON_BLANK,
    SCHEMA_DIR,
    SCHEMA_FILES,
    request_schema,
    schema_texts,
    write_schemas,
)
from vela2.api.systemone.request import (
    KINDS,
    MAX_TASK_NAME_CHARS,
    OPEN_LABEL_KINDS,
    OPTION_KINDS,
    SPAN_KINDS,
    SYSTEM_ONE_VERSION,
    Kind,
    SystemOneRequest,
    SystemOneTask,
    check_model,
    is_system_one,
    parse_request,
)
from vela2.api.systemone.rows import FIELD_SEPARATOR, render_checked, render_input, to_row

__all__ = [
    "CROSS_FIELD_RULES",
    "FIELD_SEPARATOR",
    "KINDS",
    "MAX_TASK_NAME_CHARS",
    "NON_BLANK",
    "OPEN_LABEL_KINDS",
    "OPTION_KINDS",
    "SCHEMA_DIR",
    "SCHEMA_FILES",
    "SPAN_KINDS",
    "SYSTEM_ONE_VERSION",
    "Kind",
    "SystemOneAnswer",
    "SystemOneRequest",
    "SystemOneTask",
    "TaskAnswer",
    "check_model",
    "error_answer",
    "is_system_one",
    "main",
    "parse_request",
    "render_checked",
    "render_input",
    "request_schema",
    "schema_texts",
    "to_answer",
    "to_row",
    "write_schemas",
]


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
