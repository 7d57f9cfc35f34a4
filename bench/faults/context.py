"""The run context every scenario gets: the checkpoint, a scratch directory, the scale, the worker
settings, and the processes it starts (redis-servers, RabbitMQ vhosts, workers), all stopped at the
scenario's end; plus the helpers that start, wait for, stop and read workers."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stack.harness import RabbitVhost, RedisServer, WorkerProcess, free_port
from vela2.wire import keys

if TYPE_CHECKING:
    from bench.faults.report import Outcome

log = logging.getLogger("bench.faults")

MODEL = "vela2-demo"
QUEUE = keys.online_queue(MODEL)
SETTLE_TIMEOUT_S = 240.0  # longest a scenario waits for its answers once the fault is over
POLL_S = 0.2

# Worker settings every scenario starts from (small batches: the demo model on a CPU); the command
# line's --cpu-processes / --device-process add to them (Suite.settings).
BASE_SETTINGS: dict[str, Any] = {
    "max_batch_tokens": 2048,
    "max_wait_ms": 20,
    "render_threads": 1,
    "shutdown_timeout_s": 30,
}


class Suite:
    """What every scenario shares: the checkpoint, a scratch directory, the scale, the workers'
    settings, started processes."""

    def __init__(self, workdir: Path, checkpoint: Path, *, scale: float = 1.0, device: str = "cpu",
                 settings: dict[str, Any] | None = None):
        self.workdir = workdir
        self.checkpoint = checkpoint
        self.scale = scale
        self.device = device
        self.settings: dict[str, Any] = {**BASE_SETTINGS, **(settings or {})}
        self.worst_batch_s: dict[int, float] = {}
        self._procs: list[WorkerProcess | RedisServer] = []
        self._redis_numbers = count(1)
        self._worker_numbers = count(1)
        self.amqp_server: str | None = None  # --broker amqp://...: the AMQP scenarios run on this RabbitMQ
        self.broker_url: str | None = None  # the current scenario's broker (a vhost of amqp_server), or None
        self._vhosts: list[RabbitVhost] = []

    def n(self, base: int, minimum: int = 8) -> int:
        """A request count scaled by --scale."""
        return max(minimum, round(base * self.scale))

    def redis(
        self, *, aof: bool = False, extra_args: tuple[str, ...] = (), kind: type[RedisServer] = RedisServer
    ) -> RedisServer:
        """A fresh redis-server (`kind`: a subclass such as TlsRedisServer), stopped at cleanup."""
        r = kind(self.workdir / f"redis{next(self._redis_numbers)}", aof=aof, extra_args=extra_args)
        self._procs.append(r)
        return r.start()

    def last_started(self) -> WorkerProcess | RedisServer | None:
        """The process started last (also one whose start failed), None before any."""
        return self._procs[-1] if self._procs else None

    def vhost(self) -> RabbitVhost:
        """A fresh vhost on the --broker RabbitMQ for one scenario; the workers it starts next use it."""
        assert self.amqp_server is not None, "an AMQP scenario needs --broker amqp://..."
        v = RabbitVhost.create(self.amqp_server)
        self._vhosts.append(v)
        self.broker_url = v.url
        return v

    def worker(
        self, redis_url: str, *, env: dict[str, str] | None = None, metrics: bool = False, **settings: Any
    ) -> WorkerProcess:
        """Start `celery -A worker.app worker` with these settings over Suite.settings (not yet ready)."""
        name = f"w{next(self._worker_numbers)}"
        # One CPU thread per worker: two workers with a thread per core each fight over the cores of
        # a small machine, and measure their worst batch (the visibility check) many times too slow.
        extra = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
        port = free_port() if metrics else 0
        w = WorkerProcess.start(
            redis_url,
            self.checkpoint,
            self.workdir / f"{name}.log",
            name=name,
            env=extra,
            device=self.device,
            broker_url=self.broker_url,
            **{**self.settings, **settings, "metrics_port": port},
        )
        self._procs.append(w)
        return w

    def visibility_for(self, max_batch_tokens: int, delay_s: float = 0.0, margin: float = 3.0) -> float:
        """A short visibility timeout that a worker with these settings accepts at start: the
        worker's own rule with the worst batch measured here (once per batch size), times `margin`
        (a worker measures its worst batch on a machine busy with other processes), at least 8 s."""
        from worker.runtime.checks import required_visibility_s

        worst = self.worst_batch_s.get(max_batch_tokens)
        if worst is None:
            worst = self.worst_batch_s[max_batch_tokens] = measure_worst(self.checkpoint, max_batch_tokens)
        need = required_visibility_s(self.settings["max_wait_ms"], worst + delay_s)
        return round(max(8.0, need * margin), 1)

    def cleanup(self) -> None:
        """Stop whatever the scenario left running (workers first, then Redis)."""
        for p in reversed(self._procs):
            if isinstance(p, WorkerProcess) and p.alive():
                p.kill()
        for p in self._procs:
            if isinstance(p, RedisServer):
                p.stop()
        self._procs.clear()
        for v in self._vhosts:
            v.delete()
        self._vhosts.clear()
        self.broker_url = None


_MODEL_CACHE: dict[str, Any] = {}


def demo_model(checkpoint: Path) -> Any:
    """The checkpoint's model in this process (fp32, loaded once): the worst-batch measurement, fuzz."""
    if "model" not in _MODEL_CACHE:
        import torch

        import vela2

        _MODEL_CACHE["model"] = vela2.load(checkpoint, dtype=torch.float32)
    return _MODEL_CACHE["model"]


