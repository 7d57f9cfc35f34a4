"""Where run_batch runs: a thread of the worker process, or a spawned process of its own.

torch releases the GIL around every op it dispatches and takes it back after, so a batch needs
the GIL a thousand times and more. In the worker process the Celery consumer, the engine thread and
the render readers hold it for ~0.5 ms of CPU per request; on short rows at hundreds of requests
a second every retake waits, and batches ran up to 1.6x slower than the same batch alone
(bench/results/gpu-hotpath.json). `ProcessDevice` runs the model in a spawned process whose only
thread runs batches: nothing there competes for its GIL. The engine hands it a batch's sequences
over a pipe and gets the raw head outputs back (the steps are vela2.scoring.pipeline's own: the same
run_batch predict() calls).

Both runners take batches in order (`submit`, which queues: the engine keeps the next full batch
queued behind the running one, so the device never waits for the engine's turn) and answer each
with a `Ran`. A batch that raises is answered with its exception (a CUDA OOM included; the cache is
emptied first). A device process that dies (a segfault, the OOM killer, a request that kills the
process) takes the worker with it, with its exit code: exactly what a crash in the worker process
itself does, so worker.engine.attempts counts the attempt and redelivery finds the poison.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from vela2.errors import ModelError
from worker.obs.metrics import gpu_memory
from worker.runtime.cpu_procs import portable
from worker.runtime.warmup import freeze_startup_objects

log = logging.getLogger(__name__)

START_POLL_S = 0.5  # how often start() looks whether a loading device process died
WARMING_UP = "warming up"  # the start-up stage after the weights are on the device (Health.begin)
NEXT_POLL_S = 0.0005  # while a batch runs, how often the device process looks for the next one


@dataclass
class Ran:
    """One batch's raw head outputs (one per sequence) and when it ran (time.monotonic, shared by the
    processes of a host) with the CPU seconds the runner's thread spent on it."""

    outputs: list[Any]
    start: float
    end: float
    cpu_s: float
    memory: dict[str, float] | None = None  # the device's memory after it (worker.obs.metrics.gpu_memory)
    launch_s: float | None = None  # how long its launch took (collate, copies, kernels queued); None: not apart


@dataclass(frozen=True)
class ModelSpec:
    """How to load the served model (picklable: a device process loads it from this)."""

    checkpoint: str
    model_name: str
    device: str
    dtype: str  # torch dtype name
    precision: str
    attn: str = "sdpa"
    random_weights: bool = False
    digest: str | None = None  # the checkpoint's digest, computed once by the worker (None: load computes it)
    batch_invariant: bool = False  # vela2.model.invariant: the model's default for every batch


class LoadProgress:
    """Tells `stage` how far the weights' reading is ("loading weights: 4.1 of 14.7 GB"), at most
    every PROGRESS_EVERY_S and at the end."""

    PROGRESS_EVERY_S = 0.5

    def __init__(self, stage: Callable[[str], None]):
        self.stage, self._last = stage, 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done >= total or now - self._last >= self.PROGRESS_EVERY_S:
            self._last = now
            self.stage(f"loading weights: {done / 1e9:.1f} of {total / 1e9:.1f} GB")


def load_model(spec: ModelSpec, stage: Callable[[str], None] | None = None) -> Any:
    """Load the checkpoint on its device with its attention backend; checks the precision and that
    the checkpoint serves the queue's model (ConfigError). `stage` hears how far the loading is."""
    import torch

    import vela2
    from vela2.errors import ConfigError

    model = vela2.load(spec.checkpoint, device=spec.device, dtype=getattr(torch, spec.dtype),
                       random_weights=spec.random_weights, checkpoint_digest=spec.digest,
                       progress=LoadProgress(stage) if stage is not None else None)
    if spec.attn != "sdpa":
        model.set_attention(spec.attn)
    model.check_precision(spec.precision)
    if spec.batch_invariant:
        model.use_batch_invariant()
    if model.name != spec.model_name:
        raise ConfigError(f"checkpoint model {model.name!r} does not match the queue model {spec.model_name!r}")
    return model


