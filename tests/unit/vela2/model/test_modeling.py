"""The tree mask (hypothesis over random layouts, packed rows included), the heads by hand, the
precision rules, and the tree forward on the demo model (blocks and padding never leak)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vela2.config import SpecialTokens
from vela2.errors import CheckpointError, PrecisionError
from vela2.model.attention import tree_mask
from vela2.model.modeling import OptionHead, SpanHead, Vela2Model
from vela2.scoring.pipeline import collate, prepare, run_batch
from vela2.text.packing import balance_rows, pack, plan_rows

# --- tree mask -----------------------------------------------------------------------------------


@st.composite
def layouts(draw, packed: bool):
    """A batch of rows; each row holds 1 (or, packed, several) sequences, then padding.

    A sequence: context (part 0, >= 1 token) then 0..3 blocks (parts 1..k). Returns parts and
    segments (B, L) as numpy, -1 on padding.
    """
    n_rows = draw(st.integers(1, 3))
    rows = []
    seg_id = 0
    for _ in range(n_rows):
        parts, segs = [], []
        for _ in range(draw(st.integers(1, 3)) if packed else 1):
            ctx = draw(st.integers(1, 6))
            blocks = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
            seq = [0] * ctx + [k + 1 for k, n in enumerate(blocks) for _ in range(n)]
            parts += seq
            segs += [seg_id] * len(seq)
            seg_id += 1
        rows.append((parts, segs))
    L = max(len(p) for p, _ in rows) + draw(st.integers(0, 4))
    P = np.full((n_rows, L), -1, dtype=np.int64)
    S = np.full((n_rows, L), -1, dtype=np.int64)
    for b, (p, s) in enumerate(rows):
        P[b, : len(p)] = p
        S[b, : len(s)] = s
    return P, S


def reference_mask(P: np.ndarray, S: np.ndarray | None) -> np.ndarray:
    """The mask spelled out token pair by token pair (B, L, L)."""
    B, L = P.shape
    out = np.zeros((B, L, L), dtype=bool)
    for b in range(B):
        for i in range(L):
            for j in range(L):
                pi, pj = P[b, i], P[b, j]
                same_seg = S is None or S[b, i] == S[b, j]
                real = pi >= 0 and pj >= 0 and j <= i and same_seg and (pj == 0 or pj == pi)
                out[b, i, j] = real or (i == j and pi < 0)
    return out


def check_mask_properties(P: np.ndarray, S: np.ndarray | None, M: np.ndarray) -> None:
    B, L = P.shape
    seg = S if S is not None else np.zeros_like(P)
    for b in range(B):
        p, s, m = P[b], seg[b], M[b]
        real = p >= 0
        # no block token attends to another block (same segment or not)
        cross = (p[:, None] > 0) & (p[None, :] > 0) & (p[:, None] != p[None, :])
        assert not (m & cross).any()
        # padding sees only itself; no real token sees padding
        for i in np.nonzero(~real)[0]:
            assert m[i].tolist() == [j == i for j in range(L)]
        assert not m[np.ix_(real, ~real)].any()
        # never another packed sequence
        assert not (m & (s[:, None] != s[None, :]) & real[:, None]).any()
        # context is causal within its sequence; a block sees its context and its own earlier tokens
        for i in np.nonzero(real)[0]:
            mine = (s == s[i]) & real
            want = mine & (np.arange(L) <= i) & ((p == 0) | (p == p[i]))
            assert (m[i] == want).all()
            assert m[i, i]  # every token sees itself (no fully masked row)


@settings(max_examples=150, deadline=None)
@given(layout=layouts(packed=False))
def test_tree_mask_one_sequence_per_row(layout):
    P, _ = layout
    M = tree_mask(torch.from_numpy(P))
    assert M.shape == (P.shape[0], 1, P.shape[1], P.shape[1]) and M.dtype == torch.bool
    M = M[:, 0].numpy()
    assert (M == reference_mask(P, None)).all()
    check_mask_properties(P, None, M)


@settings(max_examples=150, deadline=None)
@given(layout=layouts(packed=True))
def test_tree_mask_packed_rows(layout):
    P, S = layout
    M = tree_mask(torch.from_numpy(P), torch.from_numpy(S))[:, 0].numpy()
    assert (M == reference_mask(P, S)).all()
    check_mask_properties(P, S, M)


def test_tree_mask_by_hand():
    # ctx ctx b1 b1 b2 pad
    M = tree_mask(torch.tensor([[0, 0, 1, 1, 2, -1]]))[0, 0].int().tolist()
    assert M == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]


# --- heads -----------------------------------------------------------------------------------------


def test_span_head_by_hand():
    head = SpanHead(hidden_size=2, dim=4)
    with torch.no_grad():
        head.word.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))
        head.word.bias.zero_()
        head.label.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 3.0], [0.0, 0.0], [0.0, 0.0]]))
        head.label.bias.zero_()
        head.bias.fill_(-1.0)
    words = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # (W=3, H=2)
    labels = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # (K=2, H=2)
    out = head(words, labels)
    # (word . diag(2, 3) . label) / sqrt(4) - 1
    assert out.shape == (3, 2)
    assert torch.allclose(out, torch.tensor([[0.0, -1.0], [-1.0, 0.5], [0.0, 0.5]]))


def test_option_head_by_hand():
    head = OptionHead(hidden_size=2, width=2)
    with torch.no_grad():
        head.dense.weight.copy_(torch.eye(2))
        head.dense.bias.zero_()
        head.out.weight.copy_(torch.tensor([[1.0, -1.0]]))
        head.out.bias.fill_(0.5)
    h = torch.tensor([[0.0, 0.0], [3.0, 0.0]])
    gelu3 = float(torch.nn.functional.gelu(torch.tensor(3.0)))
    assert torch.allclose(head(h), torch.tensor([0.5, gelu3 + 0.5]))


# --- precision -------------------------------------------------------------------------------------


def test_check_precision(demo_model):
    demo_model.check_precision("fp32")
    demo_model.check_precision("bf16")
    with pytest.raises(PrecisionError, match="precision must be one of bf16, fp32, fp8; got 'fp16'"):
        demo_model.check_precision("fp16")


def test_fp32_on_bf16_backbone_raises(demo_model):
    m = copy.deepcopy(demo_model)
    m.backbone.to(torch.bfloat16)
    with pytest.raises(PrecisionError, match="needs the backbone held in float32; it is torch.bfloat16"):
        m.check_precision("fp32")
    m.check_precision("bf16")


def test_missing_special_token_rejected(demo_model):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(demo_model.tokenizer.to_str())
    bad = dataclasses.replace(demo_model.config, special_tokens=SpecialTokens(label="[NOPE]"))
    with pytest.raises(CheckpointError, match=r"special token '\[NOPE\]' \(label\) is not in the tokenizer"):
        Vela2Model(bad, tok, demo_model.calibration, torch.nn.Identity())


# --- the tree forward on the demo model ------------------------------------------------------------

TEXT = "Alice Smith from Acme wrote to bob@globex.com about the refund for order 4471 on Monday."
BUNDLE = {
    "id": "b",
    "task": "choice:boolq",
    "text": TEXT,
    "questions": [
        {"question": "Is it polite?", "options": ["yes", "no"]},
        {"task": "span:ents", "labels": ["person", "company"]},
        {"task": "set:topics", "options": ["finance", "sports", "support"]},
    ],
}


def _encode(model, sequences, precision="fp32"):
    ids, pos, parts, segs, *_ = collate(sequences, model.special_ids["pad"], model.device)
    with torch.inference_mode():
        return model.encode(ids, pos, parts, segs, precision)


def test_blocks_do_not_change_context_or_each_other(demo_model):
    bundled = prepare(demo_model, BUNDLE).sequences[0]
    hb = _encode(demo_model, [bundled])[0]  # (L, H)
    ctx = bundled.blocks[0].start
    for q, blk in enumerate(bundled.blocks):
        alone_row = {
            **BUNDLE,
            "task": bundled.blocks[q].task,
            "questions": [{k: v for k, v in BUNDLE["questions"][q].items() if k != "task"}],
        }
        alone = prepare(demo_model, alone_row).sequences[0]
        ha = _encode(demo_model, [alone])[0]
        assert alone.input_ids[:ctx] == bundled.input_ids[:ctx]
        assert alone.input_ids[ctx:] == bundled.input_ids[blk.start : blk.end]
        assert alone.position_ids[ctx:] == bundled.position_ids[blk.start : blk.end]
        assert torch.allclose(ha[:ctx], hb[:ctx], atol=1e-5, rtol=0)  # the context never sees blocks
        assert torch.allclose(ha[ctx:], hb[blk.start : blk.end], atol=1e-5, rtol=0)


def test_padding_and_packing_do_not_leak(demo_model):
    short = prepare(demo_model, {**BUNDLE, "id": "s", "text": "Short text."}).sequences[0]
    long = prepare(demo_model, BUNDLE).sequences[0]
    alone = run_batch(demo_model, [short], "fp32")[0]
    for outs in (
        run_batch(demo_model, [long, short], "fp32"),
        run_batch(demo_model, [short, long, short], "fp32", row_tokens=4 * long.num_tokens),
    ):
        got = outs[-1]
        # fp32 summation order only (another GEMM shape): a few ulps of the logit, whose size the
        # trained demo puts at up to ~40 (an ulp there is 3.8e-6); a leak would move them by far more
        for q in alone.options:
            np.testing.assert_allclose(got.options[q], alone.options[q], rtol=1e-6, atol=1e-5)
        for q in alone.spans:
            np.testing.assert_allclose(got.spans[q], alone.spans[q], rtol=1e-6, atol=1e-5)
    # packed rows really were packed: three sequences in one row
    ids, *_ = collate(
        [short, long, short], demo_model.special_ids["pad"], demo_model.device, row_tokens=4 * long.num_tokens
    )
    assert ids.shape == (1, long.num_tokens + 2 * short.num_tokens)


def test_bf16_forward_returns_fp32_heads(demo_model):
    seq = prepare(demo_model, BUNDLE).sequences[0]
    h = _encode(demo_model, [seq], "bf16")
    assert h.dtype == torch.float32
    out32, out16 = run_batch(demo_model, [seq], "fp32")[0], run_batch(demo_model, [seq], "bf16")[0]
    assert out16.options[0].dtype == np.float32 and out16.spans[1].dtype == np.float32
    assert np.isfinite(out16.spans[1]).all()
    assert np.abs(out16.options[0] - out32.options[0]).max() < 0.5  # close, not equal
    assert out32.spans[1].shape == (len(seq.word_positions), 2)
    assert out32.options[0].shape == (3,) and out32.options[2].shape == (3,)


# --- pack ------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=0, max_size=40), budget=st.integers(1, 2000))
def test_pack_every_index_once_within_budget(lengths, budget):
    batches = pack(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert b
        cost = max(lengths[i] for i in b) * len(b)
        assert cost <= budget or len(b) == 1


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=40),
    row_tokens=st.integers(1, 600),
    budget=st.integers(1, 4000),
)
def test_pack_rows_every_index_once(lengths, row_tokens, budget):
    rows = plan_rows(lengths, row_tokens)
    capacity = max(row_tokens, *lengths)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= capacity for r in rows)
    batches = pack(lengths, budget, row_tokens)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:  # padded cost = rows x capacity <= budget, or a single row
        assert sum(lengths[i] for i in b) <= max(budget, capacity)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=60), row_tokens=st.integers(1, 600))
def test_balanced_rows_keep_every_index_and_never_fill_a_row_more(lengths, row_tokens):
    rows = plan_rows(lengths, row_tokens)
    balanced = balance_rows(rows, lengths)
    fill = lambda rs: max(sum(lengths[i] for i in r) for r in rs)  # noqa: E731
    assert len(balanced) == len(rows) and all(balanced)
    assert sorted(i for r in balanced for i in r) == list(range(len(lengths)))
    assert fill(balanced) <= fill(rows)


def test_first_fits_part_empty_last_row_is_balanced_away():
    lengths = [100] * 34  # first fit into rows of 1000: three rows of 10 and one of 4
    rows = plan_rows(lengths, 1000)
    assert sorted(len(r) for r in rows) == [4, 10, 10, 10]
    assert sorted(len(r) for r in balance_rows(rows, lengths)) == [8, 8, 9, 9]  # padded to 900, not 1000


@st.composite
def _span_blocks(draw):
    """Blocks as collate lays them out: per sequence one word slice (empty without span questions)
    shared by its span questions, label slices consecutive in block order."""
    blocks, w, lab = [], 0, 0
    for b in range(draw(st.integers(1, 12))):
        n_words = draw(st.integers(0, 30))
        for q in range(draw(st.integers(0, 3)) if n_words else 0):
            n_labels = draw(st.integers(1, 5))
            blocks.append((b, q, slice(w, w + n_words), slice(lab, lab + n_labels)))
            lab += n_labels
        w += n_words
    return blocks, w, lab


@settings(max_examples=60, deadline=None)
@given(_span_blocks(), st.sampled_from([1, 40, 1 << 24]))
def test_span_logits_equal_per_block_products(layout, chunk):
    """One matmul per run of blocks, entries gathered, equals each block's own product, whatever
    the runs' size limit (a run of one block at the smallest)."""
    import vela2.scoring.pipeline as pipeline

    blocks, n_words, n_labels = layout
    gen = torch.Generator().manual_seed(len(blocks) * 7919 + n_words)
    head = SpanHead(6, 4)
    words, labels = torch.randn(n_words, 4, generator=gen), torch.randn(n_labels, 4, generator=gen)
    with torch.no_grad():
        head.bias.fill_(0.25)
        want = [(words[ws] @ labels[ls].T * head.scale + head.bias).reshape(-1) for _, _, ws, ls in blocks]
        old = pipeline.SPAN_CHUNK_ELEMENTS
        pipeline.SPAN_CHUNK_ELEMENTS = chunk
        try:
            got = pipeline.span_logits(words, labels, blocks, head)
        finally:
            pipeline.SPAN_CHUNK_ELEMENTS = old
    assert got.dtype == torch.float32
    assert got.shape == (sum(w.numel() for w in want),)
    if want:
        torch.testing.assert_close(got, torch.cat(want), rtol=1e-5, atol=1e-5)
