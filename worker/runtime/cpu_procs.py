"""Rendering and decoding in spawned processes, beside the worker process.

A worker process is GIL-bound on short rows: rendering (~0.4 ms a row) and decoding (~0.1 ms)
would take half of what one Python process can do per request. Here each of N spawned processes
loads what the two steps need from the checkpoint directory (tokenizer, config, calibration: no
weights) and runs vela2.scoring.pipeline.prepare / finish — the same functions predict() calls. A row's
render and its decode go to the same process, which keeps the rendered row in between: only the
sequences (numpy arrays) travel to the engine, and only the raw head outputs travel back. The
engine sends one pipe message per process per slice of a turn's work; the answers come back in
chunks of REPLY_CHUNK, read by one thread per process that hands them to the engine as done Futures.

A process that dies (a crash inside the tokenizer) is started again; the rows it held are failed
with model_error (their render or decode is lost with it), nothing waits forever.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vela2.errors import ModelError

log = logging.getLogger(__name__)

REPLY_CHUNK = 32  # answers a process sends at once (~10 ms of short rows: the device gets them soon)
HELD_MAX = 200_000  # rows one process keeps rendered at most (a bound should drops ever be missed)


@dataclass
class Rendered:
    """What the engine keeps of a row rendered in a process (the row itself stays there)."""

    sequences: list[Any]  # rendering.Sequence
    render_ms: float
    task: str | None  # the row's task, for an error result should it fail later


class ModelFiles:
    """What prepare / finish / the SystemOne steps read from a model: no weights."""

    def __init__(self, checkpoint: str, name: str, digest: str | None = None, batch_invariant: bool = False):
        from tokenizers import Tokenizer

        from vela2.config import Vela2Config
        from vela2.model.calibration import Calibration

        path = Path(checkpoint)
        self.config = Vela2Config.read(path)
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.calibration = Calibration.read(path)
        self.name = name  # the served model's name (SystemOne requests must name it)
        self.digest = digest  # the checkpoint's digest (vela2.model.checkpoint.digest), named in every answer
        self.batch_invariant = batch_invariant  # the device's mode (the worker's --batch-invariant), named too


def portable(e: BaseException) -> BaseException:
    """`e` if it survives pickling (to cross a process pipe), else a ModelError naming it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return ModelError(f"{type(e).__name__}: {e}")


def _serve(conn: Any, checkpoint: str, model_name: str, digest: str | None, precision: str,
           batch_invariant: bool) -> None:
    """(child) Render and decode what arrives, until the pipe closes."""
    import vela2.scoring.pipeline as pipeline
    from vela2.api import systemone
    from vela2.wire.messages import request_digest
    from worker.runtime.warmup import freeze_startup_objects

    lite = ModelFiles(checkpoint, model_name, digest, batch_invariant)
    freeze_startup_objects()  # the rows it holds rendered set off full collections too
    held: dict[int, tuple[Any, Any]] = {}
    while True:
        try:
            work = conn.recv()
        except (EOFError, OSError):
            return
        if work is None:
            return
        replies: list[tuple[Any, ...]] = []
        for op, key, *payload in work:
            c0 = time.thread_time()
            try:
                if op == "render":
                    (obj,) = payload
                    digest = request_digest(obj)  # hashed here, off the engine's thread
                    parsed = None
                    if systemone.is_system_one(obj):
                        parsed = systemone.parse_request(obj)
                        systemone.check_model(parsed, lite.name)
                        obj = systemone.to_row(parsed, lite.calibration)
                    prep = pipeline.prepare(lite, obj)  # type: ignore[arg-type]  # ModelFiles has what it reads
                    held[key] = (prep, parsed)
                    if len(held) > HELD_MAX:
                        held.pop(next(iter(held)))
                    rendered = Rendered(prep.sequences, prep.render_ms, prep.row.task)
                    replies.append(("ok", op, key, (rendered, None, digest), time.thread_time() - c0))
                elif op == "decode":
                    outputs, timings = payload
                    prep, parsed = held.pop(key)
                    res = pipeline.finish(lite, prep, outputs, timings, precision)  # type: ignore[arg-type]
                    answer = systemone.to_answer(parsed, res) if parsed is not None else None
                    # the stored JSON form: a pydantic object costs the engine ~0.15 ms to unpickle
                    replies.append(("ok", op, key, (res.to_json_dict(), answer), time.thread_time() - c0))
                elif op == "drop":
                    held.pop(key, None)
            except BaseException as e:  # noqa: BLE001 (every failure is the row's answer)
                held.pop(key, None)
                replies.append(("error", op, key, portable(e), time.thread_time() - c0))
            if len(replies) >= REPLY_CHUNK:  # a long list of work answers as it goes, not at its end
                conn.send(replies)
                replies = []
        if replies:
            conn.send(replies)


