"""Span decoding: calibrated word x label probabilities -> character spans (pure numpy, no torch).

The contract (what every span answer of predict(), the worker and SystemOne means):

1. Sparse gate (PII tasks only, ``rules.sparse_gate is not None``): if the text has no words, or
   the highest probability over all *allowed* words (segment id != -1) and all labels is below
   the gate, the row gets no spans and ``gate_fired`` is True. An empty word x label grid (no
   words, no labels, or every word excluded) counts as "below the gate". Otherwise, and always
   for non-PII rules, ``gate_fired`` is False.
2. Runs: per label, every *maximal* run of consecutive words with ``p >= threshold(label)``
   (equal counts as in; compared in float64), all in one segment and none with segment id -1,
   becomes a span. ``start`` = first word's start, ``end`` = last word's end (character offsets
   into ``text``, end exclusive), ``text = text[start:end]``. ``score`` = the MEAN of the run's
   word probabilities (not the max: a long run with one confident word should not look as sure
   as a run that is confident throughout), an unrounded Python float. A label missing from
   ``rules.thresholds`` uses the generic ``span:*`` default (0.5).
3. Length rule: a span is dropped when ``end - start < min_chars.get(label, 0)`` or its word
   count ``< min_words.get(label, 0)``. Spans are never trimmed, only kept or dropped.
4. Overlap: ``nested`` keeps every span (spans of different labels may overlap). ``flat`` takes
   spans greedily by score (compared at 1e-9), highest first (ties: more characters first, then earlier start,
   then the label's position in ``labels``) and keeps one only if it shares no word with a
   span already kept.
5. Output order: by ``(start, -end, label index)``. The result is a pure function of the
   inputs (no randomness, no dict-order dependence).
6. Shapes are validated; a mismatch raises ``ValueError`` naming the expected and given shape.

Window merging happens before this module: ``probs`` holds one probability per word of the
whole text.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from vela2.api.schemas import Answer, Row, SpanOut, Units
from vela2.model.calibration import GENERIC_SPAN_THRESHOLD, Calibration, sigmoid

logger = logging.getLogger(__name__)

OVERLAP_POLICIES = ("flat", "nested")
EXCLUDED_SEGMENT = -1  # segment id of words that may not be in any span (e.g. field headers)


def field_segments(row: Row, offsets: np.ndarray, allowed: list[str] | None) -> np.ndarray | None:
    """Field id per word (EXCLUDED_SEGMENT outside any allowed field; `offsets` (W, 2)), or None
    when the row has no fields: the segments decode_spans keeps a span within."""
    if not row.fields:
        return None
    seg = np.full(offsets.shape[0], EXCLUDED_SEGMENT, dtype=np.int64)
    for f_i, f in enumerate(row.fields):
        if allowed is None or f.name in allowed:
            seg[(offsets[:, 0] >= f.start) & (offsets[:, 1] <= f.end)] = f_i
    return seg


@dataclass(frozen=True)
class SpanRules:
    """How one span task turns probabilities into spans (see the module docstring)."""

    thresholds: dict[str, float]  # label -> probability threshold (p >= thr is "in")
    overlap: str  # "flat" (greedy by score across labels) | "nested"
    min_chars: dict[str, int]  # label -> shortest span kept in characters (PII length rule; {} = none)
    min_words: dict[str, int]  # label -> shortest span kept in words
    sparse_gate: float | None  # PII sparse gate; None for non-PII tasks

    def __post_init__(self) -> None:
        if self.overlap not in OVERLAP_POLICIES:
            raise ValueError(f"overlap must be one of {list(OVERLAP_POLICIES)}; got {self.overlap!r}")


def rules_for(calibration: Calibration, task: str, labels: list[str]) -> SpanRules:
    """The span rules of `task` ("span:name") over `labels`, read from the calibration.

    Thresholds are per task and label (falling back to the task's "*" entry, then the generic
    `span:*` default); the length rule and the sparse gate apply to PII tasks only.
    """
    thresholds = {label: calibration.span_threshold(task, label) for label in labels}
    if calibration.is_pii(task):
        pii = calibration.pii
        min_chars = {label: int(pii.min_chars[label]) for label in labels if label in pii.min_chars}
        min_words = {label: int(pii.min_words[label]) for label in labels if label in pii.min_words}
        gate: float | None = float(pii.sparse_gate)
    else:
        min_chars, min_words, gate = {}, {}, None
    return SpanRules(
        thresholds=thresholds,
        overlap=calibration.overlap(task),
        min_chars=min_chars,
        min_words=min_words,
        sparse_gate=gate,
    )


def _validate(
    text: str, offsets: np.ndarray, probs: np.ndarray, labels: list[str], segments: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check shapes and offsets; return (offsets int64 (W, 2), probs (W, L), segments int64 (W,))."""
    offsets = np.asarray(offsets)
    probs = np.asarray(probs)
    n_labels = len(labels)
    if offsets.ndim != 2 or offsets.shape[1] != 2:
        raise ValueError(f"offsets has shape {offsets.shape}; expected (W, 2)")
    n_words = offsets.shape[0]
    if probs.shape != (n_words, n_labels):
        raise ValueError(f"probs has shape {probs.shape}; expected (W={n_words}, L={n_labels})")
    if n_words and not np.issubdtype(offsets.dtype, np.integer):
        raise ValueError(f"offsets must be integers; got dtype {offsets.dtype}")
    if probs.size and not np.issubdtype(probs.dtype, np.floating):
        raise ValueError(f"probs must be floats; got dtype {probs.dtype}")
    if probs.size and not np.isfinite(probs).all():
        raise ValueError("probs contains non-finite values")
    offsets = offsets.astype(np.int64, copy=False).reshape(n_words, 2)
    if n_words:
        starts, ends = offsets[:, 0], offsets[:, 1]
        if starts.min() < 0 or ends.max() > len(text) or (ends < starts).any():
            raise ValueError(f"offsets must satisfy 0 <= start <= end <= len(text)={len(text)}")
        if (starts[1:] < ends[:-1]).any():
            raise ValueError("offsets must be in order and non-overlapping")
    if segments is None:
        seg = np.zeros(n_words, dtype=np.int64)
    else:
        seg = np.asarray(segments)
        if seg.shape != (n_words,):
            raise ValueError(f"segments has shape {seg.shape}; expected (W={n_words},)")
        if n_words and not np.issubdtype(seg.dtype, np.integer):
            raise ValueError(f"segments must be integers; got dtype {seg.dtype}")
        seg = seg.astype(np.int64, copy=False)
        if n_words and seg.min() < EXCLUDED_SEGMENT:
            raise ValueError(f"segment ids must be >= {EXCLUDED_SEGMENT}; got {int(seg.min())}")
    return offsets, probs, seg


