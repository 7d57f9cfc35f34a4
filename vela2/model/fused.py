"""The fast decoder path of `Vela2Model.encode`: fused projections, compiled layer halves, FP8 GEMMs.

transformers' eager decoder layer runs each projection as its own GEMM (q, k, v; gate, up) and every
RMSNorm, rotary embedding, SiLU * up and residual add as a chain of separate kernels, each a round
trip through device memory. `FusedDecoder` runs the same arithmetic on the same weights with:

- one QKV and one gate_up GEMM per layer: the fused weight is built once from the loaded weights,
  and the module parameters (q_proj.weight, ...) become views into it, so there is one copy in
  memory and `state_dict()` / saving see the stored tensors unchanged;
- each layer split at the attention into two pure tensor functions, `attn_in` (RMSNorm, QKV GEMM,
  rotary) and `attn_out_mlp` (O GEMM, residual, RMSNorm, gate_up GEMM, SiLU * up, down GEMM,
  residual), compiled with torch.compile on CUDA so inductor fuses the elementwise work into the
  GEMMs' neighbours. They take token-major (T, ...) tensors with T = rows x row length marked
  dynamic, so one graph serves every batch shape and every layer (weights are arguments);
- the attention between them as before: sdpa with the dense tree mask, or flex with the batch's
  BlockMask (vela2.model.attention), built once per batch by encode and shared by every layer;
- precision "fp8": every backbone Linear weight quantised once to float8 e4m3 with one scale per
  output channel, activations quantised per token inside the compiled functions (fused into the
  RMSNorm / SiLU * up that produce them) and multiplied with `torch._scaled_mm` (rowwise scales,
  bf16 output). Embeddings, norms, the final norm and the heads stay in their own precision.

On a CPU nothing is compiled: the same functions run eagerly (the tests check them there, fp8
included: torch's CPU `_scaled_mm` takes rowwise scales too). Backbones other than Llama-style
decoders (qwen2, llama, mistral without extra biases or norms) are not handled here: `decoder`
returns None and encode runs transformers' own forward (fp8 then raises PrecisionError).

Shapes: B = rows, L = row length, T = B x L tokens, H = hidden, Hq / Hkv = query / key-value heads,
Dh = head width, I = MLP width.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from vela2.model import invariant

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

log = logging.getLogger(__name__)

MODEL_TYPES = ("qwen2", "llama", "mistral")  # decoders whose layers `attn_in` / `attn_out_mlp` reproduce
ENABLED = True  # False: every backbone runs transformers' own forward (the unfused baseline the benchmarks time)
COMPILE = True  # torch.compile the layer halves on CUDA (False: run them eagerly there too)
# Precisions that take this path off CUDA. fp8 needs it; at bf16 / fp32 a CPU runs transformers' own
# layers, which are faster there (nothing is compiled on a CPU, so nothing fuses: the demo model's
# fp32 batches of short rows ran 10-15% slower through this path on the 2-core CPU machine).
CPU_PRECISIONS: tuple[str, ...] = ("fp8",)
# CUDA-graph replay of small sdpa batches: an inference batch of at most this many tokens, after
# rounding the row length up to a multiple of GRAPH_BUCKET, replays a graph captured once per (rows,
# length, precision) instead of launching ~16 kernels per layer from Python: a short request alone is
# host-bound (one H200, 9B shape, a 587-token row: 36.6 ms launched, 20.7 ms replayed; batch-1 MFU
# 0.29 -> 0.53). 0: off. Each graph holds its static inputs and output (at most ~20 MB at 2,048 tokens
# of the 9B shape); intermediates share one memory pool. At most GRAPH_MAX_COUNT graphs per model:
# shapes beyond them are launched as before.
GRAPH_MAX_TOKENS = 2048
GRAPH_MAX_COUNT = 128
GRAPH_BUCKET = 64  # row lengths are padded up to a multiple of this (fewer graphs, some padded tokens)
FP8 = torch.float8_e4m3fn  # weights and activations of precision fp8 (e4m3: more mantissa than e5m2)
FP8_MAX = float(torch.finfo(FP8).max)  # 448: the scale maps each row's largest |value| here
SCALE_FLOOR = 1e-12  # an all-zero row gets this scale instead of 0 (0 / 0 would give NaN)

Weight = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # bf16/fp32 (N, K) or fp8 (N, K) + scales (1, N)


# --- the arithmetic (pure functions of tensors: what torch.compile sees) ---------------------------


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row float8 quantisation: x (R, K) -> (R, K) e4m3 and fp32 scales (R, 1), with
    x ~= q * scale. Weights use it per output channel, activations per token."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=SCALE_FLOOR) / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def linear(x: torch.Tensor, w: Weight, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """x (T, K) @ w.T (+ bias) -> (T, N) in `dtype` (the compute dtype; bf16 for fp8).

    w is a plain weight (N, K) (cast to `dtype` like autocast would) or an fp8 pair (weight (N, K),
    scales (1, N)): x is then quantised per token and the product runs as one rowwise-scaled GEMM.
    """
    if isinstance(w, tuple):
        w8, w_scale = w
        x8, x_scale = quantize_rows(x)
        out = torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=torch.bfloat16)
        return out if bias is None else out + bias.to(out.dtype)
    return F.linear(x.to(dtype), w.to(dtype), None if bias is None else bias.to(dtype))


def rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama / Qwen2 RMSNorm: normalise in fp32, scale in the input's dtype."""
    hf = h.float()
    return weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as transformers applies it: x * cos + rotate_half(x) * sin.
    x (T, heads, Dh), cos / sin (T, 1, Dh)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attn_in(h: torch.Tensor, ln: torch.Tensor, eps: float, qkv: Weight, qkv_bias: torch.Tensor | None,
            cos: torch.Tensor, sin: torch.Tensor, heads: tuple[int, int, int], kv_repeat: int,
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """First half of a layer: RMSNorm, the fused QKV GEMM, rotary.

    h (T, H) residual stream; cos / sin (T, Dh); heads = (Hq, Hkv, Dh). Returns q (T, Hq, Dh) and
    k, v (T, Hkv * kv_repeat, Dh) in `dtype` (sdpa with a mask wants k / v repeated per query head,
    as transformers does; flex takes them grouped, kv_repeat 1).
    """
    n_q, n_kv, dh = heads
    x = rms_norm(h, ln, eps)
    out = linear(x, qkv, qkv_bias, dtype)  # (T, (Hq + 2 Hkv) Dh)
    q, k, v = out.split((n_q * dh, n_kv * dh, n_kv * dh), dim=-1)
    T = h.shape[0]
    c, s = cos[:, None], sin[:, None]  # (T, 1, Dh), broadcast over heads
    q = rotate(q.view(T, n_q, dh), c, s).to(dtype)
    k = rotate(k.view(T, n_kv, dh), c, s).to(dtype)
    v = v.view(T, n_kv, dh).to(dtype)
    if kv_repeat > 1:  # (T, Hkv, Dh) -> (T, Hkv * rep, Dh), each kv head next to its query heads
        k = k[:, :, None].expand(T, n_kv, kv_repeat, dh).reshape(T, n_kv * kv_repeat, dh)
        v = v[:, :, None].expand(T, n_kv, kv_repeat, dh).reshape(T, n_kv * kv_repeat, dh)
    return q, k, v


def attn_out_mlp(h: torch.Tensor, attn: torch.Tensor, o: Weight, ln: torch.Tensor, eps: float, gate_up: Weight,
                 down: Weight, dtype: torch.dtype) -> torch.Tensor:
    """Second half of a layer: O GEMM + residual, RMSNorm, fused gate_up GEMM, SiLU(gate) * up, down
    GEMM + residual. h (T, H) residual stream, attn (T, Hq * Dh) -> the new residual stream (T, H)."""
    h = h + linear(attn, o, None, dtype)
    x = rms_norm(h, ln, eps)
    gate, up = linear(x, gate_up, None, dtype).chunk(2, dim=-1)  # (T, I) each
    return h + linear(F.silu(gate) * up, down, None, dtype)


@functools.cache
def _compiled_static(fn: Callable) -> Callable:
    """`fn` compiled once per process for static shapes: batch-invariant mode calls it on chunks of one
    shape only, so each kernel inductor generates is the one every chunk runs."""
    from vela2.model.attention import raise_recompile_limit

    raise_recompile_limit()  # the default path's dynamic graph of the same function counts too
    return torch.compile(fn, dynamic=False)


@functools.cache
def _compiled(fn: Callable) -> Callable:
    """`fn` compiled once per process (automatic dynamic shapes; encode marks the token dim dynamic
    from the first call, so later batch shapes reuse the graph instead of recompiling)."""
    return torch.compile(fn, dynamic=None)


# --- weights ----------------------------------------------------------------------------------------


def _fuse(mods: list[nn.Module], attr: str) -> torch.Tensor | None:
    """Concatenate the `attr` tensors ("weight" / "bias") of `mods` along dim 0 and make each module's
    parameter a view into the result (one copy in memory). None when the modules have no `attr`."""
    parts = [getattr(m, attr) for m in mods]
    if parts[0] is None:
        return None
    fused = torch.cat([p.detach() for p in parts])
    at = 0
    for m, p in zip(mods, parts, strict=True):
        setattr(m, attr, nn.Parameter(fused[at : at + p.shape[0]], requires_grad=False))
        at += p.shape[0]
    return fused


def _shares(view: torch.Tensor | None, fused: torch.Tensor | None) -> bool:
    """Whether parameter `view` still lives in `fused`'s memory (`.to()` / `load_state_dict(assign=True)`
    replace it with a tensor of its own)."""
    if view is None or fused is None:
        return view is None and fused is None
    return (view.device == fused.device and view.dtype == fused.dtype
            and view.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr())


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Linear weight (N, K) as fp8 (N, K) with one fp32 scale per output channel, shaped (1, N) as
    `_scaled_mm` takes rowwise scales of its second operand."""
    w8, scale = quantize_rows(w)
    return w8, scale.reshape(1, -1)


@dataclass
class FusedLayer:
    """One decoder layer's modules and the fused tensors built from them."""

    # transformers modules (Any: nn.Module types every attribute Tensor | Module)
    attn: Any  # self_attn: q_proj / k_proj / v_proj / o_proj
    mlp: Any  # gate_proj / up_proj / down_proj
    ln1: Any  # input_layernorm
    ln2: Any  # post_attention_layernorm
    qkv: torch.Tensor  # (Hq Dh + 2 Hkv Dh, H); q/k/v_proj.weight are views into it
    qkv_bias: torch.Tensor | None  # (Hq Dh + 2 Hkv Dh,) (qwen2) or None (llama)
    gate_up: torch.Tensor  # (2 I, H), gate rows first; gate/up_proj.weight are views into it
    fp8: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None  # quantised qkv / o / gate_up / down

    @classmethod
    def build(cls, layer: Any) -> FusedLayer:
        """The fused view of one decoder layer: its q / k / v and gate / up weights each in one matrix."""
        attn, mlp = layer.self_attn, layer.mlp
        projections = [attn.q_proj, attn.k_proj, attn.v_proj]
        return cls(attn, mlp, layer.input_layernorm, layer.post_attention_layernorm,
                   qkv=cast(torch.Tensor, _fuse(projections, "weight")), qkv_bias=_fuse(projections, "bias"),
                   gate_up=cast(torch.Tensor, _fuse([mlp.gate_proj, mlp.up_proj], "weight")))

    def current(self) -> bool:
        """Whether the fused tensors still hold the modules' weights (see `_shares`)."""
        a, m = self.attn, self.mlp
        return (all(_shares(p.weight, self.qkv) for p in (a.q_proj, a.k_proj, a.v_proj))
                and all(_shares(p.bias, self.qkv_bias) for p in (a.q_proj, a.k_proj, a.v_proj))
                and all(_shares(p.weight, self.gate_up) for p in (m.gate_proj, m.up_proj)))

    def weights(self, precision: str) -> tuple[Weight, Weight, Weight, Weight]:
        """(qkv, o, gate_up, down) as `linear` takes them at `precision`."""
        if precision != "fp8":
            return self.qkv, self.attn.o_proj.weight, self.gate_up, self.mlp.down_proj.weight
        if self.fp8 is None:
            self.fp8 = {name: quantize_weight(w) for name, w in (
                ("qkv", self.qkv), ("o", self.attn.o_proj.weight), ("gate_up", self.gate_up),
                ("down", self.mlp.down_proj.weight))}
        f = self.fp8
        return f["qkv"], f["o"], f["gate_up"], f["down"]


def supported(backbone: Any) -> str | None:
    """None when `FusedDecoder` reproduces this backbone's forward, else the reason it does not."""
    if not ENABLED:
        return "any backbone while vela2.model.fused.ENABLED is False"
    config: Any = getattr(backbone, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        return f"model_type {model_type!r} (fused: {', '.join(MODEL_TYPES)})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (fused: silu)"
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        return "sliding-window layers"
    for layer in backbone.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if attn.o_proj.bias is not None or any(p.bias is not None for p in (mlp.gate_proj, mlp.up_proj,
                                                                            mlp.down_proj)):
            return "biases on o_proj or the MLP"
        if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
            return "q / k norms"
    return None


class FusedDecoder:
    """The backbone's forward with fused projections and compiled layer halves (module docstring).

    Holds no weights of its own but the fused QKV / gate_up tensors (whose slices ARE the module
    parameters) and, once precision fp8 has run, the fp8 copies (1 byte per backbone Linear weight).
    """

    def __init__(self, backbone: Any):
        reason = supported(backbone)
        if reason is not None:
            raise ValueError(f"FusedDecoder does not handle this backbone: {reason}")
        self.backbone = backbone
        config: Any = backbone.config
        self.n_q = int(config.num_attention_heads)
        self.n_kv = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.n_q)
        self.eps = float(config.rms_norm_eps)
        with torch.no_grad():
            self.layers = [FusedLayer.build(layer) for layer in backbone.layers]
        # (rows, length, precision, inference mode) -> graph + its static buffers
        self._graphs: dict[tuple[int, int, str, bool], tuple] = {}
        self._pool: Any = None  # the graphs' shared memory pool

    def current(self) -> bool:
        """Whether every layer's fused tensors still hold the backbone's weights."""
        return all(layer.current() for layer in self.layers)

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | BlockMask,
                 precision: str, flex: Callable | None) -> torch.Tensor:
        """Final-norm hidden states (B, L, H) in the backbone's dtype.

        mask: the dense tree mask (B, 1, L, L) for sdpa, or the batch's BlockMask with `flex` the
        compiled flex_attention to call. precision: "fp32", "bf16" or "fp8" (GEMMs in fp8, the rest bf16).
        Small sdpa inference batches on CUDA replay a CUDA graph (`replays`; the same arithmetic over
        the batch padded to a multiple of GRAPH_BUCKET tokens).
        """
        B, L = input_ids.shape
        length = graph_length(L)
        key = (B, length, precision, torch.is_inference_mode_enabled())
        if replays(B, L, flex is not None, input_ids.is_cuda, torch.is_grad_enabled()) and (
                key in self._graphs or len(self._graphs) < GRAPH_MAX_COUNT):
            return self._replay(input_ids, position_ids, cast(torch.Tensor, mask), key)
        return self.forward(input_ids, position_ids, mask, precision, flex)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | BlockMask,
                precision: str, flex: Callable | None) -> torch.Tensor:
        """The forward itself (`__call__` without graph replay)."""
        backbone: Any = self.backbone
        B, L = input_ids.shape
        T = B * L
        dtype = torch.float32 if precision == "fp32" else torch.bfloat16  # compute dtype of GEMMs and attention
        h = backbone.embed_tokens(input_ids)  # (B, L, H) in the backbone's dtype: the residual stream's
        cos, sin = backbone.rotary_emb(h, position_ids)  # (B, L, Dh) each, h's dtype
        h, cos, sin = h.reshape(T, -1), cos.reshape(T, -1), sin.reshape(T, -1)
        first, second = attn_in, attn_out_mlp
        if h.is_cuda and COMPILE:
            first, second = _compiled(attn_in), _compiled(attn_out_mlp)
            for t in (h, cos, sin):  # one graph for every batch shape: T symbolic from the first call
                torch._dynamo.maybe_mark_dynamic(t, 0)
        heads = (self.n_q, self.n_kv, self.head_dim)
        kv_repeat = 1 if flex is not None else self.n_q // self.n_kv
        scale = self.head_dim**-0.5
        for layer in self.layers:
            qkv, o, gate_up, down = layer.weights(precision)
            q, k, v = first(h, layer.ln1.weight, self.eps, qkv, layer.qkv_bias, cos, sin, heads, kv_repeat, dtype)
            # (T, heads, Dh) -> (B, heads, L, Dh) views, the layout both attention kernels take
            q, k, v = (t.view(B, L, t.shape[1], self.head_dim).transpose(1, 2) for t in (q, k, v))
            if flex is not None:
                a = flex(q, k, v, block_mask=mask, scale=scale, enable_gqa=self.n_q != self.n_kv)
            else:
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=cast(torch.Tensor, mask), scale=scale)
            a = a.transpose(1, 2).reshape(T, self.n_q * self.head_dim)  # (T, Hq Dh)
            if h.is_cuda and COMPILE:
                torch._dynamo.maybe_mark_dynamic(a, 0)
            h = second(h, a, o, layer.ln2.weight, self.eps, gate_up, down, dtype)
        return backbone.norm(h.view(B, L, -1))

    def invariant_forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, parts: torch.Tensor,
                          layout: invariant.AttentionLayout, precision: str) -> torch.Tensor:
        """`forward` in batch-invariant mode (vela2.model.invariant): input_ids / position_ids / parts
        (T,) one stream of sequences, T a multiple of the device's chunk (`invariant.chunk_tokens`).
        Token-wise work runs on chunks of exactly that many tokens (compiled for that one static shape
        on CUDA), attention per sequence (`invariant.attention`). Returns final-norm hidden states (T, H)."""
        backbone: Any = self.backbone
        dtype = torch.float32 if precision == "fp32" else torch.bfloat16
        first, second, norm = attn_in, attn_out_mlp, backbone.norm
        if input_ids.is_cuda and COMPILE:
            first, second, norm = _compiled_static(attn_in), _compiled_static(attn_out_mlp), _compiled_static(norm)
        pieces = list(invariant.chunks(input_ids.shape[0], invariant.chunk_tokens(input_ids.device)))
        h = backbone.embed_tokens(input_ids)  # (T, H): a lookup, the same bits in any batch
        rotary = [backbone.rotary_emb(h[None, s], position_ids[None, s]) for s in pieces]  # cos / sin per chunk
        cos, sin = (torch.cat([r[i][0] for r in rotary]) for i in (0, 1))  # (T, Dh) each
        heads = (self.n_q, self.n_kv, self.head_dim)
        masks = invariant.group_masks(parts, layout, dtype)  # every layer's, built once
        for layer in self.layers:
            qkv, o, gate_up, down = layer.weights(precision)
            qkv_chunks = [first(h[s], layer.ln1.weight, self.eps, qkv, layer.qkv_bias, cos[s], sin[s], heads,
                                self.n_q // self.n_kv, dtype) for s in pieces]
            q, k, v = (torch.cat([c[i] for c in qkv_chunks]) for i in range(3))  # (T, Hq, Dh) each
            a = invariant.attention(q, k, v, masks, layout, self.head_dim**-0.5)  # (T, Hq Dh)
            h = torch.cat([second(h[s], a[s], o, layer.ln2.weight, self.eps, gate_up, down, dtype) for s in pieces])
        return torch.cat([norm(h[s]) for s in pieces])

    def _replay(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor,
                key: tuple[int, int, str, bool]) -> torch.Tensor:
        """`forward` through the CUDA graph of `key`'s padded shape (B, length), captured on first use."""
        B, L = input_ids.shape
        _, length, precision, _ = key
        if key not in self._graphs:
            self._graphs[key] = self._capture(B, length, precision, input_ids.device)
        graph, ids, pos, dense, out = self._graphs[key]
        ids_in, pos_in, mask_in = pad_dense(input_ids, position_ids, mask, length)
        ids.copy_(ids_in)
        pos.copy_(pos_in)
        dense.copy_(mask_in)
        graph.replay()
        return out[:, :L].clone()  # the next replay overwrites `out`

    def _capture(self, B: int, length: int, precision: str, device: torch.device) -> tuple:
        """Capture `forward` over static (B, length) inputs: warm-ups on a side stream first (compiles,
        cuBLAS handles, fp8 quantisation: nothing may allocate or synchronise for the first time
        inside the capture)."""
        ids = torch.zeros((B, length), dtype=torch.long, device=device)
        pos = torch.zeros_like(ids)
        dense = torch.eye(length, dtype=torch.bool, device=device).expand(B, 1, length, length).contiguous()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.forward(ids, pos, dense, precision, None)
        torch.cuda.current_stream(device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the worker's device process waits on earlier batches' events from another thread
        # while this one captures (the default, global, would make those calls fail the capture)
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            out = self.forward(ids, pos, dense, precision, None)
        log.info("captured a CUDA graph of the fused decoder: %d x %d tokens, %s", B, length, precision)
        return graph, ids, pos, dense, out


def traffic_shapes(row_tokens: int | None) -> list[tuple[int, int]]:
    """The (rows, padded length) shapes of replayed batches that traffic makes, smallest first, at
    most GRAPH_MAX_COUNT: with packed rows of `row_tokens`, every row count and length they can pad
    to within GRAPH_MAX_TOKENS; without, a lone sequence of every length (one request alone: the
    latency case; bigger unpacked batches are captured when they first come)."""
    widest = min(row_tokens or GRAPH_MAX_TOKENS, GRAPH_MAX_TOKENS)
    most_rows = max(1, GRAPH_MAX_TOKENS // widest) if row_tokens else 1
    shapes = [(rows, length) for rows in range(1, most_rows + 1)
              for length in range(GRAPH_BUCKET, graph_length(widest) + 1, GRAPH_BUCKET)
              if rows * length <= GRAPH_MAX_TOKENS]
    return sorted(shapes, key=lambda s: s[0] * s[1])[:GRAPH_MAX_COUNT]


def capture_traffic_graphs(model: Any, precision: str, row_tokens: int | None) -> int:
    """Capture now, in one pass, the CUDA graphs of every shape in `traffic_shapes` (a worker's
    warm-up: else each new shape of live traffic paid a capture, ~0.2 s, on the H200 a storm of 32
    in the first minute after ready). Returns how many were captured (0 off CUDA, under flex, or on
    a backbone FusedDecoder does not handle)."""
    engine = decoder(model, precision)
    if (engine is None or model.device.type != "cuda" or model.attn != "sdpa" or not GRAPH_MAX_TOKENS
            or model.batch_invariant):  # that mode replays no graph
        return 0
    new = 0
    with torch.inference_mode():  # as run_batch serves: the graphs are keyed by it
        for rows, length in traffic_shapes(row_tokens):
            key = (rows, length, precision, True)
            if key not in engine._graphs and len(engine._graphs) < GRAPH_MAX_COUNT:
                engine._graphs[key] = engine._capture(rows, length, precision, model.device)
                new += 1
    return new


def graph_length(length: int) -> int:
    """The row length a batch of rows of `length` tokens is replayed at (a multiple of GRAPH_BUCKET)."""
    return -(-length // GRAPH_BUCKET) * GRAPH_BUCKET


def replays(rows: int, length: int, flex: bool, cuda: bool, grad: bool) -> bool:
    """Whether a batch of `rows` rows of `length` tokens replays a CUDA graph: on CUDA, under sdpa (a
    dense mask: flex's BlockMask is rebuilt per batch), without autograd (training launches), and
    within GRAPH_MAX_TOKENS once padded."""
    return cuda and not flex and not grad and rows * graph_length(length) <= GRAPH_MAX_TOKENS


def pad_dense(input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor,
              length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A (B, L) batch and its dense tree mask (B, 1, L, L) padded on the right to `length` the way
    collate pads: pad positions hold token 0 at position 0, see only themselves, and no real token sees
    them (so real tokens' outputs do not change)."""
    B, L = input_ids.shape
    if length < L:
        raise ValueError(f"pad_dense: length {length} is shorter than the batch's {L} tokens")
    extra = length - L
    ids = F.pad(input_ids, (0, extra), value=0)
    pos = F.pad(position_ids, (0, extra), value=0)
    dense = F.pad(mask, (0, extra, 0, extra), value=False)  # (B, 1, length, length)
    pad = torch.arange(L, length, device=mask.device)
    dense[:, :, pad, pad] = True
    return ids, pos, dense


def decoder(model: Any, precision: str, batch_invariant: bool = False) -> FusedDecoder | None:
    """The model's FusedDecoder, built on first use and rebuilt when its weights were replaced since
    (a `.to()` or a reload); None when the backbone is not one `FusedDecoder` handles, or off CUDA at
    a precision not in CPU_PRECISIONS unless `batch_invariant` (that mode runs on it everywhere)."""
    if not ENABLED or (model.device.type != "cuda" and precision not in CPU_PRECISIONS and not batch_invariant):
        return None
    fused = getattr(model, "_fused", None)
    if fused is not None and fused.backbone is model.backbone and fused.current():
        return fused
    if supported(model.backbone) is not None:
        return None
    fused = FusedDecoder(model.backbone)
    model._fused = fused
    log.info("fused decoder built: %d layers, QKV and gate_up fused; layer halves compiled: %s", len(fused.layers),
             COMPILE and model.device.type == "cuda")
    return fused
