"""The fused decoder (vela2.model.fused) against transformers' own forward on tiny random models, its
weights (views, saving, rebuilds), and precision fp8 (quantisation, the GEMM, the whole forward)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

import vela2
from vela2.errors import PrecisionError
from vela2.model import fused
from vela2.model.attention import tree_mask
from vela2.model.checkpoint import load, save
from vela2.model.modeling import Vela2Model
from vela2.scoring.pipeline import collate, prepare, run_batch
from vela2.train.demo_model import demo_calibration, demo_config, demo_tokenizer, sample_rows

TOKENIZER = demo_tokenizer()


@pytest.fixture(autouse=True)
def fused_on_this_cpu(monkeypatch):
    """Every precision through the fused path here (on a CPU only fp8 takes it by default)."""
    monkeypatch.setattr(fused, "CPU_PRECISIONS", ("fp8", "fp32", "bf16"))


ROWS = [dict(r, units=True, logits=True) for r in sample_rows()]


def tiny(model_type: str = "qwen2", seed: int = 0, dtype: torch.dtype = torch.float32, **backbone) -> Vela2Model:
    """A 2-layer random model of `model_type` (qwen2 has q/k/v biases, llama and mistral none)."""
    config = demo_config(vocab_size=TOKENIZER.get_vocab_size(), **backbone)
    config = dataclasses.replace(config, backbone={**config.backbone, "model_type": model_type})
    return Vela2Model.random(config, TOKENIZER, demo_calibration(), dtype=dtype, seed=seed)


def batch(model: Vela2Model, row_tokens: int | None = 512):
    """Every sample row's sequences collated (packed rows by default): ids, pos, parts, segs."""
    seqs = [s for r in ROWS for s in prepare(model, r).sequences]
    return collate(seqs, model.special_ids["pad"], model.device, row_tokens)[:4]