def _find_runs(probs: np.ndarray, thr: np.ndarray, seg: np.ndarray) -> tuple[np.ndarray, ...]:
    """All maximal runs, vectorised over words and labels.

    probs: (W, L); thr: (L,) float64; seg: (W,) int64.
    Returns (label, first, last, score) arrays of equal length R, ordered by (label, first);
    `last` is inclusive and `score` the run's mean probability (float64).
    """
    n_words, n_labels = probs.shape
    inside = (probs >= thr[None, :]) & (seg != EXCLUDED_SEGMENT)[:, None]  # (W, L) bool
    # A run cannot continue from word w-1 to word w across a segment change.
    joins = np.zeros(n_words + 1, dtype=bool)  # joins[w]: words w-1 and w share a segment
    joins[1:-1] = seg[1:] == seg[:-1]
    prev_in = np.zeros_like(inside)
    prev_in[1:] = inside[:-1] & joins[1:-1, None]
    next_in = np.zeros_like(inside)
    next_in[:-1] = inside[1:] & joins[1:-1, None]
    # Transposed so np.nonzero orders runs by label, then word; starts and ends then pair up 1:1.
    start_l, first = np.nonzero((inside & ~prev_in).T)
    _, last = np.nonzero((inside & ~next_in).T)
    if first.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, np.zeros(0, dtype=np.float64)
    # Run sums by reduceat over the label-major flattening; a trailing 0 lets `last + 1` hit the end.
    flat = np.concatenate([np.ascontiguousarray(probs.T, dtype=np.float64).ravel(), [0.0]])
    bounds = np.empty(2 * first.size, dtype=np.int64)
    bounds[0::2] = start_l * n_words + first
    bounds[1::2] = start_l * n_words + last + 1
    sums = np.add.reduceat(flat, bounds)[0::2]  # odd slots are the gaps between runs
    score = sums / (last - first + 1)
    return start_l, first, last, score


class _Runs(NamedTuple):
    """Candidate spans, one entry per run (each field (R,)): label index, first and last word
    (inclusive), mean word probability, character start and end (exclusive)."""

    lab: np.ndarray
    first: np.ndarray
    last: np.ndarray
    score: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def take(self, keep: np.ndarray) -> _Runs:
        """The runs where `keep` (R,) bool is True."""
        return _Runs(*(a[keep] for a in self))


def _length_rule(runs: _Runs, labels: list[str], rules: SpanRules) -> _Runs:
    """Drop the runs shorter than their label's min_chars / min_words (rule 3, PII)."""
    # vectorised per-run minimums, 0 where the label has none
    min_c = np.array([rules.min_chars.get(x, 0) for x in labels], dtype=np.int64)
    min_w = np.array([rules.min_words.get(x, 0) for x in labels], dtype=np.int64)
    return runs.take(((runs.end - runs.start) >= min_c[runs.lab]) & ((runs.last - runs.first + 1) >= min_w[runs.lab]))


