"""Flex attention (compiled by torch.compile: a C++ compiler process on a CPU) against sdpa on random
packed rows, bundled against single, bf16 against fp32."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import vela2
from tests.unit.vela2.model.test_attention import ROW
from vela2.model import attention
from vela2.scoring.pipeline import collate, prepare, run_batch
from vela2.train.demo_model import sample_rows

TOL = 1e-4  # fp32: flex vs sdpa, max |diff| of raw head logits and of probabilities


# --- the mask ------------------------------------------------------------------------------------


# --- switching backends --------------------------------------------------------------------------


# --- flex == sdpa on the demo model --------------------------------------------------------------


@pytest.fixture(scope="module")
def flex_model(demo_dir):
    """A second copy of the demo model (the session one stays sdpa) running flex attention."""
    return vela2.load(demo_dir, dtype=torch.float32).set_attention("flex")


def pool(model) -> list:
    """Sequences of many shapes: every sample row, texts of 5..120 words, bundles, a windowed text."""
    rng = random.Random(7)
    words = "the cat sat on a mat while Alice Smith from Acme wrote to Bob about order 4471".split()
    rows = list(sample_rows())
    for i in range(8):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(5, 120)))
        qs = [
            {"question": "Is it?", "options": ["yes", "no"]},
            {"task": "span:ents", "labels": ["person"]},
            {"task": "set:shield", "options": ["violence", "hate"]},
        ][: rng.randint(1, 3)]
        rows.append({"id": f"p{i}", "task": "choice:boolq", "text": text, "questions": qs})
    return [s for r in rows for s in prepare(model, r).sequences]


def assert_outputs_close(a, b, tol: float = TOL) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert x.options.keys() == y.options.keys() and x.spans.keys() == y.spans.keys()
        for q in x.options:
            worst = max(worst, float(np.abs(x.options[q] - y.options[q]).max()))
        for q in x.spans:
            worst = max(worst, float(np.abs(x.spans[q] - y.spans[q]).max()))
    assert worst <= tol, worst
    return worst


def test_flex_equals_sdpa_on_random_packed_rows(demo_model, flex_model):
    seqs = pool(demo_model)
    assert max(s.num_tokens for s in seqs) <= ROW and sum(s.num_tokens for s in seqs) > 2 * ROW
    rng = random.Random(0)
    shapes: set[tuple[int, int]] = set()
    for trial in range(4):
        while True:  # random layouts of one or two rows: two compiled shapes (kernels take ~5 s each)
            batch = rng.sample(seqs, rng.randint(2, 7))
            ids, pos, parts, segs, *_ = collate(batch, demo_model.special_ids["pad"], demo_model.device, ROW, ROW)
            if ids.shape[0] == 1 + trial % 2:
                break
        seen = tuple(ids.shape) in shapes
        shapes.add(tuple(ids.shape))
        compiled = attention.compile_stats()["unique_graphs"]
        got = run_batch(flex_model, batch, "fp32", row_tokens=ROW)  # rows padded to ROW under flex
        if seen:  # a new layout (new BlockMask) of a shape already run reuses its kernel
            assert attention.compile_stats()["unique_graphs"] == compiled
        assert_outputs_close(run_batch(demo_model, batch, "fp32", row_tokens=ROW), got)
        # hidden states too, on real tokens (padding differs: sdpa pads only to the longest row)
        with torch.inference_mode():
            hs = demo_model.encode(ids, pos, parts, segs, "fp32")
            hf = flex_model.encode(ids, pos, parts, segs, "fp32")
        real = parts >= 0
        assert hf.shape == hs.shape and (hf[real] - hs[real]).abs().max() <= TOL
    assert len(shapes) == 2


def answers(res) -> list[tuple]:
    """(question, task, decision, probs, spans) of every answer of an ok result."""
    assert res.status == "ok", res
    return [
        (a.question, a.task, a.decision, a.probs, [(s.label, s.start, s.end, s.score) for s in a.spans or []])
        for a in res.answers
    ]


def assert_answers_close(a: tuple, b: tuple, tol: float) -> None:
    assert a[1:3] == b[1:3] and a[3].keys() == b[3].keys()
    assert max(abs(a[3][k] - b[3][k]) for k in a[3]) <= tol
    assert [s[:3] for s in a[4]] == [s[:3] for s in b[4]]
    assert all(abs(x[3] - y[3]) <= tol for x, y in zip(a[4], b[4], strict=True))


BUNDLE = {
    "id": "b",
    "task": "score:helpsteer2",
    "text": sample_rows()[1]["text"],
    "questions": [
        {"options": ["0", "1", "2", "3", "4"]},
        {"task": "set:shield", "options": ["violence", "self-harm", "hate", "privacy"]},
        {"task": "span:pii_dev", "labels": ["person", "email", "phone"]},
        {"task": "choice:boolq", "question": "Was the refund sent?", "options": ["yes", "no"]},
    ],
}


def test_bundled_equals_single_under_flex(demo_model, flex_model):
    (bundled,) = vela2.predict(flex_model, [BUNDLE], precision="fp32", row_tokens=ROW)
    (ref,) = vela2.predict(demo_model, [BUNDLE], precision="fp32", row_tokens=ROW)
    for q, (got, want) in enumerate(zip(answers(bundled), answers(ref), strict=True)):
        assert_answers_close(got, want, TOL)  # flex == sdpa
        single = {
            **BUNDLE,
            "id": f"b-q{q}",
            "task": bundled.answers[q].task,
            "questions": [{k: v for k, v in BUNDLE["questions"][q].items() if k != "task"}],
        }
        (alone,) = vela2.predict(flex_model, [single], precision="fp32", row_tokens=ROW)
        assert_answers_close(answers(alone)[0], got, 1e-5)  # bundled == single, as under sdpa


def test_flex_bf16_as_close_to_fp32_as_sdpa_bf16(demo_model, flex_model):
    seqs = pool(demo_model)[:5]  # the five short sample rows
    assert sum(s.num_tokens for s in seqs) <= ROW  # one row
    ref = run_batch(demo_model, seqs, "fp32", row_tokens=ROW)
    sdpa_err = assert_outputs_close(run_batch(demo_model, seqs, "bf16", row_tokens=ROW), ref, tol=1.0)
    # flex casts q / k / v to bf16 itself (autocast does not cover it): same rounding as sdpa
    flex_err = assert_outputs_close(run_batch(flex_model, seqs, "bf16", row_tokens=ROW), ref, tol=1.0)
    assert 0.0 < flex_err <= 1.5 * sdpa_err, (flex_err, sdpa_err)
