"""Worker start-up: check what can be checked (worker.runtime.checks), load the model once (in the
device process, or here), run the warm-up (worker.runtime.warmup), start the engine, its visibility
leases and its health and metrics endpoints."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from vela2.errors import ConfigError, Vela2Error
from vela2.model import manifest
from vela2.wire import keys, tracing
from vela2.wire.connections import redis_client
from vela2.wire.results import ResultStore
from worker.engine.loop import Engine
from worker.obs.health import Health
from worker.obs.metrics import Metrics
from worker.obs.tracing import WorkerTracing
from worker.runtime.checks import check_mixed, check_visibility, preflight
from worker.runtime.cpu_procs import CpuProcesses, ModelFiles
from worker.runtime.device import WARMING_UP, ModelSpec, ProcessDevice, ThreadDevice, load_model
from worker.runtime.early import Early, serve_early
from worker.runtime.leases import Leases
from worker.runtime.verify import start_background_verify
from worker.runtime.warmup import freeze_startup_objects, measure_worst_batch_s
from worker.settings import WorkerSettings, env_name
from worker.transport.redis import release_held, set_take_room

log = logging.getLogger(__name__)

# A test seam: a callable that wraps the scoring pipeline (stack.faults.Faults); None in production.
PipelineWrapper = Callable[[Any], Any]

START_FAILURE_EXIT = 2  # a worker that cannot start exits with this (never 0, so supervisors restart it)


def exit_on_start_failure(e: BaseException) -> None:
    """End the process: one line on stderr naming why the worker cannot start, exit code 2."""
    what = str(e) if isinstance(e, Vela2Error) else f"{type(e).__name__}: {e}"
    if not isinstance(e, Vela2Error):
        log.critical("worker start-up failed", exc_info=e)
    sys.stderr.write(f"vela2 worker: cannot start: {what}\n")
    sys.stderr.flush()
    logging.shutdown()
    os._exit(START_FAILURE_EXIT)


@dataclass
class Loaded:
    """The model where it runs: `model` (or its files, when it lives in the device process), the
    device runner, the pipeline, the warm worst batch in seconds, the CPU processes (or None)."""

    model: Any
    device: Any
    pipeline: Any
    worst_s: float
    cpu: CpuProcesses | None


def build_engine(settings: WorkerSettings, on_stored: Callable[[list[Any]], None] | None = None,
                 pipeline_wrapper: PipelineWrapper | None = None, early: Early | None = None,
                 on_checkpoint_changed: Callable[[], None] | None = None) -> Engine:
    """Load the model once (in the device process, or here), measure the worst batch, check the
    visibility timeout, start the engine. `on_stored` sees every batch of stored results (Celery
    task events, worker.app); `pipeline_wrapper` wraps the scoring pipeline (tests' faults); `early`
    the metrics and health served since launch (worker.runtime.early), told each stage and taken over;
    `on_checkpoint_changed` is called if the background check finds the weights differ from the
    checkpoint's manifest (after the engine closed its intake: worker.app shuts the worker down)."""
    early = early or serve_early(settings) or Early(Metrics(row_tokens=settings.engine.row_tokens),
                                                     Health(settings.model_name or ""))
    early.health.begin("checking the settings and Redis")
    preflight(settings)
    use_compile_cache(settings.compile_cache_dir)
    # torch releases the GIL around every op it dispatches and takes it back after; with the
    # consumer, engine and reader threads busy, each retake waits up to the switch interval, and a
    # batch launches a thousand or more (bench/results/gpu-hotpath.json: the variant at 5 ms)
    sys.setswitchinterval(settings.switch_interval_ms / 1e3)
    if not settings.checkpoint:
        raise ConfigError(f"no checkpoint: pass --checkpoint or set {env_name('checkpoint')}")
    # the checkpoint's identity, from its manifest (checked cheaply; the bytes are verified in the
    # background once serving) or hashed here, and handed to each process
    early.health.begin("checking the checkpoint's manifest")
    identity = manifest.identify(settings.checkpoint, random_weights=bool(settings.random_weights))
    digest = identity.digest
    early.health.model, early.health.digest = settings.resolved_model_name(), digest
    check_mixed(redis_client(settings.redis_url), settings.resolved_model_name(), digest,
                bool(settings.allow_mixed))
    loaded = load(settings, settings.checkpoint, digest, pipeline_wrapper, early.health.begin)
    # Results, attempt counters, dead letters and heartbeats (read by `vela2 http`) live in the result
    # store, whatever the broker. The Redis-only machinery is chosen here, in one place: on a Redis
    # broker the held records (kombu's unacked index, written by vela2.wire.taking) are renewed by the
    # leases, released in bulk after the acks, and a message comes back after the visibility timeout,
    # so the timeout must outlast a batch. RabbitMQ holds no such records: it redelivers a message
    # when the channel that took it closes (a killed worker's connection drops), however long it was
    # held, so there is nothing to renew, release or check.
    broker: Any = None
    if not keys.is_amqp_url(settings.resolved_broker_url):
        check_visibility(settings.visibility_timeout_s, settings.engine.max_wait_ms, loaded.worst_s)
        broker = redis_client(settings.resolved_broker_url)
    engine = _assemble(settings, digest, loaded, broker, on_stored, early)
    _log_ready(settings, loaded)
    if identity.manifest is not None and settings.verify_mb_s > 0:
        start_background_verify(settings.checkpoint, identity.manifest, settings.verify_mb_s,
                                partial(_checkpoint_changed, early.health, engine, on_checkpoint_changed))
    return engine


def _checkpoint_changed(health: Health, engine: Engine, then: Callable[[], None] | None, problem: str) -> None:
    health.fault = f"checkpoint files differ from manifest.json: {problem}"
    engine.close_intake()
    if then is not None:
        then()


def use_compile_cache(path: str | None) -> None:
    """Point torch.compile's inductor (FX graph and AOT autograd caches on) and Triton caches at
    `path`/inductor and `path`/triton, before anything compiles and before the device process is
    spawned (it inherits them): on a volume that outlives the container a restarted worker loads
    its compiled kernels instead of compiling them again. ConfigError if it cannot be written."""
    if not path:
        return
    root = Path(path)
    try:
        for sub in ("inductor", "triton"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        probe = root / "inductor" / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"compile_cache_dir {path}: cannot write there ({e.strerror or e})") from e
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(root / "triton")
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")


def load(settings: WorkerSettings, checkpoint_dir: str, digest: str,
         pipeline_wrapper: PipelineWrapper | None, stage: Callable[..., None] = lambda *_: None) -> Loaded:
    """Launch the device process first (its load is the longest step), then import the model stack
    here and start the CPU processes while it loads; load the model of `checkpoint_dir` where it
    runs and measure its worst batch; `stage` hears each step (Health.begin)."""
    engine_settings = settings.engine_settings()
    row_tokens = engine_settings.row_tokens or None
    spec = ModelSpec(checkpoint_dir, settings.resolved_model_name(), settings.device, settings.resolved_dtype,
                     settings.resolved_precision, settings.attn, bool(settings.random_weights), digest,
                     bool(settings.batch_invariant))
    worst_batch = partial(measure_worst_batch_s, settings=engine_settings)
    device: Any = None
    if settings.resolved_device_process():
        # the model lives in the device process; this one renders / decodes with its files only
        device = ProcessDevice(spec, row_tokens, worst_batch, pipeline_wrapper)
        device.launch()
    stage("loading the model")
    import vela2.scoring.pipeline

    cpu = None
    if settings.resolved_cpu_processes():
        cpu = CpuProcesses(checkpoint_dir, settings.resolved_model_name(), settings.resolved_cpu_processes(),
                           digest, settings.resolved_precision, spec.batch_invariant)
        cpu.start()
    pipeline = pipeline_wrapper(vela2.scoring.pipeline) if pipeline_wrapper else vela2.scoring.pipeline
    if device is not None:
        device.wait_ready(stage)
        return Loaded(ModelFiles(spec.checkpoint, spec.model_name, digest, spec.batch_invariant), device, pipeline,
                      device.worst_s, cpu)
    model = load_model(spec, stage)
    device = ThreadDevice(pipeline, model, settings.resolved_precision, row_tokens)
    stage(WARMING_UP)
    return Loaded(model, device, pipeline, worst_batch(model, pipeline=pipeline), cpu)


def _assemble(settings: WorkerSettings, digest: str, loaded: Loaded, broker: Any,
              on_stored: Callable[[list[Any]], None] | None, early: Early) -> Engine:
    """The engine with its store, metrics, health, leases and tracing; started, and said ready."""
    model, device = loaded.model, loaded.device
    client = redis_client(settings.redis_url)
    metrics, health = early.metrics, early.health
    health.begin("starting the engine")
    metrics.describe_worker(model=model.name, device=settings.device, precision=settings.resolved_precision,
                            redis=broker, queues=keys.queues(model.name), amqp_url=None if broker is not None
                            else settings.resolved_broker_url, store=client,
                            gpu_memory_source=(lambda: device.memory) if isinstance(device, ProcessDevice) else None)
    health.model, health.digest = model.name, digest  # the endpoints are served since build_engine began
    # its Celery node name (worker.app sets it), as Flower and `vela2 status` name it; host:pid:device outside Celery
    worker_id = settings.hostname or f"{socket.gethostname()}:{os.getpid()}:{settings.device}"
    describe = Description(worker_id, model.name, settings.device, settings.resolved_precision, digest,
                           lambda: engine, metrics)
    leases = Leases(broker, settings.visibility_timeout_s, progress=lambda: engine.progress,
                    heartbeat=(model.name, worker_id), beats=redis_client(settings.redis_url),
                    describe=describe, shares=lambda weights: setattr(engine.scheduler.buckets, "weights", weights))
    traced = WorkerTracing(model.name, digest) if tracing.configure("vela2-worker") else None
    store = ResultStore(client, ttl_s=settings.result_expires_s, online_ttl_s=settings.online_result_expires_s)
    engine = Engine(model, store, settings.engine_settings(),
                    pipeline=loaded.pipeline, metrics=metrics, on_stored=on_stored, leases=leases,
                    release_held=partial(release_held, broker) if broker is not None else None,
                    cpu=loaded.cpu, device=device, tracing=traced,
                    cost_seed=[(settings.engine.max_batch_tokens, loaded.worst_s)])
    health.stalled, health.beat_error = leases.stalled, lambda: leases.beat_error
    health.stopping = lambda: engine.stopping
    set_take_room(engine.take_room)
    freeze_startup_objects()
    engine.start()
    leases.start()
    health.serving = True
    return engine


def _log_ready(settings: WorkerSettings, loaded: Loaded) -> None:
    cpu = loaded.cpu
    log.info(
        "vela2 engine ready: model %s on %s (%s), max_batch_tokens %d, max_wait_ms %g, worst batch %.3f s, "
        "visibility timeout %g s, max_buffered %d, render / decode in %s, the model in a %s, queues %s",
        loaded.model.name,
        settings.device,
        settings.resolved_precision,
        settings.engine.max_batch_tokens,
        settings.engine.max_wait_ms,
        loaded.worst_s,
        settings.visibility_timeout_s,
        settings.max_buffered,
        f"{cpu.n} processes" if cpu else f"{settings.engine.render_threads} threads",
        "process of its own" if settings.resolved_device_process() else "thread",
        ", ".join(keys.queues(loaded.model.name)),
    )


class Description:
    """The worker's description written with every heartbeat (vela2.wire.fleet; `vela2 status`)."""

    def __init__(self, worker_id: str, model: str, device: str, precision: str, digest: str,
                 engine: Callable[[], Any], metrics: Metrics):
        self.fixed = {"worker": worker_id, "model": model, "device": device, "precision": precision,
                      "digest": digest, "host": socket.gethostname(), "pid": os.getpid(), "started_at": time.time()}
        self.engine, self.metrics = engine, metrics
        self._last: tuple[float, int] | None = None  # (monotonic, batches) at the previous beat

    def __call__(self) -> dict[str, Any]:
        engine = self.engine()
        stats, now = engine.stats, time.monotonic()
        rate = None
        if self._last is not None and now > self._last[0]:
            rate = round((stats.batches - self._last[1]) / (now - self._last[0]), 3)
        self._last = (now, stats.batches)
        return {**self.fixed, "batches": stats.batches, "batches_per_s": rate, "held": engine.held,
                "answered": dict(stats.results), "dead_lettered": stats.dead_lettered,
                "failures": self.metrics.failure_counts()}
