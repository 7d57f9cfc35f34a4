"""Reading safetensors weights straight into a model's parameters: files read in parallel threads,
each into its own small staging buffer (pinned on CUDA) and copied to the device while the next
chunk is read; a parameter of the stored dtype on the CPU is read into directly. The host never
holds a second copy of the model: what it holds beyond the parameters is the staging buffers
(THREADS x 2 x CHUNK_BYTES) and, for a stored dtype the parameter does not have, one tensor in its
stored form at a time.

Measured beside the disk's and the page cache's own read rates by bench/coldstart.py.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from vela2.errors import CheckpointError
from vela2.model.manifest import header_bytes

THREADS = 8  # tensors read at once for a GPU: local NVMe and network disks want several reads in flight
CPU_THREADS = 2  # for a CPU model: its reads are copies out of the page cache, and each thread's malloc
# arena keeps the stored-dtype temporaries it freed resident (8 threads: +25% peak memory measured)
CHUNK_BYTES = 64 << 20  # one staging buffer; each thread has two (one read into while the other copies)

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


@dataclass(frozen=True)
class Stored:
    """One tensor in a safetensors file: where its bytes are and what they hold."""

    name: str
    file: Path
    start: int  # byte offset in the file
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def header(path: Path) -> list[Stored]:
    """The tensors of safetensors file `path`, in file order (CheckpointError on a malformed header)."""
    raw = header_bytes(path)
    n = len(raw) - 8
    try:
        meta = json.loads(raw[8:])
        out = []
        for name, t in meta.items():
            if name == "__metadata__":
                continue
            begin, end = t["data_offsets"]
            if t["dtype"] not in DTYPES:
                raise CheckpointError(f"{path}: {name} has dtype {t['dtype']}, which Vela 2 does not load")
            out.append(Stored(name, path, 8 + n + begin, end - begin, DTYPES[t["dtype"]], tuple(t["shape"])))
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: malformed safetensors header ({e})") from e
    size = path.stat().st_size
    for s in out:
        if s.start + s.nbytes > size:
            raise CheckpointError(f"{path}: {s.name} ends at byte {s.start + s.nbytes:,}, past the file's {size:,}")
    return sorted(out, key=lambda s: s.start)


def plan(files: dict[str, Path], params: dict[str, torch.Tensor]) -> list[Stored]:
    """Every parameter's stored tensor, checked against it (name, shape, byte count) before a byte
    of weights is read. `files`: tensor name -> file holding it."""
    stored: dict[str, Stored] = {}
    for f in sorted(set(files.values())):
        for s in header(f):
            if files.get(s.name) == f:
                stored[s.name] = s
    items = []
    for name, target in params.items():
        found = stored.get(name)
        if found is None:
            raise CheckpointError(f"{name}: the index names {files.get(name)} but that file does not hold it")
        s = found
        if s.shape != tuple(target.shape):
            raise CheckpointError(f"{name}: stored shape {s.shape}; config expects {tuple(target.shape)}")
        if s.nbytes != target.numel() * s.dtype.itemsize:
            raise CheckpointError(f"{name}: {s.nbytes:,} stored bytes for {target.numel():,} {s.dtype} values")
        items.append(s)
    return sorted(items, key=lambda s: (str(s.file), s.start))


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as a flat uint8 view (same memory)."""
    return t.reshape(-1).view(torch.uint8)