def measure_worst(checkpoint: Path, max_batch_tokens: int) -> float:
    from worker.runtime.warmup import measure_worst_batch_s
    from worker.settings import EngineSettings

    settings = EngineSettings(max_batch_tokens=max_batch_tokens, precision="fp32")  # the fp32 model on this CPU
    return measure_worst_batch_s(demo_model(checkpoint), settings)


# --- workers ---------------------------------------------------------------------------------------


def worker_counts(w: WorkerProcess) -> dict[str, int] | None:
    """The engine's shutdown counts (its JSON stats line, WorkerProcess.engine_stats) under the names
    the report uses; None when it never stopped warmly."""
    stats = w.engine_stats()
    if stats is None:
        return None
    results = stats["results"]
    return {
        "answered": stats["answered"],
        "ok": results["ok"],
        "error": results["error"],
        "expired": results["expired"],
        "duplicates_skipped": stats["duplicates"],
        "acked": stats["messages_acked"],
        "returned": stats["messages_returned"],
        "batches": stats["batches"],
        "raised": stats["batches_raised"],
    }


def worker_notes(workers: list[WorkerProcess]) -> dict[str, Any]:
    """What the workers' shutdown lines say, summed (warmly stopped workers only)."""
    total: dict[str, int] = {}
    stopped = 0
    for w in workers:
        s = worker_counts(w)
        if s is None:
            continue
        stopped += 1
        for k, v in s.items():
            total[k] = total.get(k, 0) + v
    return {"workers": len(workers), "warmly_stopped": stopped, **total}


def stop_all(workers: list[WorkerProcess], outcome: Outcome) -> None:
    """Warm-stop every live worker; each must exit 0."""
    codes = {w.name: w.terminate() for w in workers if w.alive()}
    outcome.check(
        "every worker still running at the end exits 0 on SIGTERM", all(c == 0 for c in codes.values()), codes
    )


def start_ready(s: Suite, n: int, redis_url: str, **settings: Any) -> list[WorkerProcess]:
    """Start `n` workers one after another (each measures its worst batch on a quiet machine)."""
    return [s.worker(redis_url, **settings).wait_ready() for _ in range(n)]


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.02) -> float:
    """Wait for `cond()`; returns the seconds waited; RuntimeError naming `what` on timeout."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)
    return time.monotonic() - t0


def log_problems(w: WorkerProcess) -> list[str]:
    """Log lines of a worker's safety nets (a bug caught, a message left for the visibility timeout)."""
    marks = ("engine loop error", "opening a message failed", "Traceback (most recent call last)")
    return [x[:300] for x in w.log().splitlines() if any(m in x for m in marks)][:5]


def round1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)
