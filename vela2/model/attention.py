"""Attention backends of the backbone: sdpa with the dense tree mask, or flex with a block-sparse one.

sdpa (the default) takes `tree_mask`, a (B, 1, L, L) boolean tensor: every (query, key)
pair is computed and then masked, so packed rows (several sequences per row) pay for the full
L x L square although most of it is masked. flex (torch.nn.attention.flex_attention) takes a
BlockMask built from the same rule: (query, key) tiles of `BLOCK_SIZE` x `BLOCK_SIZE` that are
fully masked are skipped, fully visible ones run without evaluating the mask.

How it plugs into transformers: `register()` adds `IMPLEMENTATION` to transformers'
AttentionInterface (a function of ours, not transformers' own "flex_attention", so that we own
the compile settings and the call across transformers versions), and `set_backbone_attention`
switches the backbone's `config._attn_implementation`. The BlockMask is handed to the backbone as
`attention_mask`; masking_utils passes any 4-D mask (Tensor or BlockMask) through unchanged.

Shapes: B = rows, L = padded row length, Hq / Hkv = query / key-value heads, Dh = head width.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask, flex_attention

if TYPE_CHECKING:
    from transformers import PretrainedConfig

log = logging.getLogger(__name__)

ATTENTIONS = ("sdpa", "flex")  # Vela2Model.attn choices
IMPLEMENTATION = "vela2_flex"  # our name in transformers' AttentionInterface
BLOCK_SIZE = 128  # flex's sparse tile (and its default); flex rows are padded to a multiple of it
# torch.compile `dynamic` of flex_attention. False: one static kernel per (B, L) shape, the most
# exercised code path (torch 2.13 CPU cannot even build the kernel once L turns symbolic); shapes
# repeat because pipeline pads packed rows to row_tokens under flex, so a run sees a handful of
# row counts B. None (automatic dynamic): a second shape recompiles with the changed dimensions
# symbolic and later shapes reuse that kernel; fewer compiles when B varies a lot (a worker).
COMPILE_DYNAMIC: bool | None = False
# Dynamo's per-function recompile limit is raised to this: past the limit dynamo silently runs
# flex_attention uncompiled, which materialises full (B, Hq, L, L) fp32 scores (17 GiB per layer
# at B=32, L=2048, 32 heads) instead of failing.
RECOMPILE_LIMIT = 64


# tree_mask folds (segment, part) into one int64 per token: segment * _GROUP_STRIDE + part. Parts are
# question blocks (at most LIMITS.max_questions), far below the stride; segments are sequence numbers.
_GROUP_STRIDE = 1 << 24


def tree_mask(parts: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean attention mask (True = attend) for a batch of rendered sequences.

    parts: (B, L) part id per token: 0 = context, k >= 1 = question block k, -1 = padding.
    segments: (B, L) which packed sequence of the row a token belongs to (None: one per row);
    tokens of different segments never see each other (block-diagonal packing).
    Context is causal; a block sees the context and its own earlier tokens, never another block.
    Padding queries see only themselves: a fully masked row would give NaN under sdpa, and NaN
    values would leak into real rows through 0 * NaN. No real token ever sees padding.
    Returns (B, 1, L, L).

    Each token gets one group id, (segment, part); a key is visible to a query iff it is not later
    and its group is the query's own group or its segment's context group (part 0). Padding keys
    and queries get ids that match nothing. That is three passes over the (B, L, L) mask (two
    comparisons and the causal AND) instead of one per rule: on a CPU worker the mask of a batch
    of short rows cost more than the model's forward.
    """
    B, L = parts.shape
    pad = parts < 0  # (B, L)
    seg = segments * _GROUP_STRIDE if segments is not None else torch.zeros_like(parts)
    key = (seg + parts).masked_fill(pad, -1)[:, None, :]  # (B, 1, L)
    own = (seg + parts).masked_fill(pad, -2)[:, :, None]  # (B, L, 1)
    ctx = seg.masked_fill(pad, -2)[:, :, None]  # (B, L, 1): the query's context group
    mask = key == own  # (B, L, L)
    mask |= key == ctx
    mask &= torch.ones(L, L, dtype=torch.bool, device=parts.device).tril_()  # key j <= query i
    mask.diagonal(dim1=1, dim2=2).logical_or_(pad)  # padding queries see themselves
    return mask[:, None]