def release_device_memory() -> None:
    """After a failed batch (often CUDA OOM), hand cached blocks back before the retry."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _run(pipeline: Any, model: Any, seqs: list[Any], precision: str, row_tokens: int | None) -> Ran:
    c0, start = time.thread_time(), time.monotonic()
    try:
        outputs = pipeline.run_batch(model, seqs, precision, row_tokens)
    except Exception:
        release_device_memory()
        raise
    return Ran(outputs, start, time.monotonic(), time.thread_time() - c0)


class ThreadDevice:
    """run_batch on one thread of this process (CPU workers, tests with a fake pipeline)."""

    stage = "device_thread"  # its CPU in EngineStats.cpu_s

    def __init__(self, pipeline: Any, model: Any, precision: str, row_tokens: int | None):
        self._args = (pipeline, model, precision, row_tokens)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="vela2-device")

    def submit(self, seqs: list[Any]) -> Future:
        """Queue one batch; the Future resolves to its Ran or raises what run_batch raised."""
        pipeline, model, precision, row_tokens = self._args
        return self._pool.submit(_run, pipeline, model, seqs, precision, row_tokens)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _serve(conn: Any, spec: ModelSpec, row_tokens: int | None, worst_batch: Any, wrapper: Any) -> None:
    """(child) Load the model, measure the worst batch, then run what arrives until the pipe closes.
    `wrapper` (None in production) wraps the pipeline: the tests' faults (stack.faults)."""
    import vela2.scoring.pipeline

    # The worker stops it through the pipe (warm shutdown finishes the batch it runs): a Ctrl-C or
    # a SIGTERM sent to the whole process group must not kill it under the worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s/vela2-device] %(message)s")
    conn.send(("stage", ("building the model", time.monotonic())))  # its imports done (unpickling the arguments)
    try:
        model = load_model(spec, lambda text: conn.send(("stage", (text, time.monotonic()))))
        pipeline = wrapper(vela2.scoring.pipeline) if wrapper is not None else vela2.scoring.pipeline
        conn.send(("stage", (WARMING_UP, time.monotonic())))
        worst_s = worst_batch(model, pipeline=pipeline)
    except BaseException as e:  # noqa: BLE001 (the parent reports it and refuses to start)
        conn.send(("failed", portable(e)))
        return
    freeze_startup_objects()  # the model's Python objects: out of every full collection's walk
    conn.send(("ready", (worst_s, gpu_memory(spec.device))))
    run = _Launcher(pipeline, model, spec.precision, row_tokens, spec.device)
    running: tuple[int, Any] | None = None  # (batch number, Launched) whose kernels the device runs
    while True:
        if running is not None and running[1].done():  # done already (on a CPU, always): answer it
            conn.send(run.collect(*running))
            running = None
        # the next batch: launched behind the running one (its kernels queue on the same stream),
        # so the device goes from one to the next without waiting for this loop
        if running is None or conn.poll(0):
            try:
                work = conn.recv()
            except (EOFError, OSError):
                work = None
            if work is None:  # stop: finish the running batch, then exit
                if running is not None:
                    conn.send(run.collect(*running))
                return
            n, seqs = work
            launched = run.launch(n, seqs, conn)
            if running is None:
                running = launched
                continue
            if launched is not None:
                conn.send(run.collect(*running))
                running = launched
                continue
        # nothing new yet: answer the running batch as soon as it is done, looking for the next meanwhile
        while not running[1].done() and not conn.poll(NEXT_POLL_S):
            pass
        if running[1].done():
            conn.send(run.collect(*running))
            running = None


class _Launcher:
    """(device process) launches and collects batches, timing each; a batch that raises at launch
    is answered at once (its error), one that raises when collected likewise."""

    def __init__(self, pipeline: Any, model: Any, precision: str, row_tokens: int | None, device: str):
        self.pipeline, self.model, self.precision, self.row_tokens = pipeline, model, precision, row_tokens
        self.device = device
        self._launched: dict[int, tuple[float, float, float]] = {}  # batch -> (launched at, CPU s, launch s)
        self._last_end = 0.0

    def launch(self, n: int, seqs: list[Any], conn: Any) -> tuple[int, Any] | None:
        t0, c0 = time.monotonic(), time.thread_time()
        try:
            launched = self.pipeline.launch_batch(self.model, seqs, self.precision, self.row_tokens)
        except Exception as e:
            release_device_memory()
            conn.send(("error", n, portable(e)))
            return None
        self._launched[n] = (t0, time.thread_time() - c0, time.monotonic() - t0)
        return n, launched

    def collect(self, n: int, launched: Any) -> tuple[str, int, Any]:
        t0, cpu_s, launch_s = self._launched.pop(n)
        c0 = time.thread_time()
        try:
            outputs = launched.outputs()
        except Exception as e:
            release_device_memory()
            return "error", n, portable(e)
        end = time.monotonic()
        # a batch launched behind another starts on the device when that one ends
        start, self._last_end = max(t0, self._last_end), end
        return "ok", n, Ran(outputs, start, end, cpu_s + time.thread_time() - c0, gpu_memory(self.device), launch_s)