@torch.inference_mode()
def transformers_forward(model: Vela2Model, ids, pos, parts, segs, precision: str) -> torch.Tensor:
    """The unfused reference: the backbone's own forward under bf16 autocast (the path before fusion)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        out = model.backbone(input_ids=ids, attention_mask=tree_mask(parts, segs), position_ids=pos, use_cache=False)
    return out.last_hidden_state.float()


@torch.inference_mode()
def encode(model: Vela2Model, ids, pos, parts, segs, precision: str) -> torch.Tensor:
    return model.encode(ids, pos, parts, segs, precision)


# --- fused == unfused --------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["qwen2", "llama", "mistral"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["held_fp32", "held_bf16"])
def test_fused_equals_transformers(model_type, dtype):
    model = tiny(model_type, seed=3, dtype=dtype)
    ids, pos, parts, segs = batch(model)
    real = parts >= 0
    for precision in ("fp32", "bf16") if dtype == torch.float32 else ("bf16",):
        ref = transformers_forward(model, ids, pos, parts, segs, precision)
        got = encode(model, ids, pos, parts, segs, precision)
        assert model._fused is not None  # the fused path ran
        # same kernels in the same order on a CPU: equal up to the last bit or two of float32 / bf16
        tol = 1e-5 if precision == "fp32" else 2e-2
        assert (got - ref)[real].abs().max() <= tol * ref[real].abs().max()


def test_projections_are_views_of_one_fused_weight():
    model = tiny(seed=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    encode(model, *batch(model), "fp32")
    layer = model._fused.layers[0]
    attn = model.backbone.layers[0].self_attn
    assert layer.qkv.shape[0] == sum(p.weight.shape[0] for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    assert attn.k_proj.weight.untyped_storage().data_ptr() == layer.qkv.untyped_storage().data_ptr()
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k in before:  # same names, shapes and values: the checkpoint format does not change
        assert torch.equal(after[k], before[k]), k


def test_save_and_load_after_fusion(tmp_path):
    model = tiny(seed=6)
    ids, pos, parts, segs = batch(model)
    out = encode(model, ids, pos, parts, segs, "fp32")
    save(model, tmp_path / "ckpt")
    again = load(tmp_path / "ckpt")
    for k, v in model.state_dict().items():  # stored bf16 matmul weights come back as stored
        expected = v.to(torch.bfloat16).float() if "proj.weight" in k else v
        assert torch.equal(again.state_dict()[k], expected), k
    again_out = encode(again, ids, pos, parts, segs, "fp32")
    assert (again_out - out)[parts >= 0].abs().max() < 0.05 * out.abs().max()  # bf16-rounded weights


def test_rebuilt_when_weights_are_replaced():
    model = tiny(seed=7)
    ids, pos, parts, segs = batch(model)
    encode(model, ids, pos, parts, segs, "bf16")
    first = model._fused
    held16 = copy.deepcopy(model)  # deepcopy gives each parameter its own copy: no longer views
    assert not held16._fused.current()
    held16.backbone.to(torch.bfloat16)
    got = encode(held16, ids, pos, parts, segs, "bf16")
    assert held16._fused is not first and held16._fused.current()
    ref = transformers_forward(held16, ids, pos, parts, segs, "bf16")
    real = parts >= 0
    assert (got - ref)[real].abs().max() <= 2e-2 * ref[real].abs().max()


def test_unsupported_backbone_falls_back_and_refuses_fp8():
    model = tiny(seed=8)
    model.backbone.config.hidden_act = "gelu"  # not what attn_out_mlp computes
    ids, pos, parts, segs = batch(model)
    got = encode(model, ids, pos, parts, segs, "fp32")
    assert getattr(model, "_fused", None) is None  # transformers' forward ran
    assert torch.equal(got, transformers_forward(model, ids, pos, parts, segs, "fp32"))
    with pytest.raises(PrecisionError, match="precision fp8 runs on the fused decoder only, which does not "
                                             "handle hidden_act 'gelu'"):
        model.check_precision("fp8")


# --- fp8 -----------------------------------------------------------------------------------------------


def test_quantize_rows_error_bound():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=gen) * torch.logspace(-3, 3, 64)[:, None]  # rows of very different size
    x[5] = 0.0
    q, scale = fused.quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (64, 1)
    back = q.float() * scale
    assert torch.equal(back[5], torch.zeros(256))  # an all-zero row stays zero, no NaN
    # e4m3 keeps 3 mantissa bits: each value within half a step (2^-4 relative) of itself, and the
    # row's largest value maps to 448 exactly
    amax = x.abs().amax(-1, keepdim=True)
    assert ((back - x).abs() <= x.abs() * 2**-4 + amax * 2**-9 / 448 * 8).all()
    assert torch.allclose(q.float().abs().amax(-1)[amax[:, 0] > 0], torch.tensor(448.0))


def test_fp8_linear_equals_dequantised_matmul():
    gen = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(40, 128, generator=gen), torch.randn(96, 128, generator=gen), torch.randn(96, generator=gen)
    w8 = fused.quantize_weight(w)
    got = fused.linear(x, w8, b, torch.bfloat16)
    x8, xs = fused.quantize_rows(x)
    ref = (x8.float() * xs) @ (w8[0].float() * w8[1].reshape(-1, 1)).T + b
    assert got.dtype == torch.bfloat16
    assert (got.float() - ref).abs().max() <= 2**-7 * ref.abs().max()  # the bf16 output's rounding
    exact = x @ w.T + b
    assert (got.float() - exact).abs().max() < 0.1 * exact.abs().max()  # and fp8 is near the real product


def test_fp8_forward_near_bf16_and_heads_stay_fp32():
    model = tiny(seed=9)
    ids, pos, parts, segs = batch(model)
    real = parts >= 0
    h16 = encode(model, ids, pos, parts, segs, "bf16")
    h8 = encode(model, ids, pos, parts, segs, "fp8")
    assert h8.dtype == torch.float32 and torch.isfinite(h8).all()
    rel = ((h8 - h16)[real].norm() / h16[real].norm()).item()
    assert 1e-3 < rel < 0.1  # fp8 differs from bf16 (it really ran), by quantisation noise only
    layer = model._fused.layers[0]
    assert layer.fp8 is not None and layer.fp8["gate_up"][0].dtype == torch.float8_e4m3fn
    assert model.option_head.out.weight.dtype == torch.float32  # heads and norms untouched
    assert model.backbone.norm.weight.dtype == torch.float32
    assert model.backbone.embed_tokens.weight.dtype == torch.float32


def test_fp8_context_states_do_not_depend_on_the_batch():
    """Per-token activation scales: a token's fp8 output never depends on other tokens, so a
    sequence gives the same states alone, packed with others, or bundled with more questions."""
    model = tiny(seed=10)
    seqs = [s for r in ROWS for s in prepare(model, r).sequences]
    alone = run_batch(model, seqs[:1], "fp8")[0]
    packed = run_batch(model, seqs[::-1], "fp8", row_tokens=512)[-1]
    for q in alone.options:
        np.testing.assert_allclose(packed.options[q], alone.options[q], atol=2e-2)
    for q in alone.spans:
        np.testing.assert_allclose(packed.spans[q], alone.spans[q], atol=2e-2)


def test_predict_fp8_equals_run_batch():
    model = tiny(seed=11)
    (res,) = vela2.predict(model, ROWS[:1], precision="fp8")
    prep = prepare(model, ROWS[0])
    (out,) = run_batch(model, prep.sequences, "fp8")
    assert res.status == "ok"
    np.testing.assert_allclose(res.answers[0].logits, out.options[0], atol=1e-6)


# --- CUDA-graph padding ----------------------------------------------------------------------------------


def test_pad_dense_equals_the_tree_mask_of_the_padded_batch():
    model = tiny(seed=12)
    ids, pos, parts, segs = batch(model, row_tokens=None)
    B, L = ids.shape
    length = L + 37
    got_ids, got_pos, got_mask = fused.pad_dense(ids, pos, tree_mask(parts, segs), length)
    pad = torch.nn.functional.pad
    assert torch.equal(got_mask, tree_mask(pad(parts, (0, 37), value=-1), pad(segs, (0, 37), value=-1)))
    assert torch.equal(got_ids[:, :L], ids) and (got_ids[:, L:] == 0).all()
    assert torch.equal(got_pos[:, :L], pos) and (got_pos[:, L:] == 0).all()
    # real tokens' states are the same with the padding (what graph replay relies on)
    encode(model, ids, pos, parts, segs, "fp32")  # builds model._fused
    with torch.inference_mode():
        plain = model._fused.forward(ids, pos, tree_mask(parts, segs), "fp32", None)
        padded = model._fused.forward(got_ids, got_pos, got_mask, "fp32", None)
    real = parts >= 0
    assert (padded[:, :L] - plain)[real].abs().max() <= 1e-5 * plain[real].abs().max()
    with pytest.raises(ValueError, match=f"length {L - 1} is shorter than the batch's {L} tokens"):
        fused.pad_dense(ids, pos, tree_mask(parts, segs), L - 1)


def test_which_batches_replay_a_cuda_graph():
    # rows x length rounded up to GRAPH_BUCKET, within GRAPH_MAX_TOKENS; never under flex (a BlockMask per
    # batch), never with autograd on (training must launch, a replay records no graph for backward),
    # never off CUDA
    limit, bucket = fused.GRAPH_MAX_TOKENS, fused.GRAPH_BUCKET
    assert limit > 0 and limit % bucket == 0
    assert fused.graph_length(1) == bucket and fused.graph_length(bucket) == bucket
    assert fused.graph_length(bucket + 1) == 2 * bucket
    assert fused.replays(1, limit, flex=False, cuda=True, grad=False)
    assert not fused.replays(1, limit + 1, flex=False, cuda=True, grad=False)  # padded past the limit
    assert fused.replays(limit // bucket, bucket - 5, flex=False, cuda=True, grad=False)
    assert not fused.replays(limit // bucket + 1, 1, flex=False, cuda=True, grad=False)
    assert not fused.replays(1, 10, flex=True, cuda=True, grad=False)
    assert not fused.replays(1, 10, flex=False, cuda=True, grad=True)
    assert not fused.replays(1, 10, flex=False, cuda=False, grad=False)


def test_traffic_shapes_are_every_packed_shape_under_the_graph_budget():
    """What the warm-up captures (fused.capture_traffic_graphs): every (rows, padded length) a batch of
    packed rows can replay at, within GRAPH_MAX_TOKENS and GRAPH_MAX_COUNT; unpacked, a lone sequence
    of every length."""
    step, most = fused.GRAPH_BUCKET, fused.GRAPH_MAX_TOKENS
    assert fused.traffic_shapes(2048) == [(1, n) for n in range(step, 2048 + 1, step)] == fused.traffic_shapes(None)
    shapes = fused.traffic_shapes(512)
    assert {rows for rows, _ in shapes} == {1, 2, 3, 4} and max(length for _, length in shapes) == 512
    assert all(rows * length <= most and length % step == 0 for rows, length in shapes)
    assert len(shapes) == len(set(shapes)) <= fused.GRAPH_MAX_COUNT
    assert fused.traffic_shapes(100)[-1] == (16, 128)  # short rows pad to 128: up to 16 of them
    assert fused.capture_traffic_graphs(tiny(), "bf16", 2048) == 0  # graphs are CUDA's: a CPU captures none
