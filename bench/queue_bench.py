"""Queue-path benchmarks: rows through Redis and `vela2 worker` processes, against the engine alone
and against plain Celery.

    python -m bench.queue_bench cpu   --out bench/results/cpu-queue.json     # this machine (make bench-queue)
    python -m bench.queue_bench gpu   --out bench/results/gpu-queue.json     # one GPU: engine vs queue, latency
    python -m bench.queue_bench multi --out bench/results/gpu-multi.json     # 1, 2 (, 4) workers, one per GPU

Every subcommand starts what it needs through the process harness (stack.harness): a redis-server
on a free loopback port with no persistence (from PATH, else /tmp/redis/usr/bin/redis-server as
unpacked by shared/device/setup.sh; or `--redis-url` to use a running one), and its worker
processes (`celery -A worker.app worker` configured by VELA2_* variables, started through
`python -m bench.queue_bench _worker`, which adds an optional per-thread CPU profile). Ids are
fresh per phase (a worker skips ids that already have a result), so a shared Redis never answers a
run from an earlier one.

cpu    Backfill rows/s of N short rows (8-50 words, one question each: the queue path, not the
       model, dominates) submitted with Client.submit_many(backfill=True, chunk_size=C) and
       collected with pipelined Client.results_many, through one CPU worker (fp32) serving a null
       model (the demo's tokenizer and heads over no decoder layers; `ours`) and the demo
       checkpoint (`ours_demo`); then, in the same run on the same Redis, plain Celery: one no-op
       task per row (apply_async, one message per row) on a `celery worker` with the pool of
       --celery-pool, collected with ResultSet.get (the result backend's pub/sub).
       ratio_vs_plain_celery = ours / plain. Phases alternate for --repeats rounds; each side's
       best round counts (a shared 2-core machine is noisy). Each round records the CPU seconds of
       the workers, redis-server and the client; --profile adds a per-thread CPU profile.
gpu    A checkpoint directory with only config.json, tokenizer.json and calibration.json for the
       9B-shaped model of bench.gpu_engine (hidden 4096, 36 layers, MLP 14336, 32/8 heads, window
       2048, its bench tokenizer); workers serve seeded random weights (VELA2_RANDOM_WEIGHTS=1,
       built on the device, bf16). Measures (a) the engine alone: vela2.predict over the workload
       (bench.workload, --copies) in this process after a warm-up, with the workers' settings;
       (b) the queue path: the same rows backfilled through Redis and --workers K workers, rows/s
       and ratio_vs_engine; (c) online latency: single short rows on the online queue at
       --latency-load (0.5) x the queue path's rows/s, Poisson arrivals, for --latency-s seconds,
       the worker otherwise idle: p50 / p99 of submit -> result visible, and the results'
       queue_ms / model_ms.
multi  (b) with 1, then 2 (then 4 when 4 GPUs are there) workers, each pinned to its own GPU
       (CUDA_VISIBLE_DEVICES=K, --device cuda:0); workers are added between runs, not restarted.
       Every id must be answered exactly once with status ok (lost = no result or not ok);
       answers_changed compares each run's stored results with a re-read at the end (a
       redelivered request must not change a stored answer); the workers' engine stats (their JSON
       stats lines at shutdown) give how many requests they scored in all (answered_twice = scored - submitted).
       --share-gpu: all workers on one device (one GPU, or the CPU) to exercise the code path.

Tiny shapes run everything on a CPU (what tests/integration/bench/test_queue_bench.py does; `--preset
tiny`: these options with --max-batch-tokens 8192):

    python -m bench.queue_bench gpu --device cpu --layers 2 --hidden 128 --copies 1 --max-rows 40 \
        --tokenizer demo --latency-s 3 --out /tmp/gpu-queue.json
    python -m bench.queue_bench multi --device cpu --share-gpu --workers 1,2 --layers 2 --hidden 128 \
        --copies 1 --max-rows 40 --tokenizer demo --out /tmp/gpu-multi.json

The options, their groups and defaults, `--preset` and `--config`: bench.queue_bench_options
(`python -m bench.queue_bench CMD -h` lists a subcommand's main options, `--help-all` all of them).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import cProfile
import dataclasses
import gc
import json
import logging
import os
import platform
import pstats
import shlex
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.queue_bench_options import parse_args
from stack.harness import READY_TIMEOUT_S, RedisServer, WorkerProcess, wait_for_redis

log = logging.getLogger("bench.queue_bench")

ROOT = Path(__file__).resolve().parents[1]
EXIT_MARGIN_S = 40.0  # time kept back from --deadline-s to stop the workers and write the JSON
PLAIN_QUEUE = "queue_bench.plain"  # the plain Celery app's queue (apart from every vela2 queue)
PLAIN_TASK = "queue_bench.noop"
# Short rows (5-60 words) of bench.workload: the online requests of the latency phase.
SHORT_GROUPS = ("choice:massive", "span:multiconer", "choice:snli", "choice:arc", "score:jsts", "score:klue_sts")
# The cpu subcommand's rows: one question each (choice, score, span), 8-50 words, ~140-180 demo tokens.
CPU_GROUPS = ("choice:snli", "score:jsts", "score:klue_sts", "span:multiconer")
TARGETS = {"ratio_vs_plain_celery": 3.0, "ratio_vs_engine": 0.9, "scaling_2x": 1.9}


def _now() -> float:
    return time.perf_counter()


def proc_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system) a process and its live children (a prefork pool) have used so
    far, from /proc (None where unreadable)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return own + sum(proc_cpu_s(c) or 0.0 for c in _children(pid))


def _children(pid: int) -> list[int]:
    """Live child processes of `pid` (scanning /proc for their parent id)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
    return out


@contextlib.contextmanager
def cpu_meter(pids: dict[str, list[int | None]], into: dict[str, Any]) -> Iterator[None]:
    """Record into `into["cpu_seconds"]` the CPU seconds each named group of processes used inside the
    block (a group whose /proc entries cannot be read is left out)."""

    def read() -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for name, group in pids.items():
            values = [proc_cpu_s(p) for p in group]
            out[name] = None if any(v is None for v in values) else sum(v for v in values if v is not None)
        return out

    before = read()
    yield
    after = read()
    into["cpu_seconds"] = {k: round(a - b, 3) for k, b in before.items()
                           if b is not None and (a := after[k]) is not None}


# --- redis-server and worker processes (stack.harness) --------------------------------------------