def _codes(parts: torch.Tensor, segments: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token (B, L): its code, segment * (L + 1) + part (-1 on padding), and the code of its
    sequence's context, segment * (L + 1) (-2 on padding, never a real key's code). A key is visible
    to a query iff it is not after it and its code is the query's (same sequence and part) or the
    query's context code (the context of the query's sequence)."""
    L = parts.shape[1]
    seg = torch.zeros_like(parts) if segments is None else segments
    real = parts >= 0
    code = torch.where(real, seg * (L + 1) + parts, -1)  # part ids < L + 1: a part has a token
    context = torch.where(real, seg * (L + 1), -2)
    return code, context


def tree_mask_mod(parts: torch.Tensor, segments: torch.Tensor | None) -> Callable:
    """The tree-mask rule as a flex mask_mod over the (B, L) part / segment ids of a batch.

    Key kv is visible to query q iff kv <= q, same segment, key part 0 (context) or the query's
    part, and neither is padding (part -1); a padding query sees only itself. Same rule as
    `attention.tree_mask` (which the tests compare against on every pair).

    Why codes (`_codes`): flex evaluates the rule on every pair of a partly masked tile, inside its
    kernel; two loads and three compares instead of four loads (on an H200 with the headline batch:
    flex attention 5% faster).
    """
    code, context = _codes(parts, segments)

    def mask_mod(b, h, q, kv):
        cq, ck = code[b, q], code[b, kv]
        visible = (kv <= q) & (ck >= 0) & ((ck == cq) | (ck == context[b, q]))
        return visible | ((q == kv) & (cq < 0))

    return mask_mod


def block_mask(parts: torch.Tensor, segments: torch.Tensor | None = None, block_size: int = BLOCK_SIZE) -> BlockMask:
    """BlockMask (B, 1, L, L) of the tree mask, on parts' device; heads share it (H=None).

    parts, segments: (B, L) as built by pipeline.collate (-1 on padding). L need not be a
    multiple of block_size, but encode pads it to one so compiled shapes repeat.

    Built from the tile counts of the dense tree mask (`tree_mask`, sdpa's): eagerly,
    `create_block_mask` gathers each pair's ids through vmap (11.7 ms for the H200 headline's
    32 x 2,048-token batch); compiled it is fast but compiles for ~36 s per (rows, length) shape, a
    stall a worker cannot take at its first batches.
    """
    if parts.dim() != 2:
        raise ValueError(f"parts must be (B, L); got shape {tuple(parts.shape)}")
    if segments is not None and segments.shape != parts.shape:
        raise ValueError(f"segments must have the shape of parts {tuple(parts.shape)}; got {tuple(segments.shape)}")
    B, L = parts.shape
    mask_mod = tree_mask_mod(parts, segments)
    if L % block_size:
        return create_block_mask(mask_mod, B, None, L, L, device=parts.device, BLOCK_SIZE=block_size)
    n = L // block_size
    counts = tree_mask(parts, segments).view(B, n, block_size, n, block_size).sum(dim=(2, 4))  # (B, nq, nk)
    full = counts == block_size * block_size
    partial = (counts > 0) & ~full

    def blocks(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # per query tile: how many key tiles, and their indices first in ascending order (B, 1, nq[, nk])
        num = tiles.sum(dim=-1, dtype=torch.int32)
        order = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return num[:, None], order[:, None]

    kv_num, kv_idx = blocks(partial)
    full_num, full_idx = blocks(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod,
                                    seq_lengths=(L, L))


def dense_mask(parts: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
    """The mask_mod evaluated on every (query, key) pair: (B, 1, L, L) bool, for tests and debugging."""
    B, L = parts.shape
    return create_mask(tree_mask_mod(parts, segments), B, None, L, L, device=parts.device)


def padded_length(length: int, multiple: int = BLOCK_SIZE) -> int:
    """`length` rounded up to a multiple of `multiple`."""
    return -(-length // multiple) * multiple


def raise_recompile_limit() -> None:
    """Dynamo's per-function recompile limit raised to RECOMPILE_LIMIT (past it dynamo silently runs
    the function uncompiled): flex attention compiles per shape, the fused decoder's halves once per
    shape mode (dynamic for the default path, static per chunk for batch-invariant mode)."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    if getattr(dynamo_config, name) < RECOMPILE_LIMIT:
        log.info("raising torch._dynamo.config.%s from %d to %d", name, getattr(dynamo_config, name), RECOMPILE_LIMIT)
        setattr(dynamo_config, name, RECOMPILE_LIMIT)


