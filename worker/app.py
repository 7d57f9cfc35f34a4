"""Celery wiring only: the app, its settings, the task whose messages go to the engine, the bootstep.

    celery -A worker.app worker                 # settings from VELA2_* environment variables
    vela2 worker --checkpoint DIR ...           # the CLI builds WorkerSettings and calls run_worker()

Redis is broker and result backend. JSON only. One queue per model (`vela2.<model>`) drained
before its backfill queue (`vela2.<model>.backfill`): kombu's `queue_order_strategy=priority`
BRPOPs the queues in the listed order. Pool solo, one process per device: the `vela2.score`
task's Strategy hands every message to the engine (worker.engine) instead of the pool, and the
engine acks a message only after all its results are stored. The prefetch count (max_buffered)
bounds what the engine holds; at start the worker measures its worst batch and refuses to run
when the visibility timeout could expire on a message it still holds.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

from celery import Celery, Task, bootsteps
from kombu import Queue
from kombu.transport import redis as kombu_redis

from vela2.config import Vela2Config
from vela2.errors import ConfigError, Vela2Error
from worker import keys
from worker.engine import (
    Delivery,
    Engine,
    EngineSettings,
    buffered_batches,
    check_visibility,
    measure_worst_batch_s,
)
from worker.metrics import Metrics
from worker.results import DEFAULT_RESULT_EXPIRES_S, ResultStore

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16")

# Setting -> environment variable; `celery -A worker.app worker` reads only these.
ENV = {
    "redis_url": "VELA2_REDIS_URL",
    "checkpoint": "VELA2_CHECKPOINT",
    "device": "VELA2_DEVICE",
    "precision": "VELA2_PRECISION",
    "dtype": "VELA2_DTYPE",
    "max_batch_tokens": "VELA2_MAX_BATCH_TOKENS",
    "max_wait_ms": "VELA2_MAX_WAIT_MS",
    "visibility_timeout_s": "VELA2_VISIBILITY_TIMEOUT_S",
    "max_buffered": "VELA2_MAX_BUFFERED",
    "render_threads": "VELA2_RENDER_THREADS",
    "result_expires_s": "VELA2_RESULT_EXPIRES_S",
    "shutdown_timeout_s": "VELA2_SHUTDOWN_TIMEOUT_S",
    "metrics_port": "VELA2_METRICS_PORT",
    "model_name": "VELA2_MODEL",
    "row_tokens": "VELA2_ROW_TOKENS",
    "attn": "VELA2_ATTN",
    "random_weights": "VELA2_RANDOM_WEIGHTS",
    "max_attempts": "VELA2_MAX_ATTEMPTS",
    "task_events": "VELA2_TASK_EVENTS",
}


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker process needs; `from_env()` reads the VELA2_* variables."""

    redis_url: str = "redis://127.0.0.1:6379/0"  # broker and result backend
    checkpoint: str | None = None  # checkpoint directory (required to run)
    device: str = "cpu"  # "cuda:0", "cpu", ...: one worker process per device
    precision: str | None = None  # "fp32" | "bf16"; None: bf16 on CUDA, fp32 elsewhere
    dtype: str | None = None  # backbone dtype "float32" | "bfloat16"; None: bfloat16 for bf16, else float32
    max_batch_tokens: int = 16_384  # padded tokens (longest x count) per device batch
    max_wait_ms: float = 20.0  # a request waits at most this long for its bucket to fill
    visibility_timeout_s: float = 3600.0  # unacked messages return to the queue after this long
    max_buffered: int = 256  # messages held by the worker at once (the broker prefetch count)
    render_threads: int = 2  # CPU threads that render rows ahead of the device and decode results
    result_expires_s: int = DEFAULT_RESULT_EXPIRES_S  # TTL of stored results
    shutdown_timeout_s: float = 60.0  # warm shutdown: finish what is held within this, return the rest
    metrics_port: int = 0  # Prometheus port; 0: no HTTP endpoint
    model_name: str | None = None  # queue naming; None: the checkpoint's config.json name
    row_tokens: int = 0  # pack several short sequences per row of this many tokens; 0: one per row
    attn: str = "sdpa"  # attention backend: sdpa (dense tree mask) | flex (block-sparse, compiled)
    random_weights: int = 0  # 1: seeded random weights instead of the stored ones (benchmarks only)
    max_attempts: int = 3  # deliveries a request may crash a worker in before it is dead-lettered
    task_events: int = 0  # 1: send Celery task events for Flower (also on with `celery worker -E`)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> WorkerSettings:
        """Settings from VELA2_* variables, then `overrides` that are not None (CLI flags)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        types = {f.name: f.type for f in fields(cls)}
        for name, var in ENV.items():
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            kind = types[name]
            try:
                values[name] = int(raw) if kind == "int" else float(raw) if kind == "float" else raw
            except ValueError:
                raise ConfigError(f"{var} must be a number; got {raw!r}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def resolved_precision(self) -> str:
        return self.precision or ("bf16" if self.device.startswith("cuda") else "fp32")

    @property
    def resolved_dtype(self) -> str:
        if self.dtype:
            return self.dtype
        # the same rule as every other serving path (vela2.checkpoint.serving_dtype)
        return "bfloat16" if self.resolved_precision == "bf16" else "float32"

    def resolved_model_name(self) -> str:
        """The model name the queues are named after (reads the checkpoint's config.json)."""
        if self.model_name:
            return self.model_name
        if not self.checkpoint:
            raise ConfigError(f"no checkpoint: pass --checkpoint or set {ENV['checkpoint']}")
        return Vela2Config.read(self.checkpoint).name

    def validate(self) -> None:
        """Raise ConfigError naming the first inconsistent setting."""
        if self.resolved_precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}; got {self.precision!r}")
        if self.resolved_dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"dtype must be float32 or bfloat16; got {self.dtype!r}")
        for name in ("max_batch_tokens", "max_buffered", "render_threads", "result_expires_s", "max_attempts"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1; got {getattr(self, name)}")
        for name in ("max_wait_ms", "shutdown_timeout_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0; got {getattr(self, name)}")
        if self.visibility_timeout_s <= 0:
            raise ConfigError(f"visibility_timeout_s must be > 0; got {self.visibility_timeout_s}")

    def transport_options(self) -> dict[str, Any]:
        """kombu Redis transport options: priority queue order, visibility timeout, and a restore
        sweep often enough that a dead worker's messages come back soon after the timeout."""
        return {
            "visibility_timeout": self.visibility_timeout_s,
            "queue_order_strategy": "priority",
            "unacked_restore_interval": max(1, min(10, int(self.visibility_timeout_s // 10))),
            "unacked_restore_throttle": 1,
        }


class _TolerantChannel(kombu_redis.Channel):
    """kombu's Redis channel, except that a queue item which is no kombu message (not JSON, or JSON
    without the envelope) is logged and dropped: kombu would raise out of the event loop and stop
    the whole worker, so one bad LPUSH could take down every worker in turn."""

    def _brpop_read(self, **options: Any) -> Any:
        try:
            return super()._brpop_read(**options)
        except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
            log.error("dropped a queue item that is not a Celery message: %s: %s", type(e).__name__, e)
            return True


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport with the tolerant channel (used for redis:// broker URLs)."""

    Channel = _TolerantChannel


def _score(self: Task, *args: Any, **kwargs: Any) -> None:
    raise NotImplementedError(f"{keys.TASK_NAME} runs inside the vela2 worker engine only (celery -A worker.app)")


class ScoreTask(Task):
    """`vela2.score`: its Strategy hands each message to the engine instead of the pool."""

    typing = False
    acks_late = True  # the engine acks, and only after the message's results are stored

    def Strategy(self, task: Task, app: Celery, consumer: Any) -> Any:  # noqa: N802 (Celery's name)
        errors = consumer.connection_errors

        def on_message(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kwargs: Any) -> None:
            # `ack` / `reject` schedule message.ack / reject on the consumer's event loop (thread-safe),
            # so the engine thread may call them.
            delivery = Delivery(
                headers=dict(message.headers or {}),
                body=message.body if isinstance(message.body, bytes) else str(message.body).encode(),
                content_type=message.content_type,
                ack=partial(ack, log, errors),
                reject=lambda requeue: reject(log, errors, requeue=requeue),
                redelivered=bool((message.delivery_info or {}).get("redelivered")),
                backfill=str((message.delivery_info or {}).get("routing_key", "")).endswith(keys.BACKFILL_SUFFIX),
            )
            engine = getattr(app, "vela2_engine", None)
            if engine is None:
                delivery.reject(True)
                return
            engine.submit(delivery)

        return on_message


class TaskEvents:
    """Celery task events (task-received / task-started / task-succeeded / task-failed) for every
    stored result, so Flower and `celery events` see the requests the engine answers (our Strategy
    bypasses Celery's own request objects, which would send them). Sent from the engine thread on a
    dispatcher that thread owns."""

    def __init__(self, app: Celery, hostname: str):
        self.app = app
        self.hostname = hostname
        self._dispatcher: Any = None

    def __call__(self, stored: list[tuple[str, str, dict[str, Any]]]) -> None:
        if self._dispatcher is None:
            self._dispatcher = self.app.events.Dispatcher(self.app.connection_for_write(), hostname=self.hostname,
                                                          enabled=True)
        send = self._dispatcher.send
        for rid, status, meta in stored:
            answer = meta.get("vela2") or {}
            timings = answer.get("timings") or {}
            send("task-received", uuid=rid, name=keys.TASK_NAME, args="", kwargs="", retries=0, eta=None,
                 root_id=rid, parent_id=None)
            send("task-started", uuid=rid)
            if status == "error":
                err = answer.get("error") or {}
                send("task-failed", uuid=rid, exception=f"{err.get('type')}: {err.get('message')}", traceback="")
            else:
                send("task-succeeded", uuid=rid, result=status,
                     runtime=round(sum(v for k, v in timings.items() if k != "queue_ms") / 1e3, 6))


def build_engine(settings: WorkerSettings, app: Celery | None = None, hostname: str = "vela2") -> Engine:
    """Load the model once, measure the worst batch, check the visibility timeout, start the engine.
    With `app`, Celery task events are sent for every stored result (Flower, `celery events`)."""
    import redis
    import torch

    import vela2

    settings.validate()
    if not settings.checkpoint:
        raise ConfigError(f"no checkpoint: pass --checkpoint or set {ENV['checkpoint']}")
    model = vela2.load(settings.checkpoint, device=settings.device, dtype=getattr(torch, settings.resolved_dtype),
                       random_weights=bool(settings.random_weights))
    if settings.attn != "sdpa":
        model.set_attention(settings.attn)
    model.check_precision(settings.resolved_precision)
    if model.name != settings.resolved_model_name():
        raise ConfigError(f"checkpoint model {model.name!r} does not match the queue model {settings.model_name!r}")
    engine_settings = EngineSettings(
        max_batch_tokens=settings.max_batch_tokens,
        max_wait_ms=settings.max_wait_ms,
        precision=settings.resolved_precision,
        render_threads=settings.render_threads,
        row_tokens=settings.row_tokens,
        max_attempts=settings.max_attempts,
    )
    worst_s = measure_worst_batch_s(model, engine_settings)
    batches = buffered_batches(settings.max_buffered, model.config.max_window_tokens, settings.max_batch_tokens)
    check_visibility(settings.visibility_timeout_s, settings.max_wait_ms, batches, worst_s)
    client = redis.Redis.from_url(settings.redis_url)
    store = ResultStore(client, settings.result_expires_s)
    metrics = Metrics(row_tokens=settings.row_tokens)
    metrics.describe_worker(model=model.name, device=settings.device, precision=settings.resolved_precision,
                            redis=client, queues=keys.queues(model.name))
    if settings.metrics_port:
        metrics.serve(settings.metrics_port)
    events = TaskEvents(app, hostname) if app is not None else None
    engine = Engine(model, store, engine_settings, metrics=metrics, on_stored=events)
    engine.start()
    log.info(
        "vela2 engine ready: model %s on %s (%s), max_batch_tokens %d, max_wait_ms %g, worst batch %.3f s, "
        "visibility timeout %g s, max_buffered %d, queues %s",
        model.name,
        settings.device,
        settings.resolved_precision,
        settings.max_batch_tokens,
        settings.max_wait_ms,
        worst_s,
        settings.visibility_timeout_s,
        settings.max_buffered,
        ", ".join(keys.queues(model.name)),
    )
    return engine


class EngineStep(bootsteps.StartStopStep):
    """Worker bootstep: builds the engine before the consumer starts, drains it at warm shutdown
    (before the event loop's hub closes, so the acks it schedules still run)."""

    requires = ("celery.worker.components:Pool",)
    label = "vela2 engine"

    def __init__(self, w: Any, **kwargs: Any) -> None:
        super().__init__(w, **kwargs)
        self.engine: Engine | None = None

    def create(self, w: Any) -> None:
        return None

    def start(self, w: Any) -> None:
        settings: WorkerSettings = w.app.vela2_settings
        # w.task_events: `celery worker -E` or worker_send_task_events (VELA2_TASK_EVENTS=1)
        self.engine = build_engine(settings, w.app if getattr(w, "task_events", False) else None, w.hostname)
        w.app.vela2_engine = self.engine

    def stop(self, w: Any) -> None:
        if self.engine is not None:
            self.engine.stop(w.app.vela2_settings.shutdown_timeout_s)
            self.engine = None

    def terminate(self, w: Any) -> None:
        if self.engine is not None:
            self.engine.stop(0.0)
            self.engine = None


def create_app(settings: WorkerSettings | None = None) -> Celery:
    """The Celery app of a worker with these settings (from the environment when None)."""
    settings = settings or WorkerSettings.from_env()
    app = Celery("vela2", broker=settings.redis_url, backend=settings.redis_url, set_as_current=False)
    try:
        model_name: str | None = settings.resolved_model_name()
    except Vela2Error as e:  # no checkpoint yet: fine for inspecting; the worker refuses to start
        log.debug("no model name yet: %s", e)
        model_name = None
    queues = keys.queues(model_name) if model_name else []
    if settings.redis_url.startswith("redis://"):
        app.conf.broker_transport = f"{__name__}:RedisTransport"
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_pool="solo",
        worker_concurrency=1,
        worker_prefetch_multiplier=settings.max_buffered,
        broker_transport_options=settings.transport_options(),
        broker_connection_retry_on_startup=True,
        result_expires=settings.result_expires_s,
        worker_send_task_events=bool(settings.task_events),
        task_queues=[Queue(q, routing_key=q) for q in queues] or None,
        task_default_queue=queues[0] if queues else "celery",
        task_create_missing_queues=True,
    )
    app.vela2_settings = settings
    app.vela2_engine = None
    app.task(name=keys.TASK_NAME, base=ScoreTask, bind=True)(_score)
    app.steps["worker"].add(EngineStep)
    return app


def run_worker(settings: WorkerSettings, *, loglevel: str = "INFO", hostname: str | None = None) -> int:
    """Run a worker in this process until it is shut down (SIGTERM: warm); returns the exit code.

    What `vela2 worker` calls: `run_worker(WorkerSettings.from_env(checkpoint=..., device=..., ...))`.
    """
    settings.validate()
    app = create_app(settings)
    node = hostname or f"vela2-{settings.device.replace(':', '')}@%h"
    argv = [
        "worker",
        "--pool",
        "solo",
        "--concurrency",
        "1",
        "--loglevel",
        loglevel,
        "--without-mingle",
        "--without-gossip",
        "--hostname",
        node,
    ]
    try:
        app.worker_main(argv)
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return 0


app = create_app()

if __name__ == "__main__":
    sys.exit(run_worker(WorkerSettings.from_env()))
