"""The JSON Schemas of SystemOne: the request's (written by hand: every rule the validators apply
to one field, one definition per task kind) and the answer's (pydantic's), and the schema files
under schemas/ (`python -m vela2.api.systemone --write-schemas` rewrites them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vela2.api.systemone.answer import SystemOneAnswer
from vela2.api.systemone.request import MAX_TASK_NAME_CHARS, SYSTEM_ONE_VERSION
from vela2.config import LIMITS

SCHEMA_DIR = Path(__file__).resolve().parents[3] / "schemas"
SCHEMA_FILES = {
    "request": "systemone.request.schema.json",
    "answer": "systemone.answer.schema.json",
}

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


class _Parts:
    """The pieces the request schema repeats (an option / label string, a field name, null), made
    afresh for each request_schema() call, and the shapes built of them."""

    def __init__(self) -> None:
        self.item = {"type": "string", "minLength": 1, "maxLength": LIMITS.max_item_chars, "pattern": NON_BLANK}
        self.field_name = {**self.item, "not": {"pattern": "\n"}}
        self.null = {"type": "null"}

    def items(self, minimum: int, maximum: int) -> dict[str, Any]:
        """A list of distinct option / label strings, `minimum` to `maximum` of them."""
        return {"type": "array", "items": self.item, "minItems": minimum, "maxItems": maximum, "uniqueItems": True}

    def optional(self, spec: dict[str, Any]) -> dict[str, Any]:
        """`spec`, or null (the default)."""
        return {"anyOf": [spec, self.null], "default": None}

    def task(self, kind: str, description: str, **props: dict[str, Any]) -> dict[str, Any]:
        """The definition of one task kind: `props` are the fields it takes (required unless they have a
        default); the other task fields must be absent or null."""
        null = self.null
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


def _task_definitions(parts: _Parts, ref_prefix: str) -> dict[str, Any]:
    """One definition per task kind (classify twice: single- and multi-label), and SystemOneTask:
    one of them, by reference under `ref_prefix`."""
    items, optional, task = parts.items, parts.optional, parts.task
    question = {"type": "string", "maxLength": LIMITS.max_question_chars, "pattern": NON_BLANK,
                "description": "absent or null: calibration.json's default question of the kind"}
    fields = {"type": "array", "items": parts.field_name, "minItems": 1, "uniqueItems": True,
              "description": "input fields to search (keys of an object input; default: all fields)"}
    classify_max = min(LIMITS.max_labels, LIMITS.max_options)
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
    return defs


def request_schema(model: str | None = None, ref_prefix: str = "#/$defs/") -> dict[str, Any]:
    """The JSON Schema of a SystemOne request: every rule the validators apply to one field (non-empty
    input, options / labels per kind with their counts and lengths, question texts, limits, id
    rules), one definition per task kind. What JSON Schema cannot express is in CROSS_FIELD_RULES.
    `model`: the one model name accepted (a route serving one model); definitions under `ref_prefix`."""
    parts = _Parts()
    defs = _task_definitions(parts, ref_prefix)
    text = {"type": "string", "minLength": 1, "maxLength": LIMITS.max_text_chars, "pattern": NON_BLANK,
            "description": "free text"}
    fields_input = {"type": "object", "minProperties": 1, "maxProperties": LIMITS.max_fields,
                    "propertyNames": parts.field_name, "additionalProperties": {"type": "string"},
                    "description": "named string fields, rendered in key order with field headers"}
    return {
        "title": "SystemOneRequest",
        "description": f"A SystemOne request (version {SYSTEM_ONE_VERSION}). Also checked: {CROSS_FIELD_RULES}.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "version": {"const": SYSTEM_ONE_VERSION, "default": SYSTEM_ONE_VERSION},
            "model": {"const": model} if model is not None else {"type": "string", "minLength": 1, "maxLength": 256},
            "id": parts.optional({"type": "string", "minLength": 1, "maxLength": LIMITS.max_id_chars,
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
        "then": {"properties": {"tasks": {"items": {"properties": {"fields": parts.null}}}}},
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