@contextlib.contextmanager
def bench_redis(workdir: Path, url: str | None = None) -> Iterator[tuple[str, str, int | None]]:
    """Yield (redis URL, what it is, its pid or None): `url` as given, else a fresh redis-server
    (stack.harness.RedisServer: a free loopback port, no RDB, no AOF), stopped on exit."""
    if url:
        wait_for_redis(url)
        yield url, f"given ({url})", None
        return
    with RedisServer(workdir / "redis") as server:
        pid = server.proc.pid if server.proc is not None else None
        yield server.url(), f"redis-server ({server.exe}) on 127.0.0.1:{server.port}, no persistence", pid


def profile_path(w: WorkerProcess) -> Path:
    """Where `_worker --profile` writes the worker's CPU profile (beside its log)."""
    return w.log_path.with_name(f"{w.name}.profile.json")


def start_vela2_worker(name: str, workdir: Path, settings: dict[str, Any], *, cuda_device: int | None = None,
                       profile: bool = False, torch_threads: int | None = None) -> WorkerProcess:
    """Start one vela2 worker: `python -m bench.queue_bench _worker` with these settings (flat
    worker.settings names, redis_url and checkpoint among them); `cuda_device` pins it to one GPU
    through CUDA_VISIBLE_DEVICES; `torch_threads` sets OMP_NUM_THREADS (torch's intra-op threads on
    a CPU); `profile` writes its per-thread CPU profile to `profile_path`."""
    settings = dict(settings)
    redis_url, checkpoint = settings.pop("redis_url"), settings.pop("checkpoint")
    extra: dict[str, str] = {}
    if torch_threads:
        extra["OMP_NUM_THREADS"] = extra["MKL_NUM_THREADS"] = str(torch_threads)
    if cuda_device is not None:
        extra["CUDA_VISIBLE_DEVICES"] = str(cuda_device)
    cmd = [sys.executable, "-m", "bench.queue_bench", "_worker", "--hostname", f"{name}@%h"]
    if profile:
        cmd += ["--profile", str(workdir / f"{name}.profile.json")]
    w = WorkerProcess.start(redis_url, checkpoint, workdir / f"{name}.log", name=name, env=extra, command=cmd,
                            **settings)
    log.info("started worker %s (pid %d, %s%s)", name, w.pid, settings.get("device"),
             "" if cuda_device is None else f", CUDA_VISIBLE_DEVICES={cuda_device}")
    return w


def start_plain_worker(workdir: Path, redis_url: str, pool: str, concurrency: int, prefetch: int) -> WorkerProcess:
    """Start the plain Celery worker (the no-op task) with the given pool."""
    cmd = [sys.executable, "-m", "bench.queue_bench", "_plain_worker", "--redis-url", redis_url, "--pool", pool,
           "--concurrency", str(concurrency), "--prefetch", str(prefetch), "--hostname", "plain@%h"]
    w = WorkerProcess.start(redis_url, None, workdir / "plain.log", name="plain", command=cmd)
    log.info("started plain Celery worker (pid %d, pool %s, concurrency %d, prefetch x%d)", w.pid, pool,
             concurrency, prefetch)
    return w


def plain_app(redis_url: str, prefetch: int = 4) -> Any:
    """The plain Celery app: Redis broker and result backend, JSON, one no-op task per row."""
    from celery import Celery

    app = Celery("queue_bench_plain", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_default_queue=PLAIN_QUEUE,
        worker_prefetch_multiplier=prefetch,
        broker_connection_retry_on_startup=True,
        result_expires=3600,
    )

    @app.task(name=PLAIN_TASK)
    def noop(row: Any) -> Any:
        return row

    return app


_CELERY_FLAGS = ["--loglevel", "INFO", "--without-mingle", "--without-gossip", "--without-heartbeat"]


def _worker_main(argv: list[str]) -> int:
    """(subprocess) a vela2 worker configured by VELA2_* variables, optionally sampled."""
    ap = argparse.ArgumentParser(prog="python -m bench.queue_bench _worker")
    ap.add_argument("--hostname", required=True)
    ap.add_argument("--profile", default=None, help="write a per-thread CPU profile (JSON) here at exit")
    args = ap.parse_args(argv)
    if args.profile:
        profiles = ThreadProfiles()
        profiles.install()
        atexit.register(profiles.dump, args.profile)  # also after SystemExit from worker_main
    gc_pauses = GcPauses()
    gc.callbacks.append(gc_pauses)
    atexit.register(lambda: print(f"{GC_LOG_PREFIX}{json.dumps(gc_pauses.summary())}", file=sys.stderr, flush=True))
    from worker.app import create_app

    app = create_app()
    try:
        app.worker_main(["worker", "--pool", "solo", "--concurrency", "1", *_CELERY_FLAGS, "--hostname", args.hostname])
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return 0


def _plain_worker_main(argv: list[str]) -> int:
    """(subprocess) the plain Celery worker."""
    ap = argparse.ArgumentParser(prog="python -m bench.queue_bench _plain_worker")
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--pool", default="solo")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--hostname", required=True)
    args = ap.parse_args(argv)
    app = plain_app(args.redis_url, args.prefetch)
    try:
        app.worker_main(["worker", "--pool", args.pool, "--concurrency", str(args.concurrency), "-Q", PLAIN_QUEUE,
                         *_CELERY_FLAGS, "--hostname", args.hostname])
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return 0


GC_LOG_PREFIX = "bench gc pauses: "  # then one JSON object, written by the worker at exit


