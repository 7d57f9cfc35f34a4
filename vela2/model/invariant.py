"""Batch-invariant scoring: a sequence's numbers are the same bits whatever it is batched, packed,
padded or replayed with (`predict(..., batch_invariant=True)`, the worker's `--batch-invariant`).

Why an answer moves with its batch in the default mode: sums whose order depends on the batch's
shape. A GEMM's kernel, its tiles and any split of the reduction are chosen by the number of rows
(cuBLAS on a GPU, MKL / oneDNN on a CPU); a row reduction (RMSNorm's mean) picks its reduction tree
by the number of rows; a CPU elementwise loop hands the tail of each thread's range to scalar code,
which rounds exp / rsqrt otherwise than the vector code; attention over a packed row sums its keys
in tiles whose boundaries move with the sequence's offset and the row's length; a CUDA graph replays
the batch padded to another shape.

What this mode runs instead (`vela2.model.fused.FusedDecoder.invariant_forward`):

- the batch is ONE stream of tokens, its sequences back to back, padded to a multiple of the
  device's CHUNK_TOKENS (`stream_layout`);
- all token-wise work (rotary, RMSNorm, every backbone GEMM, SiLU, the final norm, the heads) runs on
  chunks of exactly that many tokens: every kernel sees one shape whatever the batch, and within
  one shape every row is computed by the same code in the same order, whatever the other rows hold;
- attention runs per sequence: each sequence's queries, keys and values are gathered into a row of
  their own, padded to a multiple of ATTENTION_TILE (`attention_layout`), and sequences of one padded
  length are one sdpa call on a pinned backend (every (sequence, head) of a call is computed apart
  from the others, by the same code), with masks built once per batch (`group_masks`);
- span logits: each question block's own product of its words by its labels.

So a sequence's numbers depend on its own tokens only (its questions are part of it: bundled and
single questions still differ, as the seed's noise floor says). The cost: the stream's last chunk is
padded, and the GEMMs run at CHUNK_TOKENS rows (bench/results/gpu-invariant.json).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from vela2.model.attention import tree_mask

# Rows of every token-wise kernel call, per device type. Fewer rows waste less on a batch's last chunk,
# more rows run each GEMM nearer the device's peak: on a CPU (no compiling, the demo's small shapes) 256;
# on an H100 with the 9B shape 1,024 kept 0.86 of the default mode's tokens/s on the engine headline and
# 0.88-0.89 on short rows, 2,048 0.88 and 0.85 (bench/results/gpu-invariant*.json).
CHUNK_TOKENS = {"cpu": 256, "cuda": 1024}
ATTENTION_TILE = 64  # a sequence's attention row is padded to a multiple of this


def chunk_tokens(device: torch.device | str) -> int:
    """CHUNK_TOKENS of `device`'s type (a CPU's for a type not listed)."""
    return CHUNK_TOKENS.get(torch.device(device).type, CHUNK_TOKENS["cpu"])


def padded(n: int, multiple: int) -> int:
    """`n` rounded up to a multiple of `multiple`."""
    return -(-n // multiple) * multiple


def stream_layout(lengths: list[int], chunk: int) -> tuple[list[int], int]:
    """(offset of each sequence in the stream, stream length): sequences back to back, then padding
    to a multiple of `chunk` with at least one padding token (the last one: what a sequence's
    attention row is padded with)."""
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int).tolist() if lengths else []
    return offsets, padded(sum(lengths) + 1, chunk)


@dataclass
class AttentionLayout:
    """Where each sequence's attention row takes its tokens from, and where its outputs go.

    groups: per padded length Lc, (Lc, n sequences, first slot); slots are the rows' token places,
    group after group, sequence after sequence. gather (S,): the stream position of each slot (the
    stream's last, padding, token for a row's padding). scatter (T,): the slot of each stream
    position, S (a row of zeros) for the stream's padding."""

    groups: list[tuple[int, int, int]]
    gather: torch.Tensor
    scatter: torch.Tensor


