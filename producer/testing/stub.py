"""The fake worker's stub answers (``answer="stub"``, the default): deterministic, from the request
alone, with every field the worker's answer has for the same request and the worker's types.

choice / score: uniform probabilities over the options, decision the first option,
abstain_probability 0 (score adds `expected`, the mean of the options when all are numbers); set:
0.5 per option, decision the first option; span: probability 0 per label, no spans. `gate_fired`
on PII span tasks, `units` when the row asks (the text's real word offsets), raw `logits` and
`render` when it asks (`stub_answers`, `stub_render`); the probabilities are those logits
calibrated by the worker's own functions. `served_by` names a checkpoint digest no checkpoint has
(`fake_digest`), and stored metas carry FAKE_META_KEY: these are no model's answers.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from vela2.api.schemas import Answer, Row
from vela2.model.calibration import Calibration, choice_probs, expected_value, sigmoid
from vela2.text.rendering import part_digest, split_words
from vela2.text.spans import span_answer

STUB = "stub"
FAKE_META_KEY = "vela2_fake"  # in a stored meta: which fake answered it (never in a real worker's)


def _never_logit(temperature: float) -> float:
    """A raw logit whose calibrated probability is exactly 0 at `temperature` (exp underflows below
    -745): the stub's [ABS] and span-word logits, so its probabilities 0 follow from its logits."""
    return -1000.0 * max(1.0, temperature)


def _stub_span(row: Row, i: int, task: str, offsets: np.ndarray, cal: Calibration) -> Answer:
    """A span answer from raw logits `_never_logit` for every word and label, made by the worker's
    own `span_answer`: probability 0 everywhere, so no spans, with the worker's `gate_fired` (PII
    tasks) and `units` (the text's real word offsets) when the row asks."""
    labels = row.questions[i].labels or []
    logits = np.full((offsets.shape[0], len(labels)), _never_logit(cal.T_span), dtype=np.float32)  # (W, K)
    return span_answer(row, offsets, i, task, logits, cal)


def _stub_options(row: Row, i: int, task: str, cal: Calibration) -> Answer:
    """A choice / score / set answer: raw logits 0 per option ([ABS] `_never_logit`), calibrated as the
    worker calibrates them (uniform, abstain 0; set: 0.5 each); decision the first option."""
    kind = task.split(":", 1)[0]
    options = row.questions[i].options or []
    fields: dict[str, Any] = {}
    if kind == "set":
        logits = np.zeros(len(options), dtype=np.float32)  # (options,): set has no [ABS]
        probs = sigmoid(logits.astype(np.float64) / cal.T_set)
        fields["decision"] = options[:1]
    else:
        t = cal.temperature(task)
        logits = np.array([0.0] * len(options) + [_never_logit(t)], dtype=np.float32)  # (options + [ABS],)
        probs, fields["abstain_probability"] = choice_probs(logits, t, len(options))
        fields["decision"] = options[0]
        if kind == "score":
            fields["expected"] = expected_value(options, probs)
    if row.logits:
        fields["logits"] = logits.tolist()
    return Answer(question=i, task=task, probs=dict(zip(options, probs.tolist(), strict=True)), **fields)


def stub_answers(row: Row, calibration: Calibration | None = None) -> list[Answer]:
    """The stub's answers to a row: one per question, from the question alone (module docstring),
    with every field the worker's answer has for that row (`gate_fired`, `units`, `logits`), its
    probabilities calibrated from its logits by `calibration` (default: calibration.json's defaults)."""
    cal = calibration or Calibration()
    offsets: np.ndarray | None = None  # the text's words, split once and only when a span answer needs them
    out = []
    for i in range(len(row.questions)):
        task = row.question_task(i)
        if task.startswith("span:"):
            offsets = split_words(row.text) if offsets is None else offsets
            out.append(_stub_span(row, i, task, offsets, cal))
        else:
            out.append(_stub_options(row, i, task, cal))
    return out


def stub_render(row: Row) -> dict[str, Any]:
    """The `render` digests of a row that asks for logits, with vela2.text.rendering.render_digest's keys:
    `offsets` is the worker's own (the same word split); the others need the tokenizer, so
    `sequences` is 1 and the token digests are the stub's own, never equal to a worker's."""
    out: dict[str, Any] = {"sequences": 1}
    for part in ("input_ids", "position_ids", "parts", "blocks", "word_positions"):
        out[part] = part_digest([FAKE_META_KEY, STUB, part, row.text])
    out["offsets"] = part_digest(split_words(row.text).tolist())
    return out


def fake_digest(kind: str, model: str) -> str:
    """The checkpoint digest in the `served_by` of a fake's answers (32 hex digits like
    vela2.model.checkpoint.digest, of the fake's kind and model name): no checkpoint has it."""
    return hashlib.blake2b(f"{FAKE_META_KEY}:{kind}:{model}".encode(), digest_size=16).hexdigest()