class GcPauses:
    """gc.callbacks hook: how many collections of each generation ran and how long they took."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            g = int(info.get("generation", 0))
            self.count[g] += 1
            self.seconds[g] += time.perf_counter() - self._t0

    def summary(self) -> dict[str, Any]:
        return {"collections": self.count, "seconds": [round(x, 4) for x in self.seconds]}


# --- a per-thread CPU profile of the worker (py-spy is not installed) -----------------------------


class ThreadProfiles:
    """cProfile in every thread of this process, timed by each thread's own CPU clock
    (time.thread_time), so a thread waiting for the GIL, a socket or a queue is not charged.
    `install()` before the threads start (it wraps threading.Thread.run); `dump()` at exit."""

    def __init__(self) -> None:
        self.done: list[tuple[str, cProfile.Profile]] = []
        self.main = cProfile.Profile(time.thread_time)
        self._lock = threading.Lock()

    def install(self) -> None:
        orig_run = threading.Thread.run
        profiles = self

        def run(thread: threading.Thread) -> None:
            prof = cProfile.Profile(time.thread_time)
            prof.enable()
            try:
                orig_run(thread)
            finally:
                prof.disable()
                with profiles._lock:
                    profiles.done.append((thread.name, prof))

        threading.Thread.run = run  # type: ignore[method-assign]
        self.main.enable()

    def summary(self, top: int = 40) -> dict[str, Any]:
        """Per thread: CPU seconds, and the functions with the most self / cumulative CPU seconds."""
        self.main.disable()
        with self._lock:
            items = [("MainThread", self.main), *self.done]
        out: dict[str, Any] = {}
        for name, prof in items:
            st = pstats.Stats(prof)
            total = float(getattr(st, "total_tt", 0.0))
            if total < 0.01:
                continue
            funcs = st.stats.items()  # type: ignore[attr-defined]
            by_self = sorted(funcs, key=lambda kv: -kv[1][2])[:top]
            by_cum = sorted(funcs, key=lambda kv: -kv[1][3])[: top * 2]
            out[name] = {
                "cpu_seconds": round(total, 3),
                "self": {_func_key(f): round(v[2], 3) for f, v in by_self},
                "cumulative": {_func_key(f): round(v[3], 3) for f, v in by_cum},
            }
        return {"timer": "time.thread_time (CPU seconds per thread)",
                "threads": dict(sorted(out.items(), key=lambda kv: -kv[1]["cpu_seconds"]))}

    def dump(self, path: str) -> None:
        Path(path).write_text(json.dumps(self.summary(), indent=1) + "\n")


def _func_key(func: tuple[str, int, str]) -> str:
    name, _, fn = func
    for marker in ("site-packages/", "/lib/python3"):
        if marker in name:
            name = name.split(marker, 1)[1]
            break
    else:
        with contextlib.suppress(ValueError):
            name = str(Path(name).relative_to(ROOT))
    return f"{name}:{fn}"


# --- workloads -----------------------------------------------------------------------------------


def short_rows(n: int, prefix: str, seed: int = 1, groups: tuple[str, ...] = SHORT_GROUPS) -> list[dict[str, Any]]:
    """n short rows (by default 5-60 words: massive, multiconer, snli, arc, jsts, klue_sts in turn) from
    bench.workload's generators, ids `<prefix><k>`."""
    from bench.workload import COUNTS, make_row

    rows = []
    for k in range(n):
        group = groups[k % len(groups)]
        j = k // len(groups)
        row = make_row(group, j % COUNTS[group], seed=seed, copy=j // COUNTS[group])
        rows.append({**row, "id": f"{prefix}{k}"})
    return rows


def with_prefix(rows: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """The same rows under fresh ids `<prefix><id>`."""
    return [{**r, "id": f"{prefix}{r['id']}"} for r in rows]


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def _left_s(args: argparse.Namespace) -> float:
    """Seconds left before --deadline-s, less the margin for stopping workers and writing the JSON."""
    return args.deadline_at - time.monotonic() - EXIT_MARGIN_S


def _phase_timeout(args: argparse.Namespace) -> float:
    """The wait allowed to one phase: --timeout-s, cut to what the deadline leaves (at least 5 s)."""
    return max(5.0, min(args.timeout_s, _left_s(args)))


@contextlib.contextmanager
def _kept_logs(work: Path, args: argparse.Namespace) -> Iterator[None]:
    """Copy the worker logs of `work` to --keep-logs at the end, also when the run fails."""
    try:
        yield
    finally:
        if args.keep_logs:
            dest = Path(args.keep_logs)
            dest.mkdir(parents=True, exist_ok=True)
            for f in work.glob("*.log"):
                shutil.copy(f, dest / f.name)


# --- measurements --------------------------------------------------------------------------------


def backfill_run(client: Any, rows: list[dict[str, Any]], chunk_size: int, timeout_s: float,
                 poll_s: float = 0.02, poll_ids: int = 512) -> dict[str, Any]:
    """Submit rows on the backfill queue (submit_many, chunks of chunk_size) and collect every result
    with results_many: one MGET every poll_s over the oldest poll_ids ids still missing (results come
    back roughly in submission order; a small window keeps the client's CPU off the worker's cores).
    seconds = first submit -> last result seen."""
    t0, cpu0 = _now(), time.process_time()
    ids = client.submit_many(rows, backfill=True, chunk_size=chunk_size)
    submit_s = _now() - t0
    results: dict[str, Any] = {}
    missing = list(ids)
    deadline = time.monotonic() + timeout_s
    while missing and time.monotonic() < deadline:
        got = client.results_many(missing[:poll_ids], timeout_s=0)  # one MGET
        found = {k: v for k, v in got.items() if v is not None}
        if found:
            results.update(found)
            missing = [i for i in missing if i not in results]
        if missing and len(found) < poll_ids:
            time.sleep(poll_s)
    seconds = _now() - t0
    statuses = Counter(str(getattr(r.status, "value", r.status)) for r in results.values())
    return {
        "rows": len(rows),
        "seconds": round(seconds, 3),
        "rows_per_s": round(len(results) / seconds, 2),
        "submit_seconds": round(submit_s, 3),
        "client_cpu_seconds": round(time.process_time() - cpu0, 3),
        "answered": len(results),
        "ok": statuses.get("ok", 0),
        "lost": len(rows) - statuses.get("ok", 0),
        "statuses": dict(statuses),
        "ids": ids,
    }


def plain_celery_run(app: Any, rows: list[dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    """One no-op task per row (apply_async: one message each), then ResultSet.get for all of them."""
    from celery.result import ResultSet

    task = app.tasks[PLAIN_TASK]
    t0, cpu0 = _now(), time.process_time()
    handles = [task.apply_async(args=[row], queue=PLAIN_QUEUE) for row in rows]
    submit_s = _now() - t0
    values = ResultSet(handles).get(timeout=timeout_s)
    seconds = _now() - t0
    cpu_s = time.process_time() - cpu0
    answered = sum(1 for v, r in zip(values, rows, strict=True) if isinstance(v, dict) and v.get("id") == r["id"])
    # Unsubscribe now, while Redis is up: an AsyncResult left for interpreter exit retries forever.
    for h in handles:
        app.backend.remove_pending_result(h)
        h.backend = None  # its __del__ (maybe at the final gc, after Redis stopped) then does nothing
    return {
        "rows": len(rows),
        "seconds": round(seconds, 3),
        "rows_per_s": round(answered / seconds, 2),
        "submit_seconds": round(submit_s, 3),
        "client_cpu_seconds": round(cpu_s, 3),
        "answered": answered,
        "lost": len(rows) - answered,
    }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    import numpy as np

    return round(float(np.percentile(np.asarray(values, dtype=float), q)), 2)


def latency_run(client: Any, redis_url: str, rows: list[dict[str, Any]], rate_per_s: float, duration_s: float,
                seed: int = 0, poll_s: float = 0.002, timeout_s: float = 60.0) -> dict[str, Any]:
    """Submit single rows on the online queue with Poisson arrivals at `rate_per_s` for `duration_s`;
    a poller thread MGETs the outstanding ids every `poll_s`. Latency = submit -> result visible."""
    import numpy as np
    import redis

    from vela2.wire.keys import result_key
    from vela2.wire.results import meta_row

    rng = np.random.default_rng(seed)
    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    timings: dict[str, dict[str, float]] = {}
    statuses: Counter = Counter()
    lock = threading.Lock()
    done = threading.Event()
    reader = redis.Redis.from_url(redis_url)

    def poll() -> None:
        while True:
            with lock:
                waiting = [i for i in sent if i not in seen]
            if not waiting and done.is_set():
                return
            if waiting:
                raw = reader.mget([result_key(i) for i in waiting])
                now = _now()
                for rid, value in zip(waiting, raw, strict=True):
                    if value is None:
                        continue
                    row = meta_row(json.loads(value)) or {}
                    with lock:
                        seen[rid] = now
                    timings[rid] = row.get("timings") or {}
                    statuses[row.get("status", "?")] += 1
            time.sleep(poll_s)

    poller = threading.Thread(target=poll, name="latency-poller", daemon=True)
    poller.start()
    t0 = _now()
    at = 0.0
    k = 0
    while True:
        at += float(rng.exponential(1.0 / rate_per_s))
        if at > duration_s:
            break
        pause = t0 + at - _now()
        if pause > 0:
            time.sleep(pause)
        row = rows[k % len(rows)]
        row = {**row, "id": f"{row['id']}-{k}"}
        with lock:
            sent[row["id"]] = _now()
        client.submit(row)
        k += 1
    sent_s = _now() - t0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with lock:
            if len(seen) >= len(sent):
                break
        time.sleep(0.01)
    done.set()
    poller.join(timeout_s)
    reader.close()
    lat = [(seen[i] - sent[i]) * 1e3 for i in sent if i in seen]
    out: dict[str, Any] = {
        "requests": len(sent),
        "answered": len(seen),
        "lost": len(sent) - len(seen),
        "statuses": dict(statuses),
        "target_rate_per_s": round(rate_per_s, 3),
        "achieved_rate_per_s": round(len(sent) / sent_s, 3) if sent_s > 0 else None,
        "seconds": round(sent_s, 2),
        "arrivals": "poisson",
        "poll_ms": poll_s * 1e3,
        "latency_p50_ms": _pct(lat, 50),
        "latency_p90_ms": _pct(lat, 90),
        "latency_p99_ms": _pct(lat, 99),
        "latency_max_ms": round(max(lat), 2) if lat else None,
        "latency_mean_ms": round(sum(lat) / len(lat), 2) if lat else None,
    }
    for key in ("queue_ms", "render_ms", "model_ms", "decode_ms"):
        vals = [t[key] for t in timings.values() if key in t]
        out[f"{key}_p50"] = _pct(vals, 50)
        out[f"{key}_p99"] = _pct(vals, 99)
    return out


def engine_alone(model: Any, rows: list[dict[str, Any]], precision: str, max_batch_tokens: int,
                 row_tokens: int | None, warmup_rows: int) -> dict[str, Any]:
    """vela2.predict over `rows` (render + pack + forward + decode, no queue) after a warm-up predict
    over the first `warmup_rows` rows: the figure the queue path is compared with."""
    import torch

    import vela2

    def sync() -> None:
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)

    t0 = _now()
    if warmup_rows:
        vela2.predict(model, rows[:warmup_rows], precision=precision, max_batch_tokens=max_batch_tokens,
                      row_tokens=row_tokens)
    sync()
    warm_s = _now() - t0
    t0 = _now()
    res = vela2.predict(model, rows, precision=precision, max_batch_tokens=max_batch_tokens, row_tokens=row_tokens)
    sync()
    seconds = _now() - t0
    errors = [r for r in res if str(getattr(r.status, "value", r.status)) != "ok"]
    for r in errors[:3]:
        log.warning("engine: row %s failed: %s", r.id, r.error)
    return {"rows": len(rows), "seconds": round(seconds, 3), "rows_per_s": round(len(rows) / seconds, 2),
            "errors": len(errors), "warmup_rows": min(warmup_rows, len(rows)), "warmup_seconds": round(warm_s, 2)}


# --- the machine ---------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """Platform, CPU count, Python, and the GPUs torch sees (if torch is importable)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
    }
    try:
        import celery
        import kombu
        import redis

        info.update(celery=celery.__version__, kombu=kombu.__version__, redis_py=redis.__version__)
    except ImportError:
        pass
    return info


def gpu_info() -> dict[str, Any]:
    """torch / transformers / CUDA versions and the visible GPUs."""
    import torch
    import transformers

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "device_count": n,
        "names": [torch.cuda.get_device_name(i) for i in range(n)],
    }


def _redis_version(url: str) -> str | None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return str(client.info("server").get("redis_version"))
    finally:
        client.close()


# --- cpu -----------------------------------------------------------------------------------------


def cpu_checkpoint(kind: str, cache_dir: Path) -> tuple[Path, dict[str, Any]]:
    """(checkpoint directory, extra worker settings) of a `cpu` model: `demo` = vela2.init_demo (2 layers,
    hidden 64); `null` = the demo's tokenizer, calibration and heads over a backbone with no decoder
    layers (embeddings -> final norm -> heads), random weights: every step of the queue path runs
    (render, bucket, batch, heads, decode, store, ack) and the model costs next to nothing."""
    path = cache_dir / kind
    if (path / "config.json").is_file():
        return path, {"random_weights": 1} if kind == "null" else {}
    if kind == "demo":
        import vela2

        log.info("writing the demo checkpoint to %s", path)
        return vela2.init_demo(path), {}
    from vela2.train.demo_model import demo_calibration, demo_config, demo_tokenizer

    tok = demo_tokenizer()
    path.mkdir(parents=True, exist_ok=True)
    demo_config(name="vela2-null", vocab_size=tok.get_vocab_size(), num_hidden_layers=0).write(path)
    tok.save(str(path / "tokenizer.json"))
    demo_calibration().write(path)
    return path, {"random_weights": 1}


def _engine_totals(workers: list[WorkerProcess]) -> dict[str, Any] | None:
    """The workers' engine stats (their JSON stats lines) added up (None when one is missing)."""
    found = [w.engine_stats() for w in workers]
    if any(s is None for s in found):
        return None
    return {"answered": sum(s["answered"] for s in found if s),
            "duplicates_skipped": sum(s["duplicates"] for s in found if s),
            "stats": found}


def run_cpu(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Our backfill path vs plain Celery on this machine (see the module docstring)."""
    from producer.client import Client
    from vela2.config import Vela2Config

    t_start = _now()
    base = {"device": "cpu", "precision": "fp32", "max_batch_tokens": args.max_batch_tokens,
            "max_wait_ms": args.max_wait_ms, "max_buffered": args.max_buffered, "render_threads": args.render_threads}
    if args.cpu_processes is not None:
        base["cpu_processes"] = args.cpu_processes
    models = {}
    for kind in args.models:
        ckpt, extra = cpu_checkpoint(kind, Path(args.cache_dir))
        models[kind] = {"checkpoint": ckpt, "name": Vela2Config.read(ckpt).name, "settings": {**base, **extra}}
    ours: dict[str, list[dict[str, Any]]] = {k: [] for k in models}
    plain: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="queue-bench-") as tmp, _kept_logs(Path(tmp), args), bench_redis(
        Path(tmp), args.redis_url
    ) as (url, what, redis_pid):
        work = Path(tmp)
        log.info("redis: %s", what)
        workers: dict[str, list[WorkerProcess]] = {}
        every: list[WorkerProcess] = []  # everything started, stopped in `finally`
        clients = {k: Client(url, model=m["name"]) for k, m in models.items()}
        app = plain_app(url, args.celery_prefetch)
        try:
            for k, m in models.items():
                settings = {"redis_url": url, "checkpoint": m["checkpoint"], **m["settings"]}
                for i in range(args.ours_workers):
                    every.append(start_vela2_worker(f"vela2-{k}-{i}", work, settings, profile=args.profile and i == 0,
                                                    torch_threads=args.torch_threads))
                    workers.setdefault(k, []).append(every[-1])
            plain_w = start_plain_worker(work, url, args.celery_pool, args.celery_concurrency, args.celery_prefetch)
            every.append(plain_w)
            for w in every:
                w.wait_ready()
            log.info("workers ready in %s s", ", ".join(f"{w.name} {w.ready_s:.1f}" for w in every))
            warm = short_rows(min(args.rows, 200), f"warm-{_tag()}-", groups=args.groups)
            for client in clients.values():
                backfill_run(client, warm, args.chunk_size, args.timeout_s)
            plain_celery_run(app, warm, args.timeout_s)
            for rep in range(args.repeats):
                for kind, client in clients.items():
                    rows = short_rows(args.rows, f"{kind}{rep}-{_tag()}-", groups=args.groups)
                    meter: dict[str, Any] = {}
                    with cpu_meter({"worker": [w.proc.pid for w in workers[kind]], "redis": [redis_pid]}, meter):
                        r = backfill_run(client, rows, args.chunk_size, args.timeout_s)
                    r.update(meter)
                    r.pop("ids")
                    ours[kind].append(r)
                    log.info("round %d ours (%s model): %d rows in %.2f s = %.0f rows/s (lost %d)", rep, kind,
                             r["rows"], r["seconds"], r["rows_per_s"], r["lost"])
                meter = {}
                with cpu_meter({"worker": [plain_w.proc.pid], "redis": [redis_pid]}, meter):
                    p = plain_celery_run(app, short_rows(args.rows, f"plain{rep}-{_tag()}-", groups=args.groups),
                                         args.timeout_s)
                p.update(meter)
                plain.append(p)
                log.info("round %d plain Celery: %d rows in %.2f s = %.0f rows/s (lost %d)", rep, p["rows"],
                         p["seconds"], p["rows_per_s"], p["lost"])
        finally:
            for client in clients.values():
                client.close()
            with contextlib.suppress(Exception):
                app.backend.result_consumer.stop()
            app.close()
            WorkerProcess.stop_all(every)
        redis_version = _redis_version(url) if args.redis_url else None
        profiles = {k: json.loads(profile_path(ws[0]).read_text()) for k, ws in workers.items()
                    if profile_path(ws[0]).is_file()}
        engine_stats = {k: _engine_totals(ws) for k, ws in workers.items()}
    best_plain = max(plain, key=lambda r: r["rows_per_s"])
    sides = {}
    for kind, m in models.items():
        best = max(ours[kind], key=lambda r: r["rows_per_s"])
        sides[kind] = {
            **best, "rounds": ours[kind], "checkpoint": str(m["checkpoint"]), "model": m["name"], "kind": kind,
            "settings": {k: str(v) for k, v in m["settings"].items()}, "chunk_size": args.chunk_size,
            "worker_processes": args.ours_workers, "torch_threads": args.torch_threads,
            "ratio_vs_plain_celery": round(best["rows_per_s"] / best_plain["rows_per_s"], 3),
            "submit": "Client.submit_many(backfill=True, chunk_size)", "collect": "Client.results_many (MGET polls)",
            "worker_engine": engine_stats[kind],
        }
    head = args.models[0]
    ratio = sides[head]["ratio_vs_plain_celery"]
    from bench.workload import count_words

    words = [count_words(r["text"]) for r in short_rows(len(args.groups) * 20, "s-", groups=args.groups)]
    return {
        "command": "python -m bench.queue_bench " + shlex.join(argv),
        "machine": machine_info(),
        "redis": what if redis_version is None else f"{what}, redis {redis_version}",
        "workload": {
            "rows": args.rows, "groups": list(args.groups), "words_min": min(words), "words_max": max(words),
            "words_mean": round(sum(words) / len(words), 1),
            "why": "short rows, so that the queue path (messages, rendering, batching, result writes), not the "
                   "model, dominates the time per row",
        },
        "ours": sides[head],
        **{f"ours_{k}": v for k, v in sides.items() if k != head},
        "plain_celery": {
            **best_plain, "rounds": plain, "pool": args.celery_pool, "concurrency": args.celery_concurrency,
            "prefetch_multiplier": args.celery_prefetch, "task": "@app.task def noop(row): return row",
            "submit": "apply_async, one message per row", "collect": "ResultSet.get (result backend pub/sub)",
        },
        "ratio_vs_plain_celery": ratio,
        "target": f">= {TARGETS['ratio_vs_plain_celery']} (ours: the {head} model)",
        "meets_target": ratio >= TARGETS["ratio_vs_plain_celery"],
        "repeats": args.repeats,
        "notes": cpu_notes(ratio, sides[head], best_plain, profiles, args),
        "profile": profiles or None,
        "wall_seconds": round(_now() - t_start, 1),
    }


def _cpu_line(name: str, r: dict[str, Any]) -> str:
    """One side's CPU use per row in a round: which process bounds it."""
    n = max(1, r["rows"])
    cpu = r.get("cpu_seconds", {})
    parts = [f"{k} {v * 1e3 / n:.2f}" for k, v in cpu.items()] + [f"client {r['client_cpu_seconds'] * 1e3 / n:.2f}"]
    busy = f"; its worker(s) busy {cpu['worker'] / r['seconds']:.2f} cores" if "worker" in cpu else ""
    return f"{name}: CPU ms per row: {', '.join(parts)}{busy} ({r['seconds']:.2f} s wall)"


def cpu_notes(ratio: float, ours: dict[str, Any], plain: dict[str, Any], profiles: dict[str, Any],
              args: argparse.Namespace) -> list[str]:
    """What the run means, which process bounds each side, and (with --profile) where the worker's
    threads spend their CPU."""
    notes = [
        "Both sides run on the same redis-server in the same run, phases alternating; each side's best "
        f"of {args.repeats} round(s) counts. Times run from the first submit to the last result seen by the client.",
        f"Ours: {args.ours_workers} worker process(es) (solo pool; the engine thread drives the model, "
        + (f"{args.cpu_processes} render / decode process(es)" if args.cpu_processes
           else f"{args.render_threads} render thread(s) render / decode")
        + f"), {args.chunk_size} rows per message, results "
        "written in pipelined batches.",
        f"Plain Celery: pool {args.celery_pool} x{args.celery_concurrency}; one message and one result "
        "(SET + PUBLISH) per row; the client waits on the result backend's pub/sub.",
        _cpu_line("ours", ours),
        _cpu_line("plain Celery", plain),
    ]
    for kind, profile in profiles.items():
        parts = []
        for name, th in list(profile["threads"].items())[:4]:
            top = ", ".join(f"{k.rsplit('/', 1)[-1]} {v:.2f}" for k, v in list(th["self"].items())[:4])
            parts.append(f"{name} {th['cpu_seconds']:.2f} CPU-s ({top})")
        notes.append(f"{kind} worker CPU profile over its whole life (cProfile per thread, thread CPU time; "
                     "it slows the worker, so its rows/s are not comparable): " + " | ".join(parts))
    if ratio < TARGETS["ratio_vs_plain_celery"]:
        notes.append(f"ratio {ratio} is below the target {TARGETS['ratio_vs_plain_celery']}: one worker process "
                     "runs Python on one core at a time (GIL); see the CPU lines above, --profile, and "
                     "bench/README.md (queue path) for what bounds it.")
    return notes


# --- gpu / multi ---------------------------------------------------------------------------------


def bench_config(args: argparse.Namespace, vocab_size: int) -> Any:
    """bench.gpu_engine's model config (Qwen2 layout, the release window and overlap)."""
    from vela2.train.demo_model import demo_config

    config = demo_config(
        name=args.model_name, vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(4096, 2 * args.window),
    )
    return dataclasses.replace(config, max_window_tokens=args.window, window_overlap_words=64,
                               window_block_reserve_tokens=0)  # 0: an eighth of the window


def write_bench_checkpoint(path: Path, args: argparse.Namespace) -> Path:
    """A checkpoint directory without weights: config.json, tokenizer.json, calibration.json. Workers
    serve it with VELA2_RANDOM_WEIGHTS=1 (seeded random weights built on their device)."""
    from bench.gpu_engine import bench_tokenizer
    from vela2.train.demo_model import demo_calibration, demo_tokenizer

    tok = bench_tokenizer() if args.tokenizer == "bench" else demo_tokenizer()
    path.mkdir(parents=True, exist_ok=True)
    bench_config(args, tok.get_vocab_size()).write(path)
    tok.save(str(path / "tokenizer.json"))
    demo_calibration().write(path)
    return path


def worker_settings(args: argparse.Namespace, url: str, ckpt: Path, device: str) -> dict[str, Any]:
    """The VELA2_* settings of every gpu / multi worker."""
    return {
        "redis_url": url, "checkpoint": ckpt, "device": device, "precision": args.precision,
        "max_batch_tokens": args.max_batch_tokens, "max_wait_ms": args.max_wait_ms, "max_buffered": args.max_buffered,
        "render_threads": args.render_threads, "row_tokens": args.row_tokens, "attn": args.attn, "random_weights": 1,
    }


def _worker_supports_row_tokens() -> bool:
    from worker.settings import EngineSettings

    return "row_tokens" in {f.name for f in dataclasses.fields(EngineSettings)}


def _device_plan(args: argparse.Namespace, k: int) -> tuple[str, int | None]:
    """(VELA2_DEVICE, CUDA_VISIBLE_DEVICES or None) of worker k."""
    if args.device == "cpu" or args.share_gpu:
        return args.device, None
    return "cuda:0", k  # one GPU per worker, each seeing only its own as cuda:0


def _add_workers(args: argparse.Namespace, work: Path, url: str, ckpt: Path, workers: list[WorkerProcess],
                 n: int) -> None:
    """Start workers until `n` run (appended to `workers` as they start, so the caller stops them
    whatever happens), then wait until all are ready."""
    new = []
    for k in range(len(workers), n):
        device, cuda = _device_plan(args, k)
        new.append(start_vela2_worker(f"w{k}", work, worker_settings(args, url, ckpt, device), cuda_device=cuda))
        workers.append(new[-1])
    for w in new:
        w.wait_ready(min(READY_TIMEOUT_S, _phase_timeout(args)))
        log.info("worker %s ready in %.1f s", w.name, w.ready_s)


def _queue_warmup(client: Any, rows: list[dict[str, Any]], n: int, args: argparse.Namespace) -> None:
    if n <= 0:
        return
    t0 = _now()
    r = backfill_run(client, with_prefix(rows[:n], f"warm-{_tag()}-"), args.chunk_size, _phase_timeout(args))
    log.info("queue warm-up: %d rows in %.1f s (lost %d)", r["rows"], _now() - t0, r["lost"])


def _load_engine_model(args: argparse.Namespace, ckpt: Path) -> Any:
    import torch

    import vela2
    from vela2.model.checkpoint import serving_dtype

    model = vela2.load(ckpt, device=args.device, dtype=serving_dtype(args.precision), random_weights=True)
    if args.attn != "sdpa":
        model.set_attention(args.attn)
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    return model


def _free_model(model: Any) -> None:
    """Drop the engine model's weights (the caller deletes its own reference too)."""
    import gc

    import torch

    cuda = model.device.type == "cuda"
    model.to("meta")  # frees the parameters now, whoever still holds the module
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def _workload(args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench.workload import make_workload

    rows = make_workload(seed=args.seed, copies=args.copies)
    return rows[: args.max_rows] if args.max_rows else rows


def _model_doc(args: argparse.Namespace, ckpt: Path) -> dict[str, Any]:
    from vela2.config import Vela2Config

    cfg = Vela2Config.read(ckpt)
    return {"layout": "qwen2", "hidden": args.hidden, "layers": args.layers, "intermediate": args.intermediate,
            "heads": args.heads, "kv_heads": args.kv_heads, "window": args.window, "tokenizer": args.tokenizer,
            "vocab": cfg.backbone.get("vocab_size"), "weights": "seeded random (VELA2_RANDOM_WEIGHTS=1)",
            "precision": args.precision}


def run_gpu(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Engine alone vs the queue path, then online latency at a fraction of the queue path's rate."""
    from producer.client import Client
    from vela2.config import Vela2Config

    t_start = _now()
    if args.device != "cpu" and not args.share_gpu and args.workers > gpu_info()["device_count"]:
        raise SystemExit(f"gpu: --workers {args.workers} needs as many GPUs; {gpu_info()['device_count']} visible "
                         "(or pass --share-gpu)")
    rows = _workload(args)
    with tempfile.TemporaryDirectory(prefix="queue-bench-") as tmp, _kept_logs(Path(tmp), args):
        work = Path(tmp)
        ckpt = write_bench_checkpoint(work / "ckpt", args)
        model_name = Vela2Config.read(ckpt).name
        model_doc = _model_doc(args, ckpt)
        log.info("checkpoint (no weights) in %s; workload %d rows", ckpt, len(rows))
        engine: dict[str, Any] | None = None
        # The engine alone runs what the workers run: their row packing only where worker.engine.loop has it.
        engine_row_tokens = args.row_tokens or None
        if engine_row_tokens and not _worker_supports_row_tokens():
            log.warning("worker.settings.EngineSettings has no row_tokens: workers run one sequence per row, "
                        "so the engine alone does too (row_tokens %d ignored)", args.row_tokens)
            engine_row_tokens = None
        if not args.skip_engine:
            model = _load_engine_model(args, ckpt)
            log.info("engine alone: warm-up on %d rows, then %d rows", min(args.engine_warmup_rows, len(rows)),
                     len(rows))
            engine = engine_alone(model, rows, args.precision, args.max_batch_tokens, engine_row_tokens,
                                  args.engine_warmup_rows)
            engine["row_tokens"] = engine_row_tokens
            _free_model(model)
            del model  # the workers need the memory
            log.info("engine alone: %d rows in %.2f s = %.2f rows/s", engine["rows"], engine["seconds"],
                     engine["rows_per_s"])
        with bench_redis(work, args.redis_url) as (url, what, _):
            log.info("redis: %s", what)
            client = Client(url, model=model_name)
            workers: list[WorkerProcess] = []
            try:
                _add_workers(args, work, url, ckpt, workers, args.workers)
                _queue_warmup(client, rows, args.queue_warmup_rows, args)
                log.info("queue path: backfill of %d rows through %d worker(s)", len(rows), len(workers))
                q = backfill_run(client, with_prefix(rows, f"q-{_tag()}-"), args.chunk_size, _phase_timeout(args))
                q.pop("ids")
                log.info("queue path: %d rows in %.2f s = %.2f rows/s (lost %d)", q["rows"], q["seconds"],
                         q["rows_per_s"], q["lost"])
                rate = args.latency_rate or args.latency_load * q["rows_per_s"]
                lat: dict[str, Any] | None = None
                if args.latency_s > 0 and _left_s(args) < args.latency_s + 20:
                    log.warning("latency phase skipped: %.0f s left before --deadline-s", _left_s(args))
                elif args.latency_s > 0 and rate > 0:
                    log.info("latency: single short online rows at %.2f/s for %.0f s (max_wait_ms %g)", rate,
                             args.latency_s, args.max_wait_ms)
                    lat = latency_run(client, url, short_rows(max(50, int(rate * args.latency_s) + 10),
                                                              f"lat-{_tag()}-", seed=args.seed + 1),
                                      rate, args.latency_s, seed=args.seed, timeout_s=_phase_timeout(args))
                    log.info("latency: p50 %s ms, p99 %s ms over %d requests (lost %d)", lat["latency_p50_ms"],
                             lat["latency_p99_ms"], lat["requests"], lat["lost"])
            finally:
                client.close()
                WorkerProcess.stop_all(workers, min(60.0, max(10.0, _left_s(args) + EXIT_MARGIN_S - 10)))
            stats = [w.engine_stats() for w in workers]
            ready = [round(w.ready_s or 0, 1) for w in workers]
    queue_path: dict[str, Any] = {**q, "workers": args.workers, "chunk_size": args.chunk_size}
    if engine is not None:
        ratio = q["rows_per_s"] / engine["rows_per_s"]
        queue_path.update(engine_rows_per_s=engine["rows_per_s"], ratio_vs_engine=round(ratio, 3),
                          target=f"ratio_vs_engine >= {TARGETS['ratio_vs_engine']}",
                          meets_target=ratio / args.workers >= TARGETS["ratio_vs_engine"])
        if args.workers > 1:
            queue_path["ratio_vs_engine_per_worker"] = round(ratio / args.workers, 3)
    if lat is not None:
        queue_path.update({k: lat[k] for k in ("latency_p50_ms", "latency_p99_ms")},
                          latency_load=args.latency_load if not args.latency_rate else None,
                          latency_rate_per_s=round(rate, 3), max_wait_ms=args.max_wait_ms)
    return {
        "command": "python -m bench.queue_bench " + shlex.join(argv),
        "gpu": {"device": args.device, **gpu_info()},
        "machine": machine_info(),
        "redis": what,
        "model": model_doc,
        "settings": {k: str(v) for k, v in worker_settings(args, "-", ckpt, args.device).items()
                     if k not in ("redis_url", "checkpoint")},
        "worker_row_tokens_supported": _worker_supports_row_tokens(),
        "workload": {"seed": args.seed, "copies": args.copies, "rows": len(rows)},
        "engine": engine,
        "queue_path": queue_path,
        "latency": lat,
        "workers": {"ready_seconds": ready, "engine_stats": stats},
        "wall_seconds": round(_now() - t_start, 1),
    }


def _snapshot(client: Any, ids: list[str]) -> dict[str, bytes | None]:
    from vela2.wire.keys import result_key

    out: dict[str, bytes | None] = {}
    for k in range(0, len(ids), 1000):
        part = ids[k : k + 1000]
        out.update(zip(part, client.redis.mget([result_key(i) for i in part]), strict=True))
    return out


def _decisions(raw: bytes | None) -> Any:
    if raw is None:
        return None
    from vela2.wire.results import meta_row

    row = meta_row(json.loads(raw)) or {}
    return [a.get("decision") for a in row.get("answers") or []]


def run_multi(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """The queue path with 1, 2 (, 4) workers on the same Redis queue; scaling, loss, changed answers."""
    from producer.client import Client
    from vela2.config import Vela2Config

    t_start = _now()
    counts = sorted(set(args.worker_counts))
    info = gpu_info()
    if args.device != "cpu" and not args.share_gpu:
        counts = [k for k in counts if k <= info["device_count"]]
        if not counts:
            raise SystemExit(f"multi: no worker count fits the {info['device_count']} visible GPU(s)")
    rows = _workload(args)
    runs: list[dict[str, Any]] = []
    skipped: list[int] = []
    with tempfile.TemporaryDirectory(prefix="queue-bench-") as tmp, _kept_logs(Path(tmp), args):
        work = Path(tmp)
        ckpt = write_bench_checkpoint(work / "ckpt", args)
        model_name = Vela2Config.read(ckpt).name
        model_doc = _model_doc(args, ckpt)
        with bench_redis(work, args.redis_url) as (url, what, _):
            log.info("redis: %s; workload %d rows; worker counts %s", what, len(rows), counts)
            client = Client(url, model=model_name)
            workers: list[WorkerProcess] = []
            snapshots: list[dict[str, bytes | None]] = []
            submitted = 0
            try:
                for n in counts:
                    last = runs[-1]["seconds"] * runs[-1]["workers"] / n if runs else 0.0
                    if runs and _left_s(args) < 2 * last + 60:  # start-up + warm-up + the run, roughly
                        log.warning("skipping %d workers: %.0f s left before --deadline-s", n, _left_s(args))
                        skipped.append(n)
                        continue
                    _add_workers(args, work, url, ckpt, workers, n)
                    warm = args.queue_warmup_rows * n
                    _queue_warmup(client, rows, warm, args)
                    submitted += min(warm, len(rows))
                    log.info("run with %d worker(s): %d rows", n, len(rows))
                    r = backfill_run(client, with_prefix(rows, f"k{n}-{_tag()}-"), args.chunk_size,
                                     _phase_timeout(args))
                    submitted += len(rows)
                    ids = r.pop("ids")
                    snapshots.append(_snapshot(client, ids))
                    devices = [dict(zip(("device", "cuda_visible_devices"), _device_plan(args, k), strict=True))
                               for k in range(n)]
                    runs.append({"workers": n, "devices": devices, **r})
                    log.info("%d worker(s): %d rows in %.2f s = %.2f rows/s (lost %d)", n, r["rows"], r["seconds"],
                             r["rows_per_s"], r["lost"])
                time.sleep(args.settle_s)  # let any late redelivery land before the re-read
                base = [_decisions(v) for v in snapshots[0].values()] if snapshots else []
                for run, snap in zip(runs, snapshots, strict=True):
                    again = _snapshot(client, list(snap))
                    run["answers_changed"] = sum(1 for i, v in snap.items() if again[i] != v)
                    mine = [_decisions(v) for v in snap.values()]
                    run["decisions_differ_vs_first_run"] = sum(1 for a, b in zip(mine, base, strict=True) if a != b)
            finally:
                client.close()
                WorkerProcess.stop_all(workers, min(60.0, max(10.0, _left_s(args) + EXIT_MARGIN_S - 10)))
            stats = [w.engine_stats() for w in workers]
            ready = [round(w.ready_s or 0, 1) for w in workers]
    by_n = {r["workers"]: r["rows_per_s"] for r in runs}
    scored = sum(s["answered"] for s in stats if s) if all(stats) else None
    doc: dict[str, Any] = {
        "command": "python -m bench.queue_bench " + shlex.join(argv),
        "machine": {**machine_info(), "gpu": info},
        "redis": what,
        "model": model_doc,
        "settings": {k: str(v) for k, v in worker_settings(args, "-", ckpt, args.device).items()
                     if k not in ("redis_url", "checkpoint", "device")},
        "placement": (f"all workers share {args.device}" if args.share_gpu or args.device == "cpu"
                      else "one worker per GPU (CUDA_VISIBLE_DEVICES=K, --device cuda:0)"),
        "worker_row_tokens_supported": _worker_supports_row_tokens(),
        "workload": {"seed": args.seed, "copies": args.copies, "rows": len(rows)},
        "runs": runs,
        "workers": {"ready_seconds": ready, "engine_stats": stats, "submitted_total": submitted,
                    "scored_total": scored, "answered_twice": None if scored is None else scored - submitted},
        "skipped_worker_counts": skipped,
        "lost_total": sum(r["lost"] for r in runs),
        "answers_changed_total": sum(r["answers_changed"] for r in runs),
        "wall_seconds": round(_now() - t_start, 1),
    }
    if 1 in by_n:
        for n in (2, 4):
            if n in by_n:
                doc[f"scaling_{n}x"] = round(by_n[n] / by_n[1], 3)
        if 2 in by_n:
            doc["target"] = f"scaling_2x >= {TARGETS['scaling_2x']}, none lost, no answer changed"
            doc["meets_target"] = (doc["scaling_2x"] >= TARGETS["scaling_2x"] and doc["lost_total"] == 0
                                   and doc["answers_changed_total"] == 0)
    return doc


# --- command line --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand, write its JSON, print the headline figures."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_worker":
        return _worker_main(argv[1:])
    if argv and argv[0] == "_plain_worker":
        return _plain_worker_main(argv[1:])
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run = {"cpu": run_cpu, "gpu": run_gpu, "multi": run_multi}[args.cmd]
    doc = run(args, argv)
    doc.setdefault("options", args.options)  # every option's value (defaults, --preset, --config resolved)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    headline = {k: doc[k] for k in ("ratio_vs_plain_celery", "queue_path", "latency", "runs", "scaling_2x",
                                    "scaling_4x", "meets_target") if k in doc}
    print(json.dumps(headline, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
