"""predict() on the demo model: bundled == single, batched == alone (fp32, <= 1e-5), bad rows next to
good ones, precisions, and long texts (windows, span merge, option pooling, units, the word limit)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import vela2
from vela2.api.schemas import Answer, RowResult, SpanOut, parse_row, surrogate_index
from vela2.config import LIMITS
from vela2.errors import InvalidRequest, LimitExceeded, PrecisionError
from vela2.model.calibration import option_value
from vela2.scoring import pipeline
from vela2.scoring import predict as predict_module
from vela2.scoring.pipeline import SeqOutput, finish, merge_span_windows, pool_option_windows, prepare, run_batch
from vela2.text.rendering import RenderedRow, Sequence, split_words
from vela2.train.demo_model import sample_rows

TOL = 1e-5  # fp32 on the demo model: bundled / batched / alone agree to this (max |prob diff|)
# Raw logits are unbounded (the trained demo's reach ~40, where an fp32 ulp is 3.8e-6): they are held
# to TOL relative to their size, so a few ulps of batch-shape-dependent rounding do not fail a test.

TEXT = (
    "Alice Smith from Acme wrote to bob@globex.com on Monday. She asked whether the refund for "
    "order 4471 was sent, and said the support team at Initech was very helpful."
)
FILLER = (
    "the of and to in is was for on that with as by at from it be this are or an have not which "
    "company market report price bank city police court party group water school health data "
    "question answer person email phone address account number name team game music film"
).split()


def flat(res) -> dict[str, Any]:
    """Every number and decision of a result, keyed by where it sits (for exact-key comparisons)."""
    assert res.status == "ok", res
    out: dict[str, Any] = {}
    for i, a in enumerate(res.answers):
        for k, v in a.probs.items():
            out[f"{i}.probs.{k}"] = v
        out[f"{i}.decision"] = a.decision
        for key in ("abstain_probability", "expected", "gate_fired"):
            out[f"{i}.{key}"] = getattr(a, key)
        if a.spans is not None:
            out[f"{i}.spans"] = [(s.label, s.start, s.end, s.text) for s in a.spans]
            for j, s in enumerate(a.spans):
                out[f"{i}.span{j}.score"] = s.score
        if a.units is not None:
            out[f"{i}.offsets"] = a.units.offsets
            for k, v in a.units.probs.items():
                out[f"{i}.units.{k}"] = np.array(v)
        if a.logits is not None:
            out[f"{i}.logits"] = np.array(a.logits)
    return out


def assert_close(a, b, tol: float = TOL) -> float:
    """Same keys, same decisions / spans / offsets, numbers within `tol` (logits relative to their size,
    see TOL); returns the max diff."""
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys()
    worst = 0.0
    for k in fa:
        x, y = fa[k], fb[k]
        if isinstance(x, float | np.ndarray) and not isinstance(x, bool):
            diff = np.abs(np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64))
            if k.endswith("logits"):
                diff = diff / np.maximum(1.0, np.abs(np.asarray(x, dtype=np.float64)))
            d = float(np.max(diff)) if np.size(x) else 0.0
            assert d <= tol, (k, d)
            worst = max(worst, d)
        else:
            assert x == y, k
    return worst


def single_rows(row: dict) -> list[dict]:
    """Each question of a bundled row asked alone, as its own row."""
    out = []
    for i, q in enumerate(row["questions"]):
        q = dict(q)
        out.append({**row, "id": f"{row['id']}-q{i}", "task": q.pop("task", row["task"]), "questions": [q]})
    return out


BUNDLES = [
    {
        "id": "b1",
        "task": "choice:oasst1",
        "text": TEXT,
        "units": True,
        "questions": [
            {"question": "Is the tone polite?", "options": ["yes", "no"]},
            {"question": "What is the topic?", "options": ["finance", "sports", "support"]},
            {"task": "span:ents", "labels": ["person", "company"]},
        ],
    },
    {
        "id": "b2",
        "task": "score:helpsteer2",
        "text": TEXT,
        "units": True,
        "logits": True,
        "questions": [
            {"options": ["0", "1", "2", "3", "4"]},
            {"task": "set:shield", "options": ["violence", "self-harm", "hate", "privacy"]},
            {"task": "span:pii_dev", "labels": ["person", "email", "phone"]},
            {"task": "choice:boolq", "question": "Was the refund sent?", "options": ["yes", "no"]},
        ],
    },
]


LONG_BUNDLE = dict(BUNDLES[1], id="b3-long", text=" ".join([TEXT] * 30))  # several windows


@pytest.mark.parametrize("row", [*BUNDLES, LONG_BUNDLE], ids=lambda r: r["id"])
def test_bundled_equals_single(demo_model, row):
    (bundled,) = vela2.predict(demo_model, [row], precision="fp32")
    singles = [vela2.predict(demo_model, [r], precision="fp32")[0] for r in single_rows(row)]
    windows = {len(prepare(demo_model, r).sequences) for r in [row, *single_rows(row)]}
    assert len(windows) == 1, f"window plans differ between the bundle and its questions: {windows}"
    for i, s in enumerate(singles):
        one = bundled.model_copy(update={"answers": [bundled.answers[i].model_copy(update={"question": 0})]})
        assert_close(one, s)


def test_batched_equals_alone(demo_model):
    rows = [dict(r, units=True) for r in [*sample_rows(), *BUNDLES]]
    alone = [vela2.predict(demo_model, [r], precision="fp32")[0] for r in rows]
    # default budget (one padded batch), one sequence per batch, packed rows (block-diagonal mask)
    for kw in ({}, {"max_batch_tokens": 1}, {"row_tokens": 1024}):
        together = vela2.predict(demo_model, rows[::-1], precision="fp32", **kw)[::-1]
        assert [r.id for r in together] == [r["id"] for r in rows]
        for a, b in zip(together, alone, strict=True):
            assert_close(a, b)


def test_run_ahead_yields_each_batch_as_run_batch_does(demo_model, monkeypatch):
    """pipeline.run_ahead (predict()'s loop): every batch's outputs, in order, equal to run_batch's;
    batch N+1 is launched before batch N is collected, and every launched batch is collected."""
    seqs = [s for r in [*sample_rows(), *BUNDLES] for s in prepare(demo_model, r).sequences]
    batches = [seqs[:3], seqs[3:4], seqs[4:9]]
    events: list[str] = []
    real_launch = pipeline.launch_batch

    def launch(model, sequences, *args, **kwargs):
        launched = real_launch(model, sequences, *args, **kwargs)
        events.append(f"launch {len(sequences)}")
        real_outputs = launched.outputs
        launched.outputs = lambda: (events.append(f"collect {len(sequences)}"), real_outputs())[1]
        return launched

    monkeypatch.setattr(pipeline, "launch_batch", launch)
    ahead = list(pipeline.run_ahead(demo_model, iter(batches), "fp32"))
    assert events == ["launch 3", "launch 1", "collect 3", "launch 5", "collect 1", "collect 5"]
    monkeypatch.undo()
    assert len(ahead) == len(batches)
    for batch, outs in zip(batches, ahead, strict=True):
        for a, b in zip(outs, run_batch(demo_model, batch, "fp32"), strict=True):
            assert a.options.keys() == b.options.keys() and a.spans.keys() == b.spans.keys()
            for q in a.options:
                np.testing.assert_array_equal(a.options[q], b.options[q])
            for q in a.spans:
                np.testing.assert_array_equal(a.spans[q], b.spans[q])


def test_answers_are_well_formed(demo_model):
    rows = sample_rows()
    by_id = {r["id"]: r for r in rows}
    for res in vela2.predict(demo_model, rows, precision="fp32"):
        d = res.to_json_dict()
        assert d["status"] == "ok" and d["id"] in by_id
        assert set(d["timings"]) >= {"queue_ms", "render_ms", "model_ms", "decode_ms"}
        row = by_id[res.id]
        for i, a in enumerate(res.answers):
            task = row["questions"][i].get("task", row["task"])
            kind = task.split(":")[0]
            assert a.question == i and a.task == task
            if kind in ("choice", "score"):
                assert sum(a.probs.values()) == pytest.approx(1.0, abs=1e-9)
                assert a.decision == max(a.probs, key=a.probs.get)
                assert 0.0 < a.abstain_probability < 1.0
                if kind == "score":
                    vals = [float(o) for o in a.probs]
                    assert a.expected == pytest.approx(sum(v * p for v, p in zip(vals, a.probs.values(), strict=True)))
            elif kind == "set":
                assert a.decision == [o for o, p in a.probs.items() if p >= 0.5]
                assert a.abstain_probability is None
            else:
                for s in a.spans:
                    assert row["text"][s.start : s.end] == s.text and 0.0 <= s.score <= 1.0
                assert (a.gate_fired is not None) == task.startswith("span:pii")


def test_precisions(demo_model):
    rows = [dict(r, units=True) for r in sample_rows()]
    r32 = vela2.predict(demo_model, rows, precision="fp32")
    r16 = vela2.predict(demo_model, rows, precision="bf16")
    worst = 0.0
    for a, b in zip(r16, r32, strict=True):
        assert a.status == "ok"
        for x, y in zip(a.answers, b.answers, strict=True):
            assert x.probs.keys() == y.probs.keys()
            worst = max(worst, *(abs(x.probs[k] - y.probs[k]) for k in x.probs))
            if x.units:
                for k in x.units.probs:
                    worst = max(worst, float(np.abs(np.subtract(x.units.probs[k], y.units.probs[k])).max()))
    assert 0.0 < worst < 0.1  # bf16 differs from fp32, but only by rounding noise
    with pytest.raises(PrecisionError, match="got 'fp16'"):
        vela2.predict(demo_model, rows, precision="fp16")


# --- bad rows ------------------------------------------------------------------------------------

GOOD = {
    "id": "g",
    "task": "choice:boolq",
    "text": "The sky is blue.",
    "questions": [{"question": "Is it?", "options": ["yes", "no"]}],
}


def _without(key: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != key}


# (row, error type, substrings the message must contain: the field, the limit, the value)
BAD_ROWS: list[tuple[Any, str, list[str]]] = [
    ({**GOOD, "id": "t1", "text": 5}, "invalid_request", ["text", "valid string", "got 5"]),
    ({**_without("text"), "id": "t2"}, "invalid_request", ["text: field required"]),
    ({**_without("questions"), "id": "t3"}, "invalid_request", ["questions: field required"]),
    ({**GOOD, "id": "t4", "questions": []}, "invalid_request", ["questions", "at least 1", "[]"]),
    ({**GOOD, "id": "t5", "questions": "x"}, "invalid_request", ["questions", "valid list", "'x'"]),
    (
        {**GOOD, "id": "t6", "task": "span:x", "questions": [{"question": "q"}]},
        "invalid_request",
        ["questions[0]", "at least 1 labels", "got 0"],
    ),
    (
        {**GOOD, "id": "t7", "questions": [{"options": ["yes"]}]},
        "invalid_request",
        ["questions[0]", "at least 2 options", "got 1"],
    ),
    (
        {**GOOD, "id": "t8", "questions": [{"options": ["yes", "no", "yes"]}]},
        "invalid_request",
        ["questions[0]", "duplicate option", "'yes'"],
    ),
    ({**GOOD, "id": "t9", "task": "foo:bar"}, "invalid_request", ["task", "choice, score, set, span", "'foo'"]),
    ({**GOOD, "id": "t10", "task": "choice"}, "invalid_request", ["task", "'type:name'", "'choice'"]),
    ({**GOOD, "id": "t11", "text": "  \n\t "}, "invalid_request", ["text is empty"]),
    ({**GOOD, "id": "t12", "text": ""}, "invalid_request", ["text is empty"]),
    (
        {**GOOD, "id": "t13", "questions": [{"options": ["a", 3]}]},
        "invalid_request",
        ["questions[0].options[1]", "valid string", "got 3"],
    ),
    (
        {**GOOD, "id": "t14", "questions": [{"options": [str(i) for i in range(65)]}]},
        "limit_exceeded",
        ["questions[0]", "options", "65", "limit 64"],
    ),
    (
        {**GOOD, "id": "t15", "questions": [{"options": ["a", "b"], "labels": ["x"]}]},
        "invalid_request",
        ["questions[0]", "options, not labels"],
    ),
    ({**GOOD, "id": "t16", "extra": 1}, "invalid_request", ["extra", "unknown field"]),
    ({**GOOD, "id": "t17", "units": "yes"}, "invalid_request", ["units", "boolean", "'yes'"]),
    (
        {**GOOD, "id": "t18", "text": "a " * (LIMITS.max_text_words + 1)},
        "limit_exceeded",
        ["text has 65,537 words", "limit 65,536"],
    ),
    (
        {**GOOD, "id": "t19", "questions": [{"options": ["a", "b"], "task": "zzz:a"}]},
        "invalid_request",
        ["questions[0]", "choice, score, set, span", "'zzz'"],
    ),
    (
        {**GOOD, "id": "t20", "questions": [{"options": ["a", " "]}]},
        "invalid_request",
        ["questions[0]", "non-empty", "' '"],
    ),
    (
        {**GOOD, "id": "t21", "questions": [{"options": ["a", "b"]}] * 33},
        "limit_exceeded",
        ["questions", "33", "limit 32"],
    ),
    ([1, 2], "invalid_request", ["JSON object", "list"]),
    ("a string", "invalid_request", ["JSON object", "str"]),
]


def test_bad_rows_get_errors_and_the_rest_still_run(demo_model):
    rows = [GOOD, *[r for r, _, _ in BAD_ROWS], {**GOOD, "id": "g2", "text": "Grass is green."}]
    results = vela2.predict(demo_model, rows, precision="fp32")
    assert len(results) == len(rows)
    assert results[0].status == "ok" and results[-1].status == "ok"
    assert_close(results[0], vela2.predict(demo_model, [GOOD], precision="fp32")[0])
    problems = []
    for res, (row, code, parts) in zip(results[1:-1], BAD_ROWS, strict=True):
        d = res.to_json_dict()
        assert d["status"] == "error" and set(d["error"]) == {"type", "message"} and "answers" not in d
        if isinstance(row, dict) and isinstance(row.get("id"), str):
            assert d["id"] == row["id"]
        else:
            assert d["id"].startswith("h-")  # a deterministic content id
        missing = [p for p in parts if p not in d["error"]["message"]]
        if d["error"]["type"] != code or missing:
            problems.append((d["id"], d["error"], "missing", missing))
    assert not problems


def test_a_row_object_that_fails_to_render_keeps_its_id_and_task(demo_model):
    """Found by review: a pydantic Row (not a dict) refused at rendering came back under a content id."""
    from vela2.api.schemas import parse_row

    row = parse_row({**GOOD, "id": "my-row-1", "questions": [{"question": "ab " * 1300, "options": ["a", "b"]}]})
    as_row, as_dict = vela2.predict(demo_model, [row, row.model_dump(mode="json", exclude_none=True)], precision="fp32")
    assert as_row.status == "error" and as_row.error.type == "limit_exceeded"
    assert as_row.to_json_dict() == as_dict.to_json_dict()
    assert (as_row.id, as_row.task) == ("my-row-1", GOOD["task"])


# --- long texts ----------------------------------------------------------------------------------


def filler(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(FILLER) for _ in range(n))


HEAD = "Alice Smith alice@acme.com wrote"
TAIL = "signed Bob Jones bob@globex.com"
LONG_TEXT = f"{HEAD} {filler(1500, 1)} {TAIL}"  # about 3x the demo window (484 words)
LONG_ROW = {
    "id": "long",
    "task": "span:pii_long",
    "text": LONG_TEXT,
    "units": True,
    "logits": True,
    "questions": [
        {"labels": ["person", "email"]},
        {"task": "choice:c", "question": "Is it an email?", "options": ["yes", "no", "maybe"]},
        {"task": "span:ents", "labels": ["company"]},
    ],
}


@pytest.fixture(scope="module")
def long_result(demo_model):
    return vela2.predict(demo_model, [LONG_ROW], precision="fp32")[0]


def farthest_window(prep, g: int) -> int:
    """The window whose cut edges are farthest from word g (ties: the earlier window)."""
    n_words = prep.rendered.num_words
    best, best_d = -1, -1.0
    for k, s in enumerate(prep.sequences):
        ws, n = s.word_start, s.num_words
        if not ws <= g < ws + n:
            continue
        left = g - ws if ws > 0 else math.inf
        right = ws + n - 1 - g if ws + n < n_words else math.inf
        if min(left, right) > best_d:
            best, best_d = k, min(left, right)
    return best


def test_long_text_windows_merge_and_pool(demo_model, long_result):
    prep = prepare(demo_model, LONG_ROW)
    seqs = prep.sequences
    assert len(seqs) >= 3
    alone = [run_batch(demo_model, [s], "fp32")[0] for s in seqs]  # each window on its own
    res = long_result
    offsets = split_words(LONG_TEXT).tolist()
    for q in (0, 2):
        units = res.answers[q].units
        assert [list(o) for o in units.offsets] == offsets
        assert units.offsets[-1][1] == len(LONG_TEXT)
        for k, lab in enumerate(units.logits):
            got = np.array(units.logits[lab])
            want = np.array(
                [
                    alone[w].spans[q][g - seqs[w].word_start, k]
                    for g, w in ((g, farthest_window(prep, g)) for g in range(len(offsets)))
                ]
            )
            # raw logits (the trained demo's reach |20|): float32 noise of other batch shapes grows with them
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=TOL)
            # the planted words at both ends come from the windows that hold the text's own edges
            assert got[0] == pytest.approx(alone[0].spans[q][0, k], rel=1e-6, abs=TOL)
            assert got[-1] == pytest.approx(alone[-1].spans[q][-1, k], rel=1e-6, abs=TOL)
    # option logits: the mean of the windows' raw logits
    mean = np.mean([a.options[1] for a in alone], axis=0)
    assert np.abs(np.array(res.answers[1].logits) - mean).max() <= TOL
    assert [LONG_TEXT[s:e] for s, e in offsets[:4]] == ["Alice", "Smith", "alice", "@"]
    assert [LONG_TEXT[s:e] for s, e in offsets[-3:]] == ["globex", ".", "com"]
    for s in res.answers[0].spans + res.answers[2].spans:
        assert LONG_TEXT[s.start : s.end] == s.text


def test_long_text_same_answers_whatever_the_batch(demo_model, long_result):
    others = [dict(r, units=True) for r in sample_rows()]
    for kw in ({"max_batch_tokens": 600}, {"max_batch_tokens": 1 << 20}, {"row_tokens": 2048}):
        mixed = vela2.predict(demo_model, [others[0], LONG_ROW, *others[1:]], precision="fp32", **kw)
        assert_close(mixed[1], long_result)
    assert_close(vela2.predict(demo_model, [LONG_ROW], precision="fp32", max_batch_tokens=600)[0], long_result)


def _synthetic_outputs(prep, planted: set[int], edge_garbage: int) -> list[SeqOutput]:
    """Span logits +6 on planted words, -6 elsewhere; -6 also within `edge_garbage` words of a cut
    window edge (so a merge taking a word from the wrong window breaks the planted runs)."""
    n_words = prep.rendered.num_words
    outs = []
    for s in prep.sequences:
        ws, n = s.word_start, s.num_words
        logits = np.full((n, 1), -6.0, dtype=np.float32)
        for j in range(n):
            g = ws + j
            near_cut = (ws > 0 and j < edge_garbage) or (ws + n < n_words and n - 1 - j < edge_garbage)
            if g in planted and not near_cut:
                logits[j, 0] = 6.0
        outs.append(SeqOutput(options={1: np.array([float(s.window), 0.0, 1.0], dtype=np.float32)}, spans={0: logits}))
    return outs


def test_planted_runs_at_both_ends_and_across_a_window_boundary(demo_model):
    row = {
        "id": "syn",
        "task": "span:ents",
        "text": LONG_TEXT,
        "units": True,
        "logits": True,
        "questions": [{"labels": ["person"]}, {"task": "choice:c", "options": ["a", "b"]}],
    }
    prep = prepare(demo_model, row)
    s0, s1 = prep.sequences[0], prep.sequences[1]
    end0 = s0.word_start + s0.num_words
    assert s1.word_start < end0 - 20  # the windows overlap
    n_words = prep.rendered.num_words
    across = set(range(s1.word_start - 5, end0 + 5))  # starts in window 0 only, ends in window 1 only
    planted = {0, 1} | across | {n_words - 2, n_words - 1}
    outs = _synthetic_outputs(prep, planted, edge_garbage=4)
    res = finish(demo_model, prep, outs, {"queue_ms": 0.0, "model_ms": 0.0}, "fp32")
    offs = prep.rendered.offsets
    spans = [(s.start, s.end, s.text) for s in res.answers[0].spans]
    first, last = min(across), max(across)
    assert spans == [
        (0, int(offs[1, 1]), "Alice Smith"),
        (int(offs[first, 0]), int(offs[last, 1]), LONG_TEXT[offs[first, 0] : offs[last, 1]]),
        (int(offs[-2, 0]), len(LONG_TEXT), ".com"),
    ]
    t_span = demo_model.calibration.T_span  # the demo's fitted span temperature
    assert res.answers[0].spans[1].score == pytest.approx(1 / (1 + math.exp(-6.0 / t_span)), abs=1e-6)
    # option logits pooled as the mean over windows: window index mean, 0, 1
    n = len(prep.sequences)
    assert res.answers[1].logits == pytest.approx([(n - 1) / 2, 0.0, 1.0], abs=1e-6)
    assert res.answers[1].probs == pytest.approx(
        dict(zip(["a", "b"], np.exp([(n - 1) / 2, 0.0]) / np.exp([(n - 1) / 2, 0.0]).sum(), strict=True))
    )


def _fake_rendered(n_words: int, windows: list[tuple[int, int]]) -> RenderedRow:
    seqs = [Sequence("r", k, ws, [], [], [], [], list(range(we - ws))) for k, (ws, we) in enumerate(windows)]
    row = vela2.api.schemas.parse_row({"id": "r", "task": "span:t", "text": "x", "questions": [{"labels": ["l"]}]})
    return RenderedRow(row=row, offsets=np.zeros((n_words, 2), dtype=np.int64), sequences=seqs)


def test_merge_rule_by_hand():
    # 10 words; windows [0, 6) and [3, 10): words 3, 4, 5 are in both.
    # word 3: window 0 distance to its cut edge 2, window 1 distance 0 -> window 0
    # word 4: 1 vs 1 -> tie -> the earlier window; word 5: 0 vs 2 -> window 1
    rendered = _fake_rendered(10, [(0, 6), (3, 10)])
    w0 = SeqOutput(spans={0: np.full((6, 1), 0.0, dtype=np.float32)})
    w1 = SeqOutput(spans={0: np.full((7, 1), 1.0, dtype=np.float32)})
    merged = merge_span_windows(rendered, [w0, w1], 0)
    assert merged[:, 0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    # three windows: the middle one wins where it is deepest
    rendered = _fake_rendered(12, [(0, 6), (3, 9), (6, 12)])
    outs = [SeqOutput(spans={0: np.full((6, 1), float(k), dtype=np.float32)}) for k in range(3)]
    assert merge_span_windows(rendered, outs, 0)[:, 0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    pooled = pool_option_windows(
        [SeqOutput(options={0: np.array([1.0, 2.0])}), SeqOutput(options={0: np.array([3.0, 6.0])})], 0
    )
    assert pooled.tolist() == [2.0, 4.0]


# --- the longest texts ---------------------------------------------------------------------------


def test_32k_words_with_units(demo_model):
    n = 32_768
    text = f"{HEAD} {filler(n - 16, 2)} {TAIL}"  # HEAD and TAIL hold 8 words each
    row = {
        "id": "huge",
        "task": "span:pii_huge",
        "text": text,
        "units": True,
        "questions": [{"labels": ["person", "email"]}, {"task": "choice:c", "options": ["yes", "no"]}],
    }
    (res,) = vela2.predict(demo_model, [row], precision="fp32")
    assert res.status == "ok", res.error
    units = res.answers[0].units
    assert len(units.offsets) == n
    assert [list(o) for o in units.offsets] == split_words(text).tolist()
    assert units.offsets[-1][1] == len(text)
    assert all(len(v) == n for v in units.probs.values())
    assert all(text[s:e] == t for s, e, t in ((x.start, x.end, x.text) for x in res.answers[0].spans))
    assert sum(res.answers[1].probs.values()) == pytest.approx(1.0)


# --- invalid Unicode and request ids -------------------------------------------------------------

SURROGATE_ROWS = [
    ({**GOOD, "id": "u1", "text": "Alice w\ud800rote"}, "text is not valid Unicode (lone surrogate at index 7)"),
    (
        {**GOOD, "id": "u2", "questions": [{"question": "Is it?", "options": ["yes", "no\udfff"]}]},
        "questions[0].options[1] is not valid Unicode (lone surrogate at index 2)",
    ),
    (
        {**GOOD, "id": "u3", "questions": [{"question": "\ud83d?", "options": ["yes", "no"]}]},
        "questions[0].question is not valid Unicode (lone surrogate at index 0)",
    ),
    ({**GOOD, "id": "u4", "task": "choice:bo\udc00olq"}, "task is not valid Unicode (lone surrogate at index 9)"),
    (
        {**GOOD, "id": "u5", "task": "span:x", "questions": [{"labels": ["person", "e\ud800mail"]}]},
        "questions[0].labels[1] is not valid Unicode (lone surrogate at index 1)",
    ),
    (
        {**GOOD, "id": "u6", "questions": [{"task": "set:s\ud800", "options": ["a"]}]},
        "questions[0].task is not valid Unicode (lone surrogate at index 5)",
    ),
    (
        {**GOOD, "id": "u7", "fields": [{"name": "us\ud800er", "start": 0, "end": 5}]},
        "fields[0].name is not valid Unicode (lone surrogate at index 2)",
    ),
    (
        {**GOOD, "id": "u8", "task": "span:x",
         "questions": [{"labels": ["person"], "fields": ["\ud800"]}], "fields": [{"name": "a", "start": 0, "end": 5}]},
        "questions[0].fields[0] is not valid Unicode (lone surrogate at index 0)",
    ),
    ({**GOOD, "id": "u9", "gold": {"label": "y\ud800es"}}, "gold.label is not valid Unicode"),
    ({**GOOD, "id": "u10", "ex\ud800tra": 1}, "has a key that is not valid Unicode (lone surrogate at index 2)"),
    ({**GOOD, "id": "r-\ud800"}, "id is not valid Unicode (lone surrogate at index 2)"),
    ({k: v for k, v in {**GOOD, "text": "no id \udbff"}.items() if k != "id"}, "text is not valid Unicode"),
]


@pytest.mark.parametrize("row,message", SURROGATE_ROWS, ids=[f"s{i}" for i in range(len(SURROGATE_ROWS))])
def test_lone_surrogates_get_invalid_request_results(demo_model, row, message):
    """Every string of a row must be valid Unicode: predict() answers with an error naming the field
    (never a TypeError from the tokenizer), the other rows still run, and the error result is valid
    UTF-8 JSON (an id UTF-8 cannot encode is written with backslash escapes)."""
    with pytest.raises(InvalidRequest, match=re.escape(message)) as exc:
        parse_row(row)
    assert type(exc.value) is InvalidRequest
    bad, good = vela2.predict(demo_model, [row, GOOD], precision="fp32")
    assert good.status == "ok"
    assert bad.status == "error" and bad.error.type == "invalid_request" and message in bad.error.message
    json.dumps(bad.to_json_dict(), ensure_ascii=False, allow_nan=False).encode("utf-8")
    if "id" in row and surrogate_index(row["id"]) is None:
        assert bad.id == row["id"]
    elif "id" in row:
        assert bad.id == row["id"].encode("utf-8", "backslashreplace").decode()
    else:
        assert bad.id.startswith("h-")


@pytest.mark.parametrize(
    "rid,code,message",
    [
        ("", "invalid_request", "id is empty"),
        ("x" * (LIMITS.max_id_chars + 1), "limit_exceeded", f"id has 257 characters; limit {LIMITS.max_id_chars}"),
        ("x" * 10_000, "limit_exceeded", "id has 10,000 characters; limit 256"),
        (17, "invalid_request", "id: Input should be a valid string; got 17"),
        (None, "invalid_request", "id: Input should be a valid string; got None"),
    ],
)
def test_bad_ids_are_refused_by_name(demo_model, rid, code, message):
    row = {**GOOD, "id": rid}
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        parse_row(row)
    (res,) = vela2.predict(demo_model, [row], precision="fp32")
    assert res.status == "error" and res.error.type == code and message in res.error.message
    assert 0 < len(res.id) <= LIMITS.max_id_chars


def test_ids_at_the_limit_are_accepted():
    assert parse_row({**GOOD, "id": "é" * LIMITS.max_id_chars}).id == "é" * LIMITS.max_id_chars
    assert parse_row({**GOOD, "id": "😀"}).id == "😀"


# --- non-finite numbers never reach a result -------------------------------------------------------

NUMBERISH = ["nan", "NaN", "-nan", "inf", "-inf", "+inf", "Infinity", "-Infinity", "1e999", "-1e400", "0", "1",
             "2.5", "-3", " 4 ", "1e308", "-1.7976931348623157e308", "1.7976931348623157e308", "1_000", "0x10",
             "١٢", "5e-324", "one", "", "yes"]


def _json(res) -> str:
    return json.dumps(res.to_json_dict(), allow_nan=False, ensure_ascii=False)


def test_non_finite_options_are_not_numeric(demo_model):
    rows = [
        {**GOOD, "id": f"n{i}", "task": "score:s", "questions": [{"options": opts}]}
        for i, opts in enumerate([["nan", "1"], ["inf", "-inf"], ["Infinity", "2"], ["1e999", "0"], ["0", "1", "2"]])
    ]
    results = vela2.predict(demo_model, rows, precision="fp32")
    assert [r.answers[0].expected is None for r in results] == [True, True, True, True, False]
    for r in results:
        _json(r)


def test_expected_stays_finite_at_the_float_limit(demo_model):
    opts = ["1.7976931348623157e308", "1.7e308", "-1.7976931348623157e308"]
    (res,) = vela2.predict(demo_model, [{**GOOD, "task": "score:s", "questions": [{"options": opts}]}],
                           precision="fp32")
    e = res.answers[0].expected
    assert e is not None and math.isfinite(e) and -1.8e308 < e < 1.8e308
    _json(res)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["choice", "score", "set"]),
    options=st.lists(
        st.one_of(st.sampled_from(NUMBERISH), st.text(min_size=1, max_size=8),
                  st.floats(allow_nan=True, allow_infinity=True).map(repr)),
        min_size=2, max_size=6, unique=True,
    ),
)
def test_any_options_give_valid_json(demo_model, kind, options):
    """Whatever the option strings: the result is valid JSON (json.dumps(..., allow_nan=False)), and
    `expected` is given exactly when every option parses as a finite float, between their values."""
    row = {**GOOD, "task": f"{kind}:p", "questions": [{"options": options}], "logits": True}
    (res,) = vela2.predict(demo_model, [row], precision="fp32")
    text = _json(res)
    assert json.loads(text)["id"] == GOOD["id"]
    if res.status == "error":  # options the schema refuses (blank, duplicate, ...)
        assert res.error.type in ("invalid_request", "limit_exceeded")
        return
    (answer,) = res.answers
    values = [option_value(o) for o in options]
    if kind != "score" or None in values:
        assert answer.expected is None
    else:
        assert answer.expected is not None and min(values) <= answer.expected <= max(values)


def test_non_finite_logits_become_a_model_error(demo_model, monkeypatch):
    """A model that returns NaN / infinity for a row: that row gets a model_error result (JSON-safe),
    the other rows of the same predict() call their answers."""
    real = predict_module.run_ahead

    def poisoned(model, batches, *args, **kwargs):
        batches = list(batches)
        for sequences, outs in zip(batches, real(model, batches, *args, **kwargs), strict=True):
            for seq, out in zip(sequences, outs, strict=True):
                if seq.row_id == "poison":
                    for q in out.options:
                        out.options[q] = np.full_like(out.options[q], np.nan)
                    for q in out.spans:
                        out.spans[q][0, 0] = np.inf
            yield outs

    monkeypatch.setattr(predict_module, "run_ahead", poisoned)
    rows = [{**BUNDLES[1], "id": "poison"}, {**BUNDLES[1], "id": "fine"},
            {**GOOD, "id": "poison", "task": "span:x", "questions": [{"labels": ["person"]}]}]
    bad, good, bad_span = vela2.predict(demo_model, rows, precision="fp32")
    assert good.status == "ok"
    for res, what in ((bad, "option"), (bad_span, "span")):
        assert res.status == "error" and res.error.type == "model_error"
        assert "non-finite" in res.error.message and what in res.error.message
        _json(res)


def test_a_temperature_too_small_for_the_logits_is_a_model_error(demo_model, monkeypatch):
    cal = dataclasses.replace(demo_model.calibration, temperatures={"choice": 1e-320, "score": 1.0})
    monkeypatch.setattr(demo_model, "calibration", cal)
    (res,) = vela2.predict(demo_model, [{**GOOD, "questions": [{"options": ["yes", "no", "maybe"]}]}],
                           precision="fp32")
    assert res.status == "error" and res.error.type == "model_error" and "finite" in res.error.message
    _json(res)


def test_answers_refuse_non_finite_numbers():
    with pytest.raises(ValidationError):
        Answer(question=0, task="choice:x", probs={"a": float("nan")})
    answer = Answer(question=0, task="choice:x", probs={"a": 0.5})
    with pytest.raises(ValidationError):
        answer.expected = float("inf")
    with pytest.raises(ValidationError):
        SpanOut(label="a", start=0, end=1, text="x", score=float("-inf"))
    with pytest.raises(ValidationError):
        RowResult(id="x", status="ok", timings={"model_ms": float("nan")})


def test_a_string_or_list_over_its_limit_is_named_with_its_length_and_the_limit():
    """Found by review: pydantic's own 'String should have at most 4000 characters; got 'xxxx...''
    named neither the length given nor, for SystemOne, which limit."""
    from vela2.api.schemas import parse_row
    from vela2.api.systemone import parse_request

    with pytest.raises(LimitExceeded, match=r"^questions\[0\]\.question has 4,001 characters; limit 4,000$"):
        parse_row({**GOOD, "questions": [{"question": "q" * 4001, "options": ["a", "b"]}]})
    with pytest.raises(LimitExceeded, match=r"^tasks\[0\]\.name has 200 characters; limit 128$"):
        parse_request({"model": "m", "input": "x", "tasks": [{"name": "t" * 200, "kind": "set", "options": ["a"]}]})