class CpuProcesses:
    """N render / decode processes. `render(key, obj)` and `decode(key, outputs, timings)` queue
    work, `flush()` sends it (one message per process); `on_done(op, key, future, cpu_s)` (called
    from reader threads) gets a done Future per render — (Rendered, None) — and per decode —
    (RowResult.to_json_dict(), SystemOne answer or None) —, with the CPU seconds the process spent on it."""

    def __init__(self, checkpoint: str, model_name: str, n: int, digest: str | None, precision: str,
                 batch_invariant: bool = False):
        self.checkpoint, self.model_name, self.n = str(checkpoint), model_name, n
        # what every decoded answer's served_by names
        self.digest, self.precision, self.batch_invariant = digest, precision, batch_invariant
        self.on_done: Callable[[str, int, Future, float], None] = lambda *a: None
        self._ctx = mp.get_context("spawn")
        self._slots: list[_Slot] = []
        self._slot_of: dict[int, int] = {}  # key -> process index (sticky from render to decode)
        self._next = 0
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Spawn the processes (each imports the model stack and loads the tokenizer)."""
        self._slots = [self._spawn(i) for i in range(self.n)]

    def _spawn(self, i: int) -> _Slot:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_serve, name=f"vela2-cpu-{i}", daemon=True,
                                 args=(child, self.checkpoint, self.model_name, self.digest, self.precision,
                                       self.batch_invariant))
        proc.start()
        child.close()
        slot = _Slot(i, proc, parent)
        slot.reader = threading.Thread(target=self._read, args=(slot,), name=f"vela2-cpu-reader-{i}", daemon=True)
        slot.reader.start()
        return slot

    def render(self, key: int, obj: Any) -> None:
        with self._lock:
            i = self._next
            self._next = (self._next + 1) % self.n
            self._slot_of[key] = i
            slot = self._slots[i]
            slot.queued.append(("render", key, obj))

    def decode(self, key: int, outputs: list[Any], timings: dict[str, float]) -> None:
        with self._lock:
            slot = self._slots[self._slot_of[key]]
            slot.queued.append(("decode", key, outputs, timings))

    def drop(self, key: int) -> None:
        """Forget a rendered row that will not be decoded (failed, expired, dead-lettered)."""
        with self._lock:
            i = self._slot_of.pop(key, None)
            if i is not None:
                self._slots[i].queued.append(("drop", key))

    def flush(self) -> None:
        """Send the queued work, one message per process."""
        with self._lock:
            sends = [(s, s.queued) for s in self._slots if s.queued]
            for s in self._slots:
                s.queued = []
        for slot, work in sends:
            try:
                slot.conn.send(work)
            except (OSError, ValueError) as e:  # it died with this work unsent: each row is answered
                log.error("render process %d unreachable (%s): %d items fail", slot.index, e, len(work))
                for op, key, *_ in work:
                    if op != "drop":
                        self._lose(key, "the render / decode process died before it got this row")

    def _read(self, slot: _Slot) -> None:
        while True:
            try:
                replies = slot.conn.recv()
            except (EOFError, OSError):
                break
            for status, op, key, value, cpu_s in replies:
                with self._lock:
                    if status == "error" or op == "decode":
                        self._slot_of.pop(key, None)  # decoded or failed: nothing more goes there
                fut: Future = Future()
                if status == "ok":
                    fut.set_result(value)
                else:
                    fut.set_exception(value)
                self.on_done(op, key, fut, cpu_s)
        self._died(slot)

    def _lose(self, key: int, why: str) -> None:
        with self._lock:
            self._slot_of.pop(key, None)
        fut: Future = Future()
        fut.set_exception(ModelError(why))
        self.on_done("lost", key, fut, 0.0)

    def _died(self, slot: _Slot) -> None:
        if self._closed:
            return
        slot.proc.join(5)
        code = slot.proc.exitcode
        with self._lock:  # work queued from now on goes to the new process
            held = [k for k, i in self._slot_of.items() if i == slot.index]
            self._slots[slot.index] = self._spawn(slot.index)
        log.error("render process %d exited (code %s) holding %d rows; started another", slot.index, code, len(held))
        for key in held:  # every row it rendered or was rendering: none can be decoded now
            self._lose(key, f"the render / decode process died (exit code {code}) with this row")

    def close(self) -> None:
        """Stop the processes."""
        self._closed = True
        for slot in self._slots:
            try:
                slot.conn.send(None)
            except (OSError, ValueError):
                pass
        for slot in self._slots:
            slot.proc.join(5)
            if slot.proc.is_alive():
                slot.proc.kill()


@dataclass(eq=False)
class _Slot:
    index: int
    proc: Any
    conn: Any
    reader: threading.Thread | None = None
    queued: list[tuple[Any, ...]] = field(default_factory=list)
