"""Where rendering and decoding run, off the engine thread: the engine's CPU threads, or the render
processes (worker.runtime.cpu_procs) that keep a rendered row until it is decoded. Either way a
finished step comes back to the engine thread as an event (`post`)."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from vela2.api import systemone
from vela2.api.schemas import RowResult
from vela2.errors import ModelError
from vela2.wire.messages import request_digest
from worker.engine.stats import EngineStats
from worker.engine.work import Request

log = logging.getLogger(__name__)


class CpuWork:
    """Renders and decodes requests on threads (`cpu` None) or in the CPU processes."""

    def __init__(self, model: Any, pipeline: Any, precision: str, threads: int, stats: EngineStats,
                 post: Callable[[tuple[Any, ...]], None], cpu: Any = None):
        self.model, self.pipeline, self.precision = model, pipeline, precision
        self.stats = stats
        self._post = post  # hands an event to the engine thread
        self.cpu = cpu  # worker.runtime.cpu_procs.CpuProcesses, or None
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="vela2-cpu")
        self._in_cpu: dict[int, Request] = {}  # key -> request with work (or a rendered row) in a process
        self._keys = itertools.count(1)
        self.in_render = 0  # requests sent to render whose render has not come back (engine thread only)
        if cpu is not None:
            cpu.on_done = self._cpu_done

    def render(self, req: Request) -> None:
        """Validate and render `req` (a "prepared" event, or a "cpu" one from a process); call
        flush() after a run of these."""
        self.in_render += 1
        if self.cpu is not None:
            req.key = next(self._keys)
            self._in_cpu[req.key] = req
            self.cpu.render(req.key, req.obj)
            return
        fut = self._pool.submit(self._prepare, req)
        fut.add_done_callback(partial(self._done, "prepared", req))

    def decode(self, req: Request) -> None:
        """Decode a request whose sequences all ran (a "finished" event, or a "cpu" one); call
        flush() after a run of these."""
        if self.cpu is not None and req.key in self._in_cpu:
            self.cpu.decode(req.key, req.outputs, req.timings())
            req.outputs, req.decoding = [], True
            return
        fut = self._pool.submit(self._finish, req)
        fut.add_done_callback(partial(self._done, "finished", req))

    def flush(self) -> None:
        """Send what render() and decode() queued for the processes."""
        if self.cpu is not None:
            self.cpu.flush()

    def forget(self, req: Request) -> None:
        """`req` is answered without its decode: its rendered row in a process goes."""
        if self.cpu is not None and self._in_cpu.pop(req.key, None) is not None:
            self.cpu.drop(req.key)

    def rendered(self) -> None:
        """(engine thread) a render came back (a "prepared" event, or its process's reply)."""
        self.in_render -= 1

    def on_cpu(self, op: str, key: int, fut: Future) -> tuple[str, Request, Future] | None:
        """(engine thread) What a process's reply means: ("prepared" | "finished" | "failed", the
        request, its future), or None (nothing left to do)."""
        req = self._in_cpu.get(key)
        if req is None:
            return None
        if op == "render" or (op == "lost" and req.prep is None and not req.decoding):
            self.rendered()
        if op == "render" and not fut.exception() and not req.closed:
            return "prepared", req, fut  # rendered: the row stays in its process until decoded
        del self._in_cpu[key]
        if op == "render" and req.closed:  # answered while it rendered (expired): its row goes
            self.cpu.drop(key)
            return None
        if op == "render":
            return "prepared", req, fut  # the render failed: answers the error
        if op == "lost" and req.decoding:
            return "finished", req, fut  # an error result: the row's decode died with its process
        if op == "lost" and not req.closed:
            return "failed", req, fut
        if op == "decode":
            return "finished", req, fut
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.cpu is not None:
            self.cpu.close()

    # --- the CPU threads ------------------------------------------------------------------------

    def _prepare(self, req: Request) -> tuple[Any, Any, str]:
        """(CPU thread) validate + render one request -> (Prepared, parsed SystemOne or None, its
        content digest: hashing its canonical JSON costs the engine thread nothing here)."""
        c0 = time.thread_time()
        try:
            parsed, obj = None, req.obj
            if systemone.is_system_one(obj):
                parsed = systemone.parse_request(obj)
                systemone.check_model(parsed, self.model.name)
                obj = systemone.to_row(parsed, self.model.calibration)
            return self.pipeline.prepare(self.model, obj), parsed, request_digest(req.obj)
        finally:
            self.stats.charge("render", time.thread_time() - c0)

    def _finish(self, req: Request) -> tuple[RowResult, dict[str, Any] | None]:
        """(CPU thread) decode a row whose sequences all ran."""
        c0 = time.thread_time()
        res = self.pipeline.finish(self.model, req.prep, req.outputs, req.timings(), self.precision)
        answer = systemone.to_answer(req.system_one, res) if req.system_one is not None else None
        self.stats.charge("decode", time.thread_time() - c0)
        return res, answer

    def _done(self, kind: str, req: Request, fut: Future) -> None:
        """(CPU thread) hand a finished step back to the engine thread."""
        self._post((kind, req, fut))

    def _cpu_done(self, op: str, key: int, fut: Future, cpu_s: float) -> None:
        """(reader thread of the CPU processes) a render or decode is done."""
        self.stats.charge(f"{'render' if op == 'render' else 'decode'}_in_processes", cpu_s)
        self._post(("cpu", op, key, fut))


def lost_error(fut: Future) -> BaseException:
    """The error a request gets when its render process died."""
    return fut.exception() or ModelError("the render process died")
