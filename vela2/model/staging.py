"""Page-locked host buffers for a batch's host -> device and device -> host copies, reused.

A copy from pageable memory (a numpy array) is staged by the CUDA driver through pinned buffers of
its own and may hold the calling thread until the work queued before it on the stream has run; a
fresh pinned allocation (cudaHostAlloc) stalls the host too. Either one inside `launch_batch` holds
the host until the device has finished the batch running before, so the next batch's kernels are
queued late and the device idles between batches (on an H200, batches of the seed-like mix were
seen waiting ~0.35 s that way). Here every batch's inputs travel as ONE copy from a pinned buffer
taken from a pool, and its logits come back into another; a buffer returns to the pool once the
copies that use it have completed (an event recorded after them), so after the first batches of
each size the pool allocates nothing.

Off CUDA nothing is staged: tensors are made from the arrays directly.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

MIN_BYTES = 1 << 20  # smallest buffer allocated (smaller requests share it)
KEEP = 8  # buffers kept free at most (the smallest go first); two or three batches are in flight


class PinnedPool:
    """Pinned uint8 host buffers; `take` hands out the smallest free one that fits (or allocates a
    power of two), `give` returns one, usable again once its event (if any) has completed."""

    def __init__(self) -> None:
        self._free: list[tuple[torch.Tensor, Any]] = []  # (buffer, event or None)
        self._lock = threading.Lock()
        self.allocations = 0  # buffers allocated so far (the pool's misses)

    def take(self, nbytes: int) -> torch.Tensor:
        """A pinned buffer of at least `nbytes` bytes that no queued copy still uses."""
        with self._lock:
            best = None
            for k, (buf, event) in enumerate(self._free):
                if buf.numel() >= nbytes and (event is None or event.query()):
                    if best is None or buf.numel() < self._free[best][0].numel():
                        best = k
            if best is not None:
                return self._free.pop(best)[0]
            self.allocations += 1
        return self._allocate(max(MIN_BYTES, 1 << max(0, nbytes - 1).bit_length()))

    def _allocate(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def give(self, buf: torch.Tensor, event: Any = None) -> None:
        """Return `buf`; with `event`, it is reused only after the event has completed."""
        with self._lock:
            self._free.append((buf, event))
            if len(self._free) > KEEP:
                self._free.remove(min(self._free, key=lambda be: be[0].numel()))


POOL = PinnedPool()


def to_device(arrays: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """int64 arrays as tensors on `device`, in order; on CUDA one non-blocking copy of all of them
    from a pinned buffer (returned to the pool after the copy, by an event on the current stream)."""
    if device.type != "cuda":
        return [torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)) for a in arrays]
    flat = [np.ascontiguousarray(a, dtype=np.int64).reshape(-1) for a in arrays]
    total = sum(a.size for a in flat)
    buf = POOL.take(max(1, total) * 8)
    host = buf[: total * 8].view(torch.int64).numpy()  # (total,) int64 view of the pinned bytes
    at = 0
    for a in flat:
        host[at : at + a.size] = a
        at += a.size
    dev = buf[: total * 8].view(torch.int64).to(device, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    POOL.give(buf, event)
    out, at = [], 0
    for a in arrays:
        out.append(dev[at : at + a.size].view(a.shape))
        at += a.size
    return out


def from_device(flat: torch.Tensor) -> tuple[np.ndarray, Any]:
    """Queue a non-blocking copy of a 1-D fp32 CUDA tensor into a pinned buffer; returns
    (the host array it fills, a handle for `release`). Read the array only after the copy's event."""
    buf = POOL.take(max(1, flat.numel()) * 4)
    host = buf[: flat.numel() * 4].view(torch.float32)
    host.copy_(flat, non_blocking=True)
    return host.numpy(), buf


def release(handle: Any) -> None:
    """Give a `from_device` buffer back (its copy has completed: the caller waited for it)."""
    POOL.give(handle)