@functools.cache
def compiled_flex_attention() -> Callable:
    """flex_attention compiled once per process (inductor generates the fused kernel; uncompiled,
    flex_attention materialises the full score matrix). Kernels are built lazily, per shape."""
    raise_recompile_limit()
    return torch.compile(flex_attention, dynamic=COMPILE_DYNAMIC)


def compile_stats() -> dict[str, int]:
    """Dynamo's process-wide counters: frames captured and distinct graphs compiled so far (a
    difference between two calls = kernels compiled in between)."""
    from torch._dynamo.utils import counters

    stats = counters["stats"]
    return {"calls_captured": int(stats["calls_captured"]), "unique_graphs": int(stats["unique_graphs"])}


def flex_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: BlockMask | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers AttentionInterface function: query (B, Hq, L, Dh), key / value (B, Hkv, L, Dh),
    attention_mask a BlockMask -> (B, L, Hq, Dh) and no attention weights.
    """
    if not isinstance(attention_mask, BlockMask):
        raise ValueError(f"{IMPLEMENTATION} needs a BlockMask as attention_mask; got {type(attention_mask).__name__}")
    if dropout > 0:
        raise ValueError(f"{IMPLEMENTATION} is inference-only; got dropout {dropout}")
    # Under autocast q / k leave the rotary embedding in fp32 (bf16 x fp32 cos/sin promotes) while
    # v is bf16; sdpa is an autocast op and casts them, flex_attention is not: cast here.
    dtype = torch.get_autocast_dtype(query.device.type) if torch.is_autocast_enabled(query.device.type) else value.dtype
    query, key, value = (t.to(dtype) for t in (query, key, value))
    out = compiled_flex_attention()(
        query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
    )
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Add IMPLEMENTATION to transformers' attention functions (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, flex_attention_forward)


def implementation(attn: str) -> str:
    """The transformers attn_implementation of a Vela2Model.attn choice."""
    if attn not in ATTENTIONS:
        raise ValueError(f"attn must be one of {', '.join(ATTENTIONS)}; got {attn!r}")
    if attn == "flex":
        register()
        return IMPLEMENTATION
    return "sdpa"


def _config(backbone: torch.nn.Module) -> PretrainedConfig:
    """A transformers backbone's config (nn.Module.__getattr__ types every attribute Tensor | Module)."""
    return cast("PretrainedConfig", backbone.config)


def set_backbone_attention(backbone: torch.nn.Module, attn: str) -> None:
    """Switch a transformers backbone between sdpa and flex in place (weights untouched)."""
    impl = implementation(attn)
    setter = getattr(backbone, "set_attn_implementation", None)
    if setter is not None:
        setter(impl)
    else:  # older transformers: the attention layers read the shared config at every forward
        _config(backbone)._attn_implementation = impl
    actual = _config(backbone)._attn_implementation
    if actual != impl:
        raise RuntimeError(f"backbone attention is {actual!r} after asking for {impl!r}")
    log.info("backbone attention: %s", impl)


def pad_batch(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    parts: torch.Tensor,
    segments: torch.Tensor,
    pad_id: int,
    multiple: int = BLOCK_SIZE,
) -> tuple[torch.Tensor, ...]:
    """Pad (B, L) batch tensors on the right to a multiple of `multiple` columns, the way
    pipeline.collate pads (pad token, position 0, part / segment -1), so flex sees whole tiles
    and repeated shapes. No-op when L already is a multiple.
    """
    extra = padded_length(input_ids.shape[1], multiple) - input_ids.shape[1]
    if extra == 0:
        return input_ids, position_ids, parts, segments
    pad = torch.nn.functional.pad
    return (
        pad(input_ids, (0, extra), value=pad_id),
        pad(position_ids, (0, extra), value=0),
        pad(parts, (0, extra), value=-1),
        pad(segments, (0, extra), value=-1),
    )