class _Stager:
    """One reading thread's two staging buffers (pinned when the target is CUDA) and its stream."""

    def __init__(self, device: torch.device, chunk: int):
        cuda = device.type == "cuda"
        self.device = device
        self.stream = torch.cuda.Stream(device) if cuda else None
        self.buffers = [torch.empty(chunk, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
        self.events: list[torch.cuda.Event | None] = [None, None]
        self.turn = 0

    def buffer(self) -> tuple[torch.Tensor, int]:
        """The next free buffer (waits until its last copy to the device is done) and its number."""
        k = self.turn
        self.turn ^= 1
        if self.events[k] is not None:
            self.events[k].synchronize()  # type: ignore[union-attr]
        return self.buffers[k], k

    def copy(self, dst: torch.Tensor, src: torch.Tensor, k: int) -> None:
        """dst <- src (buffer k's bytes), asynchronously on this thread's stream when on CUDA."""
        if self.stream is None:
            dst.copy_(src)
            return
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        self.events[k] = event

    def finish(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()


def _read_exact(f, view: memoryview, where: str) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise CheckpointError(f"{where}: the file ended early")
        got += n


def _load_one(s: Stored, target: torch.Tensor, stager: _Stager, handles: dict[Path, object]) -> None:
    """Read `s` into `target`: straight into it on the CPU when the dtype matches, else through the
    staging buffers (in CHUNK pieces) into the target's bytes, or into a device tensor of the stored
    dtype that is then cast into the target (the only extra memory: one tensor, on the device)."""
    f = handles.get(s.file)
    if f is None:
        f = handles[s.file] = open(s.file, "rb", buffering=0)  # noqa: SIM115 (closed by the thread's end)
    f.seek(s.start)  # type: ignore[attr-defined]
    same = s.dtype == target.dtype and target.is_contiguous()
    if same and target.device.type == "cpu":
        if s.nbytes:
            _read_exact(f, _bytes_of(target).numpy().data, f"{s.file}: {s.name}")
        return
    dst = target if same else torch.empty(s.shape, dtype=s.dtype, device=target.device)
    raw = _bytes_of(dst)
    done = 0
    while done < s.nbytes:
        buf, k = stager.buffer()
        n = min(buf.numel(), s.nbytes - done)
        _read_exact(f, buf.numpy().data[:n], f"{s.file}: {s.name}")
        stager.copy(raw[done:done + n], buf[:n], k)
        done += n
    if not same:
        if stager.stream is not None:
            with torch.cuda.stream(stager.stream):
                target.copy_(dst)  # the cast on the device, in the order of this thread's copies
                dst.record_stream(stager.stream)
        else:
            target.copy_(dst)


def read_into(params: dict[str, torch.Tensor], files: dict[str, Path], *, threads: int = THREADS,
              chunk_bytes: int = CHUNK_BYTES, progress: Callable[[int, int], None] | None = None) -> int:
    """Fill every tensor of `params` (name -> a tensor on its device, e.g. a model's state dict
    after `to_empty`) from the safetensors files holding them (`files`: name -> file), casting each
    from its stored dtype. Returns the bytes read. CheckpointError on a missing tensor or shape.
    `progress(bytes done, bytes in all)` hears each tensor read (from the reading threads)."""
    params = {name: t.detach() for name, t in params.items()}  # the same memory, written without autograd
    items = plan(files, params)
    if not items:
        return 0
    devices = {t.device for t in params.values()}
    if len(devices) != 1:
        raise CheckpointError(f"read_into: parameters on several devices {sorted(map(str, devices))}")
    device = devices.pop()
    work: queue.SimpleQueue[Stored | None] = queue.SimpleQueue()
    for s in items:  # in file order: each thread takes the next tensor, so the reads stay close together
        work.put(s)
    n_threads = max(1, min(threads if device.type != "cpu" else min(threads, CPU_THREADS), len(items)))
    for _ in range(n_threads):
        work.put(None)
    errors: list[BaseException] = []
    lock = threading.Lock()
    total, done = sum(s.nbytes for s in items), [0]

    def run() -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        stager = _Stager(device, chunk_bytes)
        handles: dict[Path, object] = {}
        try:
            for s in _until_none(work):
                if errors:
                    continue  # drain: another thread failed
                _load_one(s, params[s.name], stager, handles)
                if progress is not None:
                    with lock:
                        done[0] += s.nbytes
                        progress(done[0], total)
            stager.finish()
        except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread)
            with lock:
                errors.append(e)
        finally:
            for h in handles.values():
                h.close()  # type: ignore[attr-defined]

    with ThreadPoolExecutor(n_threads, thread_name_prefix="vela2-load") as pool:
        for fut in [pool.submit(run) for _ in range(n_threads)]:
            fut.result()
    if errors:
        raise errors[0]
    return total


def _until_none(work: queue.SimpleQueue) -> Iterator[Stored]:
    while (s := work.get()) is not None:
        yield s
