"""Span decoding: hand-computed cases, rules_for against a Calibration, and hypothesis properties."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vela2.model.calibration import Calibration, PiiRules
from vela2.text.spans import SpanRules, decode_spans, rules_for

WORD_RE = re.compile(r"\w+(?:[-_]\w+)*|\S")


def words_of(text: str) -> np.ndarray:
    """(W, 2) char offsets of the words of `text`, as the renderer splits them."""
    return np.array([m.span() for m in WORD_RE.finditer(text)], dtype=np.int64).reshape(-1, 2)


def rules(
    thr: dict[str, float],
    overlap: str = "nested",
    min_chars: dict[str, int] | None = None,
    min_words: dict[str, int] | None = None,
    gate: float | None = None,
) -> SpanRules:
    return SpanRules(thr, overlap, min_chars or {}, min_words or {}, gate)


def triples(spans) -> list[tuple[str, int, int, str]]:
    return [(s.label, s.start, s.end, s.text) for s in spans]


# --- hand-computed cases -----------------------------------------------------------------------

TEXT = "Ann Lee met Bob at Acme Corp today"  # 8 words
OFFS = words_of(TEXT)


def test_words_fixture():
    assert [TEXT[s:e] for s, e in OFFS] == ["Ann", "Lee", "met", "Bob", "at", "Acme", "Corp", "today"]


def test_runs_and_mean_score():
    p = np.array([[0.9, 0.6, 0.1, 0.7, 0.2, 0.1, 0.1, 0.55]]).T  # (8, 1)
    spans, fired = decode_spans(TEXT, OFFS, p, ["person"], rules({"person": 0.5}))
    assert fired is False
    assert triples(spans) == [
        ("person", 0, 7, "Ann Lee"),
        ("person", 12, 15, "Bob"),
        ("person", 29, 34, "today"),
    ]
    # score = mean of the run's probabilities, not the max
    assert spans[0].score == pytest.approx(0.75)
    assert spans[1].score == pytest.approx(0.7)
    assert type(spans[0].score) is float


def test_threshold_equal_counts_as_in():
    p = np.array([[0.5, 0.4999, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0]], dtype=np.float32).T
    spans, _ = decode_spans(TEXT, OFFS, p, ["x"], rules({"x": 0.5}))
    assert triples(spans) == [("x", 0, 3, "Ann"), ("x", 8, 15, "met Bob")]
    assert spans[1].score == 0.5


def test_per_label_thresholds_and_missing_label_default():
    p = np.array([[0.3] * 8, [0.45] * 8]).T  # (8, 2)
    spans, _ = decode_spans(TEXT, OFFS, p, ["a", "b"], rules({"a": 0.3}))  # b falls back to 0.5
    assert triples(spans) == [("a", 0, len(TEXT), TEXT)]


OVERLAP_P = np.array(
    [
        # person: "Acme Corp" (mean 0.7); org: "at Acme Corp" (mean 0.8)
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.6, 0.8, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.7, 0.9, 0.8, 0.0],
    ]
).T


def test_nested_keeps_overlapping_labels():
    spans, _ = decode_spans(TEXT, OFFS, OVERLAP_P, ["person", "org"], rules({"person": 0.5, "org": 0.5}))
    # sorted by (start, -end, label index)
    assert triples(spans) == [("org", 16, 28, "at Acme Corp"), ("person", 19, 28, "Acme Corp")]


def test_flat_keeps_higher_score():
    r = rules({"person": 0.5, "org": 0.5}, overlap="flat")
    spans, _ = decode_spans(TEXT, OFFS, OVERLAP_P, ["person", "org"], r)
    assert triples(spans) == [("org", 16, 28, "at Acme Corp")]
    assert spans[0].score == pytest.approx(0.8)


def test_flat_keeps_disjoint_spans_of_both_labels():
    p = np.array([[0.9, 0.9, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.6, 0.6, 0.0]]).T
    r = rules({"a": 0.5, "b": 0.5}, overlap="flat")
    spans, _ = decode_spans(TEXT, OFFS, p, ["a", "b"], r)
    assert triples(spans) == [("a", 0, 7, "Ann Lee"), ("b", 19, 28, "Acme Corp")]


def test_flat_tie_break():
    # Equal scores (0.75). "a" = "Lee met" (7 chars), "b" = "met Bob" (7 chars), "c" = "Bob" (3 chars).
    p = np.zeros((8, 3))
    p[1:3, 0] = 0.75
    p[2:4, 1] = 0.75
    p[3, 2] = 0.75
    r = rules({"a": 0.5, "b": 0.5, "c": 0.5}, overlap="flat")
    spans, _ = decode_spans(TEXT, OFFS, p, ["a", "b", "c"], r)
    # a and b tie on score and length; a starts earlier and wins; b shares "met" and goes;
    # c ("Bob") shares no word with a and stays.
    assert triples(spans) == [("a", 4, 11, "Lee met"), ("c", 12, 15, "Bob")]
    # Longer first: make b longer ("met Bob at") at the same mean; it now beats a and c.
    p[4, 1] = 0.75
    spans, _ = decode_spans(TEXT, OFFS, p, ["a", "b", "c"], r)
    assert triples(spans) == [("b", 8, 18, "met Bob at")]
    # Same span, same score, two labels: the earlier label in `labels` wins.
    q = np.zeros((8, 2))
    q[3, :] = 0.8
    spans, _ = decode_spans(TEXT, OFFS, q, ["y", "x"], rules({"x": 0.5, "y": 0.5}, overlap="flat"))
    assert triples(spans) == [("y", 12, 15, "Bob")]


def test_length_rule_chars_and_words():
    p = np.array([[0.9, 0.9, 0.0, 0.9, 0.0, 0.9, 0.9, 0.0]]).T  # "Ann Lee" (7), "Bob" (3), "Acme Corp" (9)
    spans, _ = decode_spans(TEXT, OFFS, p, ["x"], rules({"x": 0.5}, min_chars={"x": 4}))
    assert triples(spans) == [("x", 0, 7, "Ann Lee"), ("x", 19, 28, "Acme Corp")]
    spans, _ = decode_spans(TEXT, OFFS, p, ["x"], rules({"x": 0.5}, min_chars={"x": 8}))
    assert triples(spans) == [("x", 19, 28, "Acme Corp")]
    spans, _ = decode_spans(TEXT, OFFS, p, ["x"], rules({"x": 0.5}, min_chars={"x": 3}))  # 3 >= 3 kept
    assert len(spans) == 3
    spans, _ = decode_spans(TEXT, OFFS, p, ["x"], rules({"x": 0.5}, min_words={"x": 2}))
    assert triples(spans) == [("x", 0, 7, "Ann Lee"), ("x", 19, 28, "Acme Corp")]
    # a rule for another label does not touch this one
    spans, _ = decode_spans(TEXT, OFFS, p, ["x"], rules({"x": 0.5}, min_words={"other": 5}))
    assert len(spans) == 3


def test_length_rule_runs_before_flat_overlap():
    # org "Acme" (1 word, 0.95) would win flat against person "Acme Corp" (0.9) but is dropped first.
    p = np.zeros((8, 2))
    p[5:7, 0] = 0.9
    p[5, 1] = 0.95
    r = rules({"person": 0.5, "org": 0.5}, overlap="flat", min_words={"org": 2})
    spans, _ = decode_spans(TEXT, OFFS, p, ["person", "org"], r)
    assert triples(spans) == [("person", 19, 28, "Acme Corp")]


def test_sparse_gate():
    p = np.full((8, 2), 0.1)
    p[3, 1] = 0.55
    base = {"a": 0.5, "b": 0.5}
    spans, fired = decode_spans(TEXT, OFFS, p, ["a", "b"], rules(base, gate=0.6))
    assert (spans, fired) == ([], True)
    spans, fired = decode_spans(TEXT, OFFS, p, ["a", "b"], rules(base, gate=0.55))  # max == gate: passes
    assert fired is False and triples(spans) == [("b", 12, 15, "Bob")]
    # non-PII rules (gate None): never fires, even with all probabilities tiny
    spans, fired = decode_spans(TEXT, OFFS, np.full((8, 2), 0.01), ["a", "b"], rules(base))
    assert (spans, fired) == ([], False)
    # the gate looks at allowed words only: the 0.55 word is a header (-1) here
    seg = np.array([0, 0, 0, -1, 0, 0, 0, 0])
    spans, fired = decode_spans(TEXT, OFFS, p, ["a", "b"], rules(base, gate=0.5), segments=seg)
    assert (spans, fired) == ([], True)


def test_segments_split_runs_and_exclude_headers():
    p = np.full((8, 1), 0.9)
    seg = np.array([0, 0, -1, 1, 1, 1, 2, 2])
    spans, _ = decode_spans(TEXT, OFFS, p, ["x"], rules({"x": 0.5}), segments=seg)
    assert triples(spans) == [
        ("x", 0, 7, "Ann Lee"),
        ("x", 12, 23, "Bob at Acme"),
        ("x", 24, 34, "Corp today"),
    ]
    # A run never crosses a segment change, even when the ids come back to an earlier value.
    seg = np.array([0, 1, 0, 0, 0, 0, 0, 0])
    spans, _ = decode_spans(TEXT, OFFS, p, ["x"], rules({"x": 0.5}), segments=seg)
    assert triples(spans) == [("x", 0, 3, "Ann"), ("x", 4, 7, "Lee"), ("x", 8, 34, TEXT[8:])]


def test_empty_input():
    empty_o, empty_p = np.zeros((0, 2), dtype=np.int64), np.zeros((0, 2))
    assert decode_spans("", empty_o, empty_p, ["a", "b"], rules({"a": 0.5})) == ([], False)
    assert decode_spans("", empty_o, empty_p, ["a", "b"], rules({"a": 0.5}, gate=0.0)) == ([], True)
    assert decode_spans("   ", empty_o, empty_p, ["a", "b"], rules({}), segments=np.zeros(0, int)) == (
        [],
        False,
    )
    # words but no labels
    assert decode_spans(TEXT, OFFS, np.zeros((8, 0)), [], rules({})) == ([], False)
    # every word a header
    spans, fired = decode_spans(
        TEXT, OFFS, np.full((8, 1), 0.9), ["x"], rules({"x": 0.5}, gate=0.1), segments=np.full(8, -1)
    )
    assert (spans, fired) == ([], True)


@pytest.mark.parametrize(
    ("offsets", "probs", "segments", "message"),
    [
        (OFFS, np.zeros((8, 3)), None, r"probs has shape \(8, 3\); expected \(W=8, L=2\)"),
        (OFFS, np.zeros((5, 2)), None, r"probs has shape \(5, 2\); expected \(W=8, L=2\)"),
        (OFFS, np.zeros(8), None, r"probs has shape \(8,\); expected \(W=8, L=2\)"),
        (OFFS[:, :1], np.zeros((8, 2)), None, r"offsets has shape \(8, 1\); expected \(W, 2\)"),
        (OFFS.ravel(), np.zeros((8, 2)), None, r"offsets has shape \(16,\); expected \(W, 2\)"),
        (OFFS, np.zeros((8, 2)), np.zeros(7, int), r"segments has shape \(7,\); expected \(W=8,\)"),
        (OFFS, np.zeros((8, 2)), np.full(8, -2), r"segment ids must be >= -1; got -2"),
        (OFFS + 100, np.zeros((8, 2)), None, r"len\(text\)=34"),
        (OFFS[::-1], np.zeros((8, 2)), None, r"in order and non-overlapping"),
        (OFFS, np.full((8, 2), np.nan), None, r"non-finite"),
    ],
)
def test_bad_shapes_raise(offsets, probs, segments, message):
    with pytest.raises(ValueError, match=message):
        decode_spans(TEXT, offsets, probs, ["a", "b"], rules({"a": 0.5}), segments=segments)


def test_bad_overlap_policy_raises():
    with pytest.raises(ValueError, match=r"overlap must be one of \['flat', 'nested'\]; got 'both'"):
        rules({}, overlap="both")


def test_deterministic_and_inputs_untouched():
    rng = np.random.default_rng(0)
    p = rng.random((8, 3))
    before = p.copy()
    r = rules({"a": 0.4, "b": 0.5, "c": 0.6}, overlap="flat")
    first = decode_spans(TEXT, OFFS, p, ["a", "b", "c"], r)
    assert first == decode_spans(TEXT, OFFS, p, ["a", "b", "c"], r)
    assert np.array_equal(p, before)


# --- rules_for ---------------------------------------------------------------------------------


@pytest.fixture
def calibration() -> Calibration:
    return Calibration(
        span_thresholds={
            "span:pii_dev": {"person": 0.42, "email": 0.61},
            "span:halu": {"hallucination": 0.33, "*": 0.4},
        },
        pii=PiiRules(
            tasks=["pii*"],
            min_chars={"person": 3, "phone": 7},
            min_words={"person": 1, "address": 2},
            sparse_gate=0.25,
        ),
    )


def test_rules_for_pii_task(calibration):
    r = rules_for(calibration, "span:pii_dev", ["person", "email", "address"])
    assert r.thresholds == {"person": 0.42, "email": 0.61, "address": 0.5}  # address: span:* default
    assert r.overlap == "flat"  # PII default
    assert r.min_chars == {"person": 3}  # phone is not asked for
    assert r.min_words == {"person": 1, "address": 2}
    assert r.sparse_gate == 0.25


def test_rules_for_non_pii_task(calibration):
    r = rules_for(calibration, "span:halu", ["hallucination", "other"])
    assert r.thresholds == {"hallucination": 0.33, "other": 0.4}  # the task's "*" entry
    assert r.overlap == "nested"
    assert (r.min_chars, r.min_words, r.sparse_gate) == ({}, {}, None)


def test_rules_for_unknown_task_and_overlap_override(calibration):
    calibration.span_overlap["span:pii_dev"] = "nested"
    calibration.span_overlap["span:toxic"] = "flat"
    assert rules_for(calibration, "span:pii_dev", ["person"]).overlap == "nested"
    r = rules_for(calibration, "span:toxic", ["toxic"])
    assert r.thresholds == {"toxic": 0.5} and r.overlap == "flat" and r.sparse_gate is None


def test_rules_for_drives_decoding(calibration):
    p = np.array([[0.45, 0.45, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]).T  # above 0.42, below 0.5
    pii = rules_for(calibration, "span:pii_dev", ["person"])
    spans, fired = decode_spans(TEXT, OFFS, p, ["person"], pii)
    assert fired is False and triples(spans) == [("person", 0, 7, "Ann Lee")]
    spans, fired = decode_spans(TEXT, OFFS, p * 0.5, ["person"], pii)  # max 0.225 < gate 0.25
    assert (spans, fired) == ([], True)
    generic = rules_for(calibration, "span:fewnerd", ["person"])
    assert decode_spans(TEXT, OFFS, p, ["person"], generic) == ([], False)


# --- property tests ----------------------------------------------------------------------------

PROB_VALUES = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]  # includes the exact thresholds used below
THRESHOLDS = [0.3, 0.5, 0.7]


@st.composite
def cases(draw):
    n_words = draw(st.integers(0, 14))
    n_labels = draw(st.integers(1, 3))
    words = draw(st.lists(st.text("abcXYZ", min_size=1, max_size=6), min_size=n_words, max_size=n_words))
    seps = draw(st.lists(st.sampled_from([" ", "  ", ", ", "\n"]), min_size=n_words, max_size=n_words))
    text, offsets = draw(st.sampled_from(["", " "])), []
    for w, sep in zip(words, seps, strict=True):
        offsets.append((len(text), len(text) + len(w)))
        text += w + sep
    offsets = np.array(offsets, dtype=np.int64).reshape(-1, 2)
    if draw(st.booleans()):
        flat = draw(st.lists(st.floats(0, 1), min_size=n_words * n_labels, max_size=n_words * n_labels))
    else:
        flat = draw(
            st.lists(st.sampled_from(PROB_VALUES), min_size=n_words * n_labels, max_size=n_words * n_labels)
        )
    probs = np.array(flat, dtype=np.float64).reshape(n_words, n_labels)
    if draw(st.booleans()):
        segments = np.array(draw(st.lists(st.integers(-1, 2), min_size=n_words, max_size=n_words)), int)
    else:
        segments = None
    labels = [f"L{i}" for i in range(n_labels)]
    thr = {lab: draw(st.sampled_from(THRESHOLDS)) for lab in labels}
    return text, offsets, probs, labels, thr, segments


def reference_runs(probs, labels, thr, segments):
    """Naive per-word loop: maximal runs as (label index, first word, last word)."""
    n_words = probs.shape[0]
    seg = np.zeros(n_words, int) if segments is None else segments
    runs = []
    for j, lab in enumerate(labels):
        w = 0
        while w < n_words:
            if seg[w] != -1 and probs[w, j] >= thr.get(lab, 0.5):
                first = w
                while w + 1 < n_words and seg[w + 1] == seg[first] and probs[w + 1, j] >= thr.get(lab, 0.5):
                    w += 1
                runs.append((j, first, w))
            w += 1
    return runs


def reference_decode(text, offsets, probs, labels, r: SpanRules, segments):
    """A slow, obvious implementation of the contract to compare against."""
    if r.sparse_gate is not None:
        seg = np.zeros(len(offsets), int) if segments is None else segments
        vals = [probs[w, j] for w in range(len(offsets)) if seg[w] != -1 for j in range(len(labels))]
        if not vals or max(vals) < r.sparse_gate:
            return [], True
    cands = []
    for j, a, b in reference_runs(probs, labels, r.thresholds, segments):
        start, end = int(offsets[a, 0]), int(offsets[b, 1])
        lab = labels[j]
        if end - start < r.min_chars.get(lab, 0) or b - a + 1 < r.min_words.get(lab, 0):
            continue
        cands.append((float(np.mean(probs[a : b + 1, j])), j, a, b, start, end))
    if r.overlap == "flat":
        kept, used = [], set()
        for c in sorted(cands, key=lambda c: (-round(c[0], 9), -(c[5] - c[4]), c[4], c[1])):
            if used.isdisjoint(range(c[2], c[3] + 1)):
                kept.append(c)
                used.update(range(c[2], c[3] + 1))
        cands = kept
    cands.sort(key=lambda c: (c[4], -c[5], c[1]))
    return [(labels[c[1]], c[4], c[5], c[0]) for c in cands], False


rules_strategy = st.builds(
    SpanRules,
    thresholds=st.just({}),  # replaced per case
    overlap=st.sampled_from(["flat", "nested"]),
    min_chars=st.dictionaries(st.sampled_from(["L0", "L1", "L2"]), st.integers(0, 8), max_size=2),
    min_words=st.dictionaries(st.sampled_from(["L0", "L1", "L2"]), st.integers(0, 3), max_size=2),
    sparse_gate=st.one_of(st.none(), st.sampled_from([0.0, 0.5, 0.9, 1.0])),
)


@settings(max_examples=300, deadline=None)
@given(case=cases(), base=rules_strategy)
def test_properties(case, base):
    text, offsets, probs, labels, thr, segments = case
    r = SpanRules(thr, base.overlap, base.min_chars, base.min_words, base.sparse_gate)
    spans, fired = decode_spans(text, offsets, probs, labels, r, segments)
    seg = np.zeros(len(offsets), int) if segments is None else segments
    starts = {int(s): i for i, s in enumerate(offsets[:, 0])}
    ends = {int(e): i for i, e in enumerate(offsets[:, 1])}

    if r.sparse_gate is None:
        assert fired is False
    if fired:
        assert spans == []
    for s in spans:
        assert s.text == text[s.start : s.end]
        assert s.start in starts and s.end in ends  # word boundaries
        a, b, j = starts[s.start], ends[s.end], labels.index(s.label)
        assert a <= b
        words = range(a, b + 1)
        assert all(probs[w, j] >= thr[s.label] for w in words)
        assert all(seg[w] == seg[a] != -1 for w in words)
        assert s.score == pytest.approx(float(np.mean(probs[a : b + 1, j])), rel=1e-12, abs=1e-12)
        # Spans are whole runs (never trimmed): the neighbours in the same segment are below threshold.
        if a > 0 and seg[a - 1] == seg[a]:
            assert probs[a - 1, j] < thr[s.label]
        if b + 1 < len(offsets) and seg[b + 1] == seg[a]:
            assert probs[b + 1, j] < thr[s.label]
    keys = [(s.start, -s.end, labels.index(s.label)) for s in spans]
    assert keys == sorted(keys)
    if r.overlap == "flat":
        used: set[int] = set()
        for s in spans:
            words = set(range(starts[s.start], ends[s.end] + 1))
            assert used.isdisjoint(words)
            used |= words
    if r.overlap == "nested" and not r.min_chars and not r.min_words and not fired:
        # strict maximality: every maximal run is a span, and nothing else
        expected = sorted(
            (labels[j], int(offsets[a, 0]), int(offsets[b, 1]))
            for j, a, b in reference_runs(probs, labels, thr, segments)
        )
        assert sorted((s.label, s.start, s.end) for s in spans) == expected
    # the whole contract against the obvious implementation
    ref, ref_fired = reference_decode(text, offsets, probs, labels, r, segments)
    assert fired == ref_fired
    assert [(s.label, s.start, s.end) for s in spans] == [x[:3] for x in ref]
    assert [s.score for s in spans] == pytest.approx([x[3] for x in ref], rel=1e-12, abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_words=st.integers(1, 400),
    n_labels=st.integers(1, 8),
    overlap=st.sampled_from(["flat", "nested"]),
)
def test_matches_reference_on_larger_inputs(seed, n_words, n_labels, overlap):
    rng = np.random.default_rng(seed)
    text = " ".join(["w" * int(k) for k in rng.integers(1, 5, n_words)])
    offsets = words_of(text)
    probs = rng.beta(0.5, 0.5, (n_words, n_labels)).astype(np.float32)
    segments = np.sort(rng.integers(-1, 3, n_words))
    labels = [f"L{i}" for i in range(n_labels)]
    r = rules({lab: 0.5 for lab in labels}, overlap=overlap, min_words={"L0": 2})
    spans, _ = decode_spans(text, offsets, probs, labels, r, segments)
    ref, _ = reference_decode(text, offsets, probs, labels, r, segments)
    assert [(s.label, s.start, s.end) for s in spans] == [x[:3] for x in ref]
    assert [s.score for s in spans] == pytest.approx([x[3] for x in ref], rel=1e-6)


def test_long_text_many_labels():
    """65k words x 64 labels decode in one vectorised pass and agree with the per-label loop."""
    rng = np.random.default_rng(7)
    n_words, n_labels = 65_536, 64
    text = " ".join(["ab"] * n_words)
    offsets = np.stack([np.arange(n_words) * 3, np.arange(n_words) * 3 + 2], axis=1)
    probs = rng.random((n_words, n_labels), dtype=np.float32)
    labels = [f"L{i}" for i in range(n_labels)]
    r = rules({lab: 0.99 for lab in labels})
    spans, fired = decode_spans(text, offsets, probs, labels, r)
    assert fired is False
    inside = probs.astype(np.float64) >= 0.99  # the decoder compares in float64
    n_runs = int((inside & ~np.vstack([np.zeros((1, n_labels), bool), inside[:-1]])).sum())
    assert len(spans) == n_runs
    assert all(s.text == text[s.start : s.end] for s in spans[:1000])