def _flat(runs: _Runs, n_words: int) -> _Runs:
    """Greedily by score, the runs that share no word with a run kept before them (rule 4, flat)."""
    # np.lexsort sorts by the last key first: score desc, length desc, start asc, label asc.
    # Scores are compared at 1e-9 so that equal means summed in another order still tie.
    order = np.lexsort((runs.lab, runs.start, -(runs.end - runs.start), -np.round(runs.score, 9)))
    taken = bytearray(n_words)  # 1 = word already inside a kept span
    keep = np.zeros(runs.lab.size, dtype=bool)
    for i, w0, w1 in zip(order.tolist(), runs.first[order].tolist(), runs.last[order].tolist(), strict=True):
        if taken.find(1, w0, w1 + 1) == -1:  # shares no word with a kept span
            taken[w0 : w1 + 1] = b"\x01" * (w1 + 1 - w0)
            keep[i] = True
    return runs.take(keep)


def decode_spans(
    text: str,
    offsets: np.ndarray,
    probs: np.ndarray,
    labels: list[str],
    rules: SpanRules,
    segments: np.ndarray | None = None,
) -> tuple[list[SpanOut], bool]:
    """Decode the spans of one text and one span question (contract in the module docstring).

    text: the string the offsets point into.
    offsets: (W, 2) int, char [start, end) of each word, in order, non-overlapping.
    probs: (W, L) float, calibrated probability of word w for label l (L = len(labels)).
    segments: (W,) int or None; runs stay within one segment id; id -1 excludes the word;
        None = all words in one segment.
    Returns (spans, gate_fired).
    """
    offsets, probs, seg = _validate(text, offsets, probs, labels, segments)
    n_words = offsets.shape[0]

    if rules.sparse_gate is not None:
        allowed = probs[seg != EXCLUDED_SEGMENT]  # (W', L)
        if n_words == 0 or allowed.size == 0 or float(allowed.max()) < rules.sparse_gate:
            return [], True

    thr = np.array([rules.thresholds.get(lab, GENERIC_SPAN_THRESHOLD) for lab in labels], dtype=np.float64)
    lab, first, last, score = _find_runs(probs, thr, seg)
    runs = _Runs(lab, first, last, score, offsets[first, 0], offsets[last, 1])
    if rules.min_chars or rules.min_words:
        runs = _length_rule(runs, labels, rules)
    if rules.overlap == "flat" and runs.lab.size > 1:
        runs = _flat(runs, n_words)

    order = np.lexsort((runs.lab, -runs.end, runs.start))
    spans = [
        SpanOut(label=labels[j], start=s, end=e, text=text[s:e], score=sc)
        for j, s, e, sc in zip(
            runs.lab[order].tolist(),
            runs.start[order].tolist(),
            runs.end[order].tolist(),
            runs.score[order].tolist(),
            strict=True,
        )
    ]
    return spans, False


def span_answer(row: Row, offsets: np.ndarray, q: int, task: str, logits: np.ndarray, cal: Calibration) -> Answer:
    """The answer to span question `q` of `row` from its raw word x label `logits` ((W, K) over the
    words at `offsets` (W, 2)): calibrated probabilities, decoded spans (field-relative offsets in a
    row with fields), each label's probability (its max over the words it may span), the PII gate,
    and the units when the row asks. The worker's, predict()'s and the fake worker's stub's."""
    labels = row.questions[q].labels or []
    probs = sigmoid(logits.astype(np.float64) / cal.T_span)  # (W, K)
    seg = field_segments(row, offsets, row.questions[q].fields)
    spans, gate = decode_spans(row.text, offsets, probs, labels, rules_for(cal, task, labels), seg)
    if row.fields:
        spans = [_to_field(s, row) for s in spans]
    visible = probs if seg is None else probs[seg >= 0]
    answer = Answer(
        question=q, task=task,
        probs={lab: float(visible[:, k].max()) if visible.shape[0] else 0.0 for k, lab in enumerate(labels)},
        spans=spans, gate_fired=gate if cal.is_pii(task) else None,
    )
    if row.units:
        answer.units = Units(
            offsets=[tuple(o) for o in offsets.tolist()],
            probs={lab: probs[:, k].tolist() for k, lab in enumerate(labels)},
            logits={lab: logits[:, k].tolist() for k, lab in enumerate(labels)} if row.logits else None,
        )
    return answer


def _to_field(span: SpanOut, row: Row) -> SpanOut:
    for f in row.fields or []:
        if f.start <= span.start and span.end <= f.end:
            return span.model_copy(update={"field": f.name, "start": span.start - f.start,
                                           "end": span.end - f.start})
    raise AssertionError(f"span {span} lies outside every field")  # decode_spans keeps runs in a field
