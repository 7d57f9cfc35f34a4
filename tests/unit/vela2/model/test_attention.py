"""Flex attention's pieces (vela2.model.attention) that need no compiler: the BlockMask encodes exactly
the tree mask, skips other sequences, refuses bad shapes; padding to whole tiles; switching the
backend. (Flex's compiled kernels against sdpa: tests/integration/vela2/model/test_attention.py.)"""

from __future__ import annotations

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
from vela2.scoring.pipeline import collate, prepare
from vela2.train.demo_model import sample_rows

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
    ids, pos, parts, segs, *_ = collate(seqs, pad, demo_model.device, row_tokens=ROW, pad_to=340)
    assert ids.shape == (1, 340)
    n = sum(s.num_tokens for s in seqs)
    assert n < 340  # pad_to pads past the sequences
    assert (parts[0, n:] == -1).all() and (segs[0, n:] == -1).all() and (ids[0, n:] == pad).all()
    ids2, pos2, parts2, segs2 = attention.pad_batch(ids, pos, parts, segs, pad)
    assert ids2.shape == (1, 384) and torch.equal(ids2[:, :340], ids) and (parts2[:, 340:] == -1).all()
    assert (segs2[:, 340:] == -1).all() and (pos2[:, 340:] == 0).all() and (ids2[:, 340:] == pad).all()
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