class ProcessDevice:
    """run_batch in a spawned process of its own (GPU workers). `start()` loads the model there and
    runs `worst_batch(model, pipeline)` (the warm-up batch, its seconds in `worst_s`). `wrapper`, a
    picklable callable (None in production), wraps the pipeline there: the tests' faults."""

    stage = "device_in_processes"  # its CPU in EngineStats.cpu_s (another process's)

    def __init__(self, spec: ModelSpec, row_tokens: int | None, worst_batch: Any, wrapper: Any = None):
        self.spec, self.row_tokens, self.worst_batch, self.wrapper = spec, row_tokens, worst_batch, wrapper
        self.worst_s = 0.0
        self.memory: dict[str, float] | None = None  # the device process's GPU memory after its last batch
        self._ctx = mp.get_context("spawn")
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._sends: queue.SimpleQueue = queue.SimpleQueue()
        self._count = 0
        self._closing = False
        self._proc: Any = None
        self._conn: Any = None

    def start(self, stage: Callable[..., None] = lambda *_: None) -> None:
        """Spawn the process and wait until its model is loaded and warm; raises what it raised.
        `stage` hears the stages the process reports meanwhile (Health.begin)."""
        self.launch()
        self.wait_ready(stage)

    def launch(self) -> None:
        """Spawn the process; it starts loading at once (wait_ready waits for it). The worker
        launches it before its own imports and CPU processes, which then overlap the load."""
        parent, child = self._ctx.Pipe(duplex=True)
        self._proc = self._ctx.Process(target=_serve, args=(child, self.spec, self.row_tokens, self.worst_batch,
                                                                self.wrapper),
                                       name="vela2-device", daemon=True)
        self._proc.start()
        atexit.register(self.close)  # before multiprocessing's own exit hook, whose SIGTERM it ignores
        child.close()
        self._conn = parent

    def wait_ready(self, stage: Callable[..., None] = lambda *_: None) -> None:
        """Wait until the launched process's model is loaded and warm; raises what it raised.
        `stage(name, at)` hears each stage the process reports, with when (time.monotonic: one clock
        for all processes) it began: it may be read later, while this process still imports."""
        parent = self._conn
        status: str = "stage"
        value: Any = None  # a stage's name, then what "ready" / "failed" carry
        while status == "stage":
            if value is not None:
                stage(*value)
            while not parent.poll(START_POLL_S):
                if not self._proc.is_alive():
                    raise ModelError(f"the device process exited (code {self._proc.exitcode}) while loading "
                                     "the model")
            try:
                status, value = parent.recv()
            except EOFError:
                self._proc.join(5)
                status, value = "failed", ModelError(f"the device process exited (code {self._proc.exitcode}) "
                                                     "while loading the model")
        if status == "failed":
            self._proc.join(5)
            raise value
        self.worst_s, self.memory = float(value[0]), value[1]
        threading.Thread(target=self._send_loop, name="vela2-device-send", daemon=True).start()
        threading.Thread(target=self._read_loop, name="vela2-device-read", daemon=True).start()

    def submit(self, seqs: list[Any]) -> Future:
        """Queue one batch (never blocks: a thread writes it to the pipe); the Future resolves to its
        Ran or raises what run_batch raised there."""
        fut: Future = Future()
        with self._lock:
            self._count += 1
            n = self._count
            self._pending[n] = fut
        self._sends.put((n, seqs))
        return fut

    def _send_loop(self) -> None:
        while True:
            work = self._sends.get()
            try:
                self._conn.send(work)
            except (OSError, ValueError):  # the process is gone: the reader sees it too
                return
            if work is None:
                return

    def _read_loop(self) -> None:
        while True:
            try:
                status, n, value = self._conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                fut = self._pending.pop(n)
            if status == "ok":
                self.memory = value.memory or self.memory
                fut.set_result(value)
            else:
                fut.set_exception(value)
        self._died()

    def _died(self) -> None:
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        if self._closing:  # close() waits for the process (two threads reaping one child race)
            for fut in pending:
                fut.set_exception(ModelError("the device process stopped"))
            return
        self._proc.join(5)
        code = self._proc.exitcode
        # The batch it ran may hold a request that kills the process: go down with it, as a crash in
        # this process would, so the messages are redelivered and worker.engine.attempts counts the attempt.
        exit_code = code if code and code > 0 else (128 - code if code else 1)
        log.critical("the device process exited (code %s) with %d batches in it; the worker exits (%d)",
                     code, len(pending), exit_code)
        logging.shutdown()
        os._exit(exit_code)

    def close(self) -> None:
        """Stop the process (after the batch it runs)."""
        self._closing = True
        if self._proc is None or not self._proc.is_alive():
            return
        self._sends.put(None)
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
