"""Vela 2 model: a transformers decoder backbone run with a tree mask, plus the fp32 heads.

Read top-down: the heads, the tree mask, then the model that ties backbone and heads together.
Shapes: B = sequences in a batch, L = padded length, H = backbone hidden size, D = head width,
W = words of a sequence's context window, K = labels of a span block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn
from transformers import AutoConfig, AutoModel

from vela2.config import PRECISIONS, Vela2Config
from vela2.errors import CheckpointError, PrecisionError
from vela2.model import attention, fused, invariant
from vela2.model.calibration import Calibration

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask
    from transformers import PretrainedConfig


class OptionHead(nn.Module):
    """Scores one marker ([OPT] / [ABS]) hidden state: a one-hidden-layer MLP to a scalar logit."""

    def __init__(self, hidden_size: int, width: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, width)
        self.out = nn.Linear(width, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(M, H) marker states -> (M,) logits."""
        return self.out(nn.functional.gelu(self.dense(h))).squeeze(-1)


class SpanHead(nn.Module):
    """Span head v2: bilinear word x label score in a D-wide space, plus a bias."""

    def __init__(self, hidden_size: int, dim: int):
        super().__init__()
        self.word = nn.Linear(hidden_size, dim)
        self.label = nn.Linear(hidden_size, dim)
        self.bias = nn.Parameter(torch.zeros(()))
        self.scale = 1.0 / math.sqrt(dim)

    def forward(self, words: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(W, H) first-token states of words, (K, H) [LBL] states -> (W, K) logits."""
        return (self.word(words) @ self.label(labels).T) * self.scale + self.bias


@dataclass
class HeadInputs:
    """Flat gather indices of one batch into the backbone output (built by pipeline.collate)."""

    option_index: torch.Tensor  # (M, 2) (sequence, position) of every [OPT]/[ABS] marker
    word_index: torch.Tensor  # (N, 2) (sequence, position) of every context word's first token
    label_index: torch.Tensor  # (K, 2) (sequence, position) of every [LBL] marker


class Vela2Model(nn.Module):
    """Backbone + option head + span head, with the tokenizer and calibration it was exported with."""

    def __init__(self, config: Vela2Config, tokenizer, calibration: Calibration, backbone: nn.Module):
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer  # a `tokenizers.Tokenizer`
        self.calibration = calibration
        self.backbone = backbone
        self.digest: str | None = None  # the checkpoint's (vela2.model.checkpoint.digest); None: built in memory
        # batch-invariant mode (vela2.model.invariant): the default of every scoring call on this model
        # (the worker's --batch-invariant sets it; predict(batch_invariant=...) overrides it per call)
        self.batch_invariant = False
        hidden = config.hidden_size
        self.option_head = OptionHead(hidden, config.heads.option_hidden)
        self.span_head = SpanHead(hidden, config.heads.span_dim)
        self.special_ids = {}
        for field_name, token in vars(config.special_tokens).items():
            tid = tokenizer.token_to_id(token)
            if tid is None:
                raise CheckpointError(
                    f"special token {token!r} ({field_name}) is not in the tokenizer (the checkpoint's "
                    "tokenizer.json must hold every token of config.json's special_tokens)"
                )
            self.special_ids[field_name] = tid

    @property
    def name(self) -> str:
        """The model's name (requests name it)."""
        return self.config.name

    @property
    def device(self) -> torch.device:
        """The device the model's weights are on."""
        return self.option_head.out.weight.device

    @property
    def backbone_dtype(self) -> torch.dtype:
        """The dtype the backbone's weights are held in."""
        return next(self.backbone.parameters()).dtype

    @property
    def attn(self) -> str:
        """Attention backend: "sdpa" (dense tree mask) or "flex" (block-sparse, see vela2.model.attention)."""
        config = cast("PretrainedConfig", self.backbone.config)  # nn.Module types it Tensor | Module
        return "flex" if config._attn_implementation == attention.IMPLEMENTATION else "sdpa"

    @attn.setter
    def attn(self, attn: str) -> None:
        attention.set_backbone_attention(self.backbone, attn)

    def set_attention(self, attn: str) -> Vela2Model:
        """Switch the backbone's attention backend in place ("sdpa" or "flex"); returns the model."""
        self.attn = attn
        return self

    @classmethod
    def random(
        cls,
        config: Vela2Config,
        tokenizer,
        calibration: Calibration | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ) -> Vela2Model:
        """A model with seeded random weights built directly on `device` (benchmarks, the demo)."""
        torch.manual_seed(seed)
        with torch.device(device):
            model = cls(config, tokenizer, calibration or Calibration(), build_backbone(config))
        model.backbone.to(dtype)
        model.eval()
        return model

    def check_precision(self, precision: str) -> None:
        """PrecisionError unless `precision` is known and the backbone's dtype can run it."""
        if precision not in PRECISIONS:
            raise PrecisionError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
        if precision == "fp32" and self.backbone_dtype != torch.float32:
            raise PrecisionError(
                f"precision fp32 needs the backbone held in float32; it is {self.backbone_dtype} "
                "(load with dtype=torch.float32)"
            )
        if precision == "fp8" and (reason := fused.supported(self.backbone)) is not None:
            raise PrecisionError(f"precision fp8 runs on the fused decoder only, which does not handle {reason}")

    def check_batch_invariant(self) -> None:
        """PrecisionError unless batch-invariant mode can run this backbone (on the fused decoder only)."""
        if (reason := fused.supported(self.backbone)) is not None:
            raise PrecisionError(f"batch-invariant mode runs on the fused decoder only, which does not handle {reason}")

    def use_batch_invariant(self) -> None:
        """Make batch-invariant mode every call's default on this model (PrecisionError, as
        `check_batch_invariant`, when the backbone has none)."""
        self.check_batch_invariant()
        self.batch_invariant = True

    def encode(self, input_ids: torch.Tensor, position_ids: torch.Tensor, parts: torch.Tensor,
               segments: torch.Tensor, precision: str, layout: invariant.AttentionLayout | None = None) -> torch.Tensor:
        """Backbone over a padded batch with the tree mask; returns fp32 states (B, L, H).

        `layout` (batch-invariant mode, vela2.model.invariant): the batch is one stream (1, T) laid
        out by `pipeline.collate(..., batch_invariant=True)`, run by `FusedDecoder.invariant_forward`.

        Llama-style backbones on CUDA run `vela2.model.fused.FusedDecoder` (fused projections, compiled
        layer halves; precision fp8 needs it, on a CPU too), everything else transformers' own
        forward under bf16 autocast."""
        self.check_precision(precision)
        if layout is not None:  # batch-invariant mode: one stream (1, T), attention per sequence
            stream = fused.decoder(self, precision, batch_invariant=True)
            if stream is None:  # a backbone the fused decoder does not handle: the error names why
                self.check_batch_invariant()
            stream = cast(fused.FusedDecoder, stream)
            return stream.invariant_forward(input_ids[0], position_ids[0], parts[0], layout, precision)[None].float()
        L = input_ids.shape[1]
        mask: torch.Tensor | BlockMask
        if self.attn == "flex":  # whole 128-token tiles, so compiled shapes repeat; sliced off below
            input_ids, position_ids, parts, segments = attention.pad_batch(
                input_ids, position_ids, parts, segments, self.special_ids["pad"])
            mask = attention.block_mask(parts, segments)
        else:
            mask = attention.tree_mask(parts, segments)
        engine = fused.decoder(self, precision)  # None: transformers' own layers (see vela2.model.fused)
        if engine is not None:
            flex = attention.compiled_flex_attention() if self.attn == "flex" else None
            return engine(input_ids, position_ids, mask, precision, flex)[:, :L].float()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = self.backbone(
                input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False
            )
        return out.last_hidden_state[:, :L].float()

    def heads(self, hidden: torch.Tensor, idx: HeadInputs,
              batch_invariant: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gather marker / word states and run the heads in fp32 (autocast off).

        Returns option logits (M,), projected word states (N, D) and projected label states (K, D);
        span logits of a block are word_proj[its words] @ label_proj[its labels].T * scale + bias.
        `batch_invariant`: each head runs on chunks of a fixed number of rows (vela2.model.invariant).
        """
        def run(head: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return invariant.rows_chunked(head, x) if batch_invariant else head(x)

        with torch.autocast(self.device.type, enabled=False):
            opt = run(self.option_head, hidden[idx.option_index[:, 0], idx.option_index[:, 1]])
            words = run(self.span_head.word, hidden[idx.word_index[:, 0], idx.word_index[:, 1]])
            labels = run(self.span_head.label, hidden[idx.label_index[:, 0], idx.label_index[:, 1]])
        return opt, words, labels


def backbone_config(config: Vela2Config):
    """The transformers config of the backbone: sdpa attention, no KV cache, no sliding window."""
    d = dict(config.backbone)
    model_type = d.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **d)
    cfg.use_cache = False
    if hasattr(cfg, "use_sliding_window"):
        cfg.use_sliding_window = False
    return cfg


def build_backbone(config: Vela2Config, attn: str = "sdpa") -> nn.Module:
    """An uninitialised-from-hub decoder built with `from_config` (never downloads anything);
    attn "sdpa" or "flex" (vela2.model.attention)."""
    return AutoModel.from_config(backbone_config(config), attn_implementation=attention.implementation(attn))
