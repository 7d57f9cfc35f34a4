"""The fused decoder under flex attention (torch.compile: a C++ compiler process on a CPU) equals it
under sdpa."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vela2.model import fused
from vela2.model.modeling import Vela2Model
from vela2.scoring.pipeline import collate, prepare
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
def encode(model: Vela2Model, ids, pos, parts, segs, precision: str) -> torch.Tensor:
    return model.encode(ids, pos, parts, segs, precision)


# --- fused == unfused --------------------------------------------------------------------------------


def test_fused_flex_equals_sdpa():
    model = tiny(seed=4)
    ids, pos, parts, segs = batch(model)
    real = parts >= 0
    sdpa = encode(model, ids, pos, parts, segs, "fp32")
    flex = encode(model.set_attention("flex"), ids, pos, parts, segs, "fp32")
    assert (flex - sdpa)[real].abs().max() <= 1e-5 * sdpa[real].abs().max()


# --- fp8 -----------------------------------------------------------------------------------------------


# --- CUDA-graph padding ----------------------------------------------------------------------------------