def attention_layout(offsets: list[int], lengths: list[int], total: int) -> tuple[list[tuple[int, int, int]],
                                                                                 np.ndarray, np.ndarray]:
    """The groups and the (gather, scatter) index arrays of `AttentionLayout` for a stream of `total`
    tokens holding sequences of `lengths` at `offsets` (host arrays; collate stages them)."""
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(padded(n, ATTENTION_TILE), []).append(i)
    groups, pieces = [], []
    slots = 0
    scatter = np.full(total, -1, dtype=np.int64)
    for lc in sorted(by_length):
        members = by_length[lc]
        groups.append((lc, len(members), slots))
        for i in members:
            row = np.full(lc, total - 1, dtype=np.int64)
            row[: lengths[i]] = np.arange(offsets[i], offsets[i] + lengths[i])
            scatter[offsets[i] : offsets[i] + lengths[i]] = slots + np.arange(lengths[i])
            pieces.append(row)
            slots += lc
    scatter[scatter < 0] = slots  # the stream's padding reads the zero row after the last slot
    gather = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return groups, gather, scatter


def chunks(total: int, chunk: int) -> Iterator[slice]:
    """The `chunk`-token slices of a stream of `total` tokens (a multiple of it)."""
    if total % chunk:
        raise ValueError(f"an invariant stream has a multiple of {chunk} tokens; got {total}")
    return (slice(a, a + chunk) for a in range(0, total, chunk))


def rows_chunked(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn over the rows of x (M, ...) in chunks of exactly `chunk_tokens(x.device)` rows (the last padded
    with zeros and cut off again): fn's kernels see one shape whatever M is. fn must be row-wise."""
    m, chunk = x.shape[0], chunk_tokens(x.device)
    if m == 0:
        return fn(x)
    full = F.pad(x, (0, 0) * (x.dim() - 1) + (0, padded(m, chunk) - m))
    return torch.cat([fn(full[s]) for s in chunks(full.shape[0], chunk)])[:m]


@contextlib.contextmanager
def _pinned_backend(device: torch.device) -> Iterator[None]:
    """sdpa on one backend whatever the shapes: the memory-efficient kernel on CUDA (it takes a mask),
    the flash kernel on a CPU (its mask-taking path)."""
    backend = SDPBackend.EFFICIENT_ATTENTION if device.type == "cuda" else SDPBackend.FLASH_ATTENTION
    with sdpa_kernel([backend]):
        yield


def group_masks(parts: torch.Tensor, layout: AttentionLayout, dtype: torch.dtype) -> list[torch.Tensor]:
    """Each group's tree mask as sdpa's additive mask in `dtype` (0 = attend, -inf = not), (n, 1, Lc, Lc):
    built once per batch and shared by every layer (a bool mask would be rebuilt and converted per call).
    parts (T,) part ids of the stream (-1 on padding); a row's padding sees only itself."""
    masks = []
    for lc, n, first in layout.groups:
        visible = tree_mask(parts[layout.gather[first : first + n * lc].view(n, lc)])
        masks.append(torch.zeros(visible.shape, dtype=dtype, device=parts.device).masked_fill_(~visible,
                                                                                               float("-inf")))
    return masks


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: list[torch.Tensor], layout: AttentionLayout,
              scale: float) -> torch.Tensor:
    """Tree-masked attention of every sequence of a stream on its own.

    q (T, Hq, Dh), k / v (T, Hq, Dh) (kv heads repeated per query head), masks: `group_masks` of the
    stream. Returns (T, Hq * Dh): each sequence's rows from its own attention row, zeros on the
    stream's padding."""
    T, n_heads, dh = q.shape
    outs = []
    with _pinned_backend(q.device):
        for (lc, n, first), mask in zip(layout.groups, masks, strict=True):
            idx = layout.gather[first : first + n * lc].view(n, lc)  # (n, Lc) stream positions
            qg, kg, vg = (t[idx].transpose(1, 2) for t in (q, k, v))  # (n, Hq, Lc, Dh)
            a = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, scale=scale)  # (n, Hq, Lc, Dh)
            outs.append(a.transpose(1, 2).reshape(n * lc, n_heads * dh))
    outs.append(q.new_zeros((1, n_heads * dh)))
    return torch.cat(outs)[layout.scatter]
