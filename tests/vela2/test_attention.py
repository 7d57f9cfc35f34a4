"""Flex attention backend (vela2.model.attention): the BlockMask encodes exactly the tree mask, and on the
demo model flex gives the sdpa outputs (fp32, <= 1e-4) on packed rows, bundled == single included.

flex_attention runs on CPU through inductor (a C++ kernel per shape, ~5 s to build on 2 cores), so
the model tests pin every row to 512 tokens (row_tokens = the demo window) to share compiled shapes.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_block_mask

import vela2
from vela2.model import attention
from vela2.model.attention import tree_mask
from vela2.model.modeling import build_backbone
from vela2.scoring.pipeline import collate, prepare, run_batch
from vela2.train.demo_model import sample_rows

TOL = 1e-4  # fp32: flex vs sdpa, max |diff| of raw head logits and of probabilities
ROW = 768  # row_tokens of the model tests: the demo's max_window_tokens, so every sequence (a window) fits a row


# --- the mask ------------------------------------------------------------------------------------


@st.composite
def packed_layouts(draw):
    """(parts, segments) (B, L) numpy, L a multiple of the tile `block` (also returned): rows of
    1..3 sequences (context, then 0..3 question blocks), then padding; -1 on padding."""
    block = draw(st.sampled_from([4, 8, 16]))
    rows, seg_id = [], 0
    for _ in range(draw(st.integers(1, 3))):
        parts, segs = [], []
        for _ in range(draw(st.integers(1, 3))):
            seq = [0] * draw(st.integers(1, 20))
            for k, n in enumerate(draw(st.lists(st.integers(1, 8), max_size=3))):
                seq += [k + 1] * n
            parts += seq
            segs += [seg_id] * len(seq)
            seg_id += 1
        rows.append((parts, segs))
    L = attention.padded_length(max(len(p) for p, _ in rows) + draw(st.integers(0, 6)), block)
    P = np.full((len(rows), L), -1, dtype=np.int64)
    S = np.full((len(rows), L), -1, dtype=np.int64)
    for b, (p, s) in enumerate(rows):
        P[b, : len(p)], S[b, : len(s)] = p, s
    return P, S, block


def block_sets(bm) -> tuple[np.ndarray, np.ndarray]:
    """(partial, full) tile maps (B, Lq/bs, Lk/bs) bool read from a BlockMask's index tensors."""
    out = []
    for num, idx in ((bm.kv_num_blocks, bm.kv_indices), (bm.full_kv_num_blocks, bm.full_kv_indices)):
        B, _, nq = num.shape
        m = np.zeros((B, nq, idx.shape[-1]), dtype=bool)
        for b in range(B):
            for i in range(nq):
                m[b, i, idx[b, 0, i, : num[b, 0, i]].numpy()] = True
        out.append(m)
    return out[0], out[1]


@settings(max_examples=120, deadline=None)
@given(layout=packed_layouts())
def test_block_mask_is_the_tree_mask(layout):
    P, S, bs = layout
    parts, segs = torch.from_numpy(P), torch.from_numpy(S)
    dense = tree_mask(parts, segs)  # (B, 1, L, L)
    assert torch.equal(attention.dense_mask(parts, segs), dense)  # the mask_mod, pair by pair
    assert torch.equal(attention.dense_mask(parts), tree_mask(parts))  # no segments: one sequence per row
    bm = attention.block_mask(parts, segs, block_size=bs)
    B, L = P.shape
    assert bm.shape == (B, 1, L, L)
    tiles = dense[:, 0].reshape(B, L // bs, bs, L // bs, bs).permute(0, 1, 3, 2, 4).reshape(B, L // bs, L // bs, -1)
    partial, full = block_sets(bm)
    # a tile is computed iff some pair in it is visible, and skips the mask iff every pair is
    assert (partial | full == tiles.any(-1).numpy()).all()
    assert (full == tiles.all(-1).numpy()).all()
    assert not (partial & full).any()
    # built from tile counts, the BlockMask is the one flex's own create_block_mask makes of the mask_mod
    ref = create_block_mask(attention.tree_mask_mod(parts, segs), B, None, L, L, device="cpu", BLOCK_SIZE=bs)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks"):
        assert torch.equal(getattr(bm, name), getattr(ref, name)), name


def test_block_mask_skips_other_sequences():
    # one row: two 64-token sequences (context only), then 128 padding tokens; 32-token tiles
    parts = torch.tensor([[0] * 128 + [-1] * 128])
    segs = torch.tensor([[0] * 64 + [1] * 64 + [-1] * 128])
    partial, full = block_sets(attention.block_mask(parts, segs, block_size=32))
    computed = (partial | full)[0].astype(int)
    assert computed[:4, :4].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    assert full[0, :4, :4].sum() == 2  # (1, 0) and (3, 2): below the diagonal, within one sequence
    assert computed[4:].tolist() == [[0] * 4 + [int(j == i) for j in range(4, 8)] for i in range(4, 8)]


def test_block_mask_rejects_bad_shapes():
    with pytest.raises(ValueError, match="parts must be"):
        attention.block_mask(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="segments must have the shape"):
        attention.block_mask(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 7, dtype=torch.long))


def test_pad_batch_and_collate_pad_to(demo_model):
    seqs = [s for r in sample_rows()[:3] for s in prepare(demo_model, r).sequences]
    pad = demo_model.special_ids["pad"]
    ids, pos, parts, segs, _, _ = collate(seqs, pad, demo_model.device, row_tokens=ROW, pad_to=300)
    assert ids.shape == (1, 300)
    n = sum(s.num_tokens for s in seqs)
    assert (parts[0, n:] == -1).all() and (segs[0, n:] == -1).all() and (ids[0, n:] == pad).all()
    ids2, pos2, parts2, segs2 = attention.pad_batch(ids, pos, parts, segs, pad)
    assert ids2.shape == (1, 384) and torch.equal(ids2[:, :300], ids) and (parts2[:, 300:] == -1).all()
    assert (segs2[:, 300:] == -1).all() and (pos2[:, 300:] == 0).all() and (ids2[:, 300:] == pad).all()
    assert attention.pad_batch(ids2, pos2, parts2, segs2, pad)[0] is ids2  # already whole tiles


# --- switching backends --------------------------------------------------------------------------


def test_switch_backend(demo_dir):
    model = vela2.load(demo_dir, dtype=torch.float32)
    assert model.attn == "sdpa"
    assert model.set_attention("flex") is model and model.attn == "flex"
    assert model.backbone.config._attn_implementation == attention.IMPLEMENTATION
    model.attn = "sdpa"
    assert model.attn == "sdpa" and model.backbone.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="attn must be one of sdpa, flex; got 'eager'"):
        model.set_attention("eager")
    assert build_backbone(model.config, "flex").config._attn_implementation == attention.IMPLEMENTATION


def test_flex_needs_a_block_mask():
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="needs a BlockMask"):
        attention.flex_attention_forward(torch.nn.Module(), q, q, q, torch.ones(1, 1, 4, 4, dtype=torch.bool))


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
            ids, pos, parts, segs, _, _ = collate(batch, demo_model.special_ids["pad"], demo_model.device, ROW, ROW)
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
