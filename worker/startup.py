"""Worker start-up: load the model, measure the worst batch, check the visibility timeout against
it, start the engine and its visibility leases.

The visibility rule: kombu's Redis transport hands an unacked message to another worker once its
delivery is older than the visibility timeout. The worker renews the delivery of every message it
holds while its engine makes progress (worker.leases: every quarter of the timeout), so a message
held behind a deep buffer or a request of thousands of windows is never handed out twice; the
engine counts as stalled (and stops renewing) after a whole timeout without a turn or a batch. So
one batch must fit in the timeout with room to spare: the worker measures its worst batch (a full
`max_batch_tokens` of its longest windows) at start and refuses a visibility timeout shorter than
max(MIN_VISIBILITY_S, max_wait + 4 x worst batch).
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from kombu.utils.url import maybe_sanitize_url

from vela2 import checkpoint
from vela2.errors import ConfigError, Vela2Error
from vela2.redis_url import SENTINEL_PASSWORD_PARAM, mask_url, warn_if_password_in_argv
from vela2.wire import fleet, keys, taking, tracing
from vela2.wire.connections import redis_client
from vela2.wire.results import ResultStore
from worker import faults
from worker.broker import release_held
from worker.cpu_procs import CpuProcesses, ModelFiles
from worker.device import ModelSpec, ProcessDevice, ThreadDevice, load_model
from worker.engine import Engine
from worker.faults import WARMUP_ID
from worker.health import Health
from worker.leases import Leases
from worker.metrics import Metrics
from worker.settings import EngineSettings, WorkerSettings, env_name
from worker.tracing import WorkerTracing

log = logging.getLogger(__name__)


START_FAILURE_EXIT = 2  # a worker that cannot start exits with this (never 0, so supervisors restart it)
_AUTH_TRIES = 3  # a refused password is tried this often (a rotation in progress), then it is final


def exit_on_start_failure(e: BaseException) -> None:
    """End the process: one line on stderr naming why the worker cannot start, exit code 2."""
    what = str(e) if isinstance(e, Vela2Error) else f"{type(e).__name__}: {e}"
    if not isinstance(e, Vela2Error):
        log.critical("worker start-up failed", exc_info=e)
    sys.stderr.write(f"vela2 worker: cannot start: {what}\n")
    sys.stderr.flush()
    logging.shutdown()
    os._exit(START_FAILURE_EXIT)


def preflight(settings: WorkerSettings) -> None:
    """What can be checked before Celery starts, so `vela2 worker` fails fast with one clear line:
    the settings (URL schemes included), the checkpoint's config, and the result store and the broker
    (each reachable within redis_wait_s, and the password accepted); warns when a password sits in
    argv. Raises ConfigError / CheckpointError."""
    warn_if_password_in_argv(sys.argv[1:], log)
    settings.validate()
    settings.resolved_model_name()  # reads the checkpoint's config.json
    check_redis(settings.redis_url, settings.redis_wait_s, "result store", replicas=settings.engine.wait_replicas)
    if keys.is_amqp_url(settings.resolved_broker_url):
        check_amqp(settings.resolved_broker_url, settings.redis_wait_s)
    elif settings.resolved_broker_url != settings.redis_url:
        check_redis(settings.resolved_broker_url, settings.redis_wait_s, "broker")


def check_amqp(url: str, wait_s: float) -> None:
    """Connect to RabbitMQ at `url`: wait up to `wait_s` for it to answer, but fail at once when it
    refuses the credentials or the vhost (ConfigError naming the URL, password masked)."""
    import amqp.exceptions
    from kombu import Connection

    where = f"RabbitMQ at {maybe_sanitize_url(url)} (broker)"
    deadline = time.monotonic() + wait_s
    last_log = 0.0
    while True:
        conn = Connection(url, connect_timeout=2)
        try:
            conn.connect()
            return
        except (amqp.exceptions.AccessRefused, amqp.exceptions.NotAllowed) as e:
            raise ConfigError(f"{where} refuses the credentials or the vhost: {e}") from None
        except (OSError, amqp.exceptions.AMQPError) as e:  # refused, reset, timed out: not up yet
            if time.monotonic() >= deadline:
                raise ConfigError(f"{where} did not answer within {wait_s:g} s (redis_wait_s): {e}") from None
            if time.monotonic() - last_log >= 10:
                last_log = time.monotonic()
                log.warning("waiting for %s: %s", where, e)
        finally:
            conn.release()
        time.sleep(0.3)


def check_redis(url: str, wait_s: float, role: str = "result store", replicas: int = 0) -> None:
    """PING the Redis that serves as `role` (named in every error, with its URL): wait up to `wait_s`
    for it to answer (it may start after the worker), but fail at once (after a few quick tries) when
    it refuses the credentials, and when it is older than the queues need (vela2.wire.taking.MIN_REDIS_VERSION).
    `replicas` (settings.wait_replicas): also wait, within the same `wait_s`, until that many replicas
    are connected to it, else fail: a worker that acks only once N replicas hold its results would
    otherwise score, store and never ack."""
    import redis
    from redis.sentinel import MasterNotFoundError

    client = redis_client(url, socket_connect_timeout=2, socket_timeout=5)
    deadline = time.monotonic() + wait_s
    where = f"Redis at {mask_url(url)} ({role})"
    auth_tries = 0
    last_log = 0.0
    try:
        while True:
            try:
                client.ping()
                try:
                    version = str(client.info("server").get("redis_version", ""))
                except redis.exceptions.ResponseError:  # a Redis-compatible server without INFO
                    version = ""
                problem = taking.version_problem(version)
                if problem:
                    raise ConfigError(f"{problem} (at {mask_url(url)}, {role})")
                have = _online_replicas(client) if replicas else 0
                if have >= replicas:
                    return
                if time.monotonic() >= deadline:
                    raise ConfigError(f"{where} has {have} replicas connected, and wait_replicas is {replicas}: "
                                      f"none of its results could be acked (waited {wait_s:g} s, redis_wait_s)")
                if time.monotonic() - last_log >= 10:
                    last_log = time.monotonic()
                    log.warning("waiting for %d replicas of the %s Redis at %s (wait_replicas): %d connected",
                                replicas, role, mask_url(url), have)
            except (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError,
                    redis.exceptions.NoPermissionError) as e:
                auth_tries += 1
                if auth_tries >= _AUTH_TRIES:
                    raise ConfigError(f"{where} refuses the credentials: {e}") from None
            except redis.exceptions.ResponseError as e:
                if "NOAUTH" in str(e) or "WRONGPASS" in str(e):
                    raise ConfigError(f"{where} refuses the credentials: {e}") from None
                raise ConfigError(f"{where} answers PING with an error: {e}") from None
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                    redis.exceptions.BusyLoadingError) as e:
                # sentinel://: no sentinel named the master, because they want a password (of their own)
                if isinstance(e, MasterNotFoundError) and any(
                        mark in str(e) for mark in ("AuthenticationError", "NOAUTH", "WRONGPASS")):
                    auth_tries += 1
                    if auth_tries >= _AUTH_TRIES:
                        raise ConfigError(f"{where}: the sentinels refuse the credentials (a password of "
                                          f"their own goes in the URL as &{SENTINEL_PASSWORD_PARAM}=PW)") from None
                elif time.monotonic() >= deadline:
                    raise ConfigError(f"{where} did not answer within {wait_s:g} s "
                                      f"(redis_wait_s): {e}") from None
                elif time.monotonic() - last_log >= 10:
                    last_log = time.monotonic()
                    log.warning("waiting for the %s Redis at %s: %s", role, mask_url(url), e)
            time.sleep(0.3)
    finally:
        client.close()


def _online_replicas(client: Any) -> int:
    """How many replicas are connected to the Redis of `client` and online (INFO replication's
    slaveN lines, `state=online`); 0 where INFO is refused."""
    import redis

    try:
        info = client.info("replication")
    except redis.exceptions.ResponseError:
        return 0
    return sum(1 for k, v in info.items()
               if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online")


def build_engine(settings: WorkerSettings, on_stored: Callable[[list[Any]], None] | None = None) -> Engine:
    """Load the model once (in the device process, or here), measure the worst batch, check the
    visibility timeout, start the engine. `on_stored` sees every batch of stored results (Celery
    task events, worker.app)."""
    import vela2.pipeline

    preflight(settings)
    # torch releases the GIL around every op it dispatches and takes it back after; with the
    # consumer, engine and reader threads busy, each retake waits up to the switch interval, and a
    # batch launches a thousand or more (bench/results/gpu-hotpath.json: the variant at 5 ms)
    sys.setswitchinterval(settings.switch_interval_ms / 1e3)
    if not settings.checkpoint:
        raise ConfigError(f"no checkpoint: pass --checkpoint or set {env_name('checkpoint')}")
    # the checkpoint's identity, hashed once here (every weight byte) and handed to each process
    digest = checkpoint.digest(settings.checkpoint, random_weights=bool(settings.random_weights))
    check_mixed(redis_client(settings.redis_url), settings.resolved_model_name(), digest,
                bool(settings.allow_mixed))
    cpu = None
    if settings.resolved_cpu_processes():  # spawned first: they load while the model does
        cpu = CpuProcesses(settings.checkpoint, settings.resolved_model_name(), settings.resolved_cpu_processes(),
                           digest, settings.resolved_precision)
        cpu.start()
    engine_settings = settings.engine_settings()
    spec = ModelSpec(str(settings.checkpoint), settings.resolved_model_name(), settings.device, settings.resolved_dtype,
                     settings.resolved_precision, settings.attn, bool(settings.random_weights), digest)
    pipeline = faults.wrap(vela2.pipeline)
    worst_batch = partial(measure_worst_batch_s, settings=engine_settings)
    if settings.resolved_device_process():
        # the model lives in the device process; this one renders / decodes with its files only
        device: Any = ProcessDevice(spec, engine_settings.row_tokens or None, worst_batch)
        device.start()
        model: Any = ModelFiles(spec.checkpoint, spec.model_name, digest)
        worst_s = device.worst_s
    else:
        model = load_model(spec)
        device = ThreadDevice(pipeline, model, settings.resolved_precision, engine_settings.row_tokens or None)
        worst_s = worst_batch(model, pipeline=pipeline)
    client = redis_client(settings.redis_url)
    store = ResultStore(client, settings.result_expires_s)
    # Results, attempt counters, dead letters and heartbeats (read by `vela2 http`) live in the result
    # store, whatever the broker. The Redis-only machinery is chosen here, in one place: on a Redis
    # broker the held records (kombu's unacked index, written by vela2.wire.taking) are renewed by the
    # leases, released in bulk after the acks, and a message comes back after the visibility timeout,
    # so the timeout must outlast a batch. RabbitMQ holds no such records: it redelivers a message
    # when the channel that took it closes (a killed worker's connection drops), however long it was
    # held, so there is nothing to renew, release or check.
    broker: Any = None
    if not keys.is_amqp_url(settings.resolved_broker_url):
        check_visibility(settings.visibility_timeout_s, settings.engine.max_wait_ms, worst_s)
        broker = redis_client(settings.resolved_broker_url)
    metrics = Metrics(row_tokens=settings.engine.row_tokens)
    metrics.describe_worker(model=model.name, device=settings.device, precision=settings.resolved_precision,
                            redis=broker, queues=keys.queues(model.name), amqp_url=None if broker is not None
                            else settings.resolved_broker_url, store=client,
                            gpu_memory_source=(lambda: device.memory) if isinstance(device, ProcessDevice) else None)
    health = Health(model.name, digest)
    if settings.metrics_port:
        metrics.serve(settings.metrics_port, settings.metrics_host, health)
    worker_id = f"{socket.gethostname()}:{os.getpid()}:{settings.device}"
    describe = Description(worker_id, model.name, settings.device, settings.resolved_precision, digest,
                           lambda: engine, metrics)
    leases = Leases(broker, settings.visibility_timeout_s, progress=lambda: engine.progress,
                    heartbeat=(model.name, worker_id), beats=redis_client(settings.redis_url),
                    describe=describe)
    traced = WorkerTracing(model.name, digest) if tracing.configure("vela2-worker") else None
    engine = Engine(model, store, engine_settings, pipeline=pipeline, metrics=metrics, on_stored=on_stored,
                    leases=leases, release_held=partial(release_held, broker) if broker is not None else None,
                    cpu=cpu, device=device, tracing=traced)
    health.stalled, health.beat_error = leases.stalled, lambda: leases.beat_error
    health.stopping = lambda: engine.stopping
    freeze_startup_objects()
    engine.start()
    leases.start()
    health.serving = True
    log.info(
        "vela2 engine ready: model %s on %s (%s), max_batch_tokens %d, max_wait_ms %g, worst batch %.3f s, "
        "visibility timeout %g s, max_buffered %d, render / decode in %s, the model in a %s, queues %s",
        model.name,
        settings.device,
        settings.resolved_precision,
        settings.engine.max_batch_tokens,
        settings.engine.max_wait_ms,
        worst_s,
        settings.visibility_timeout_s,
        settings.max_buffered,
        f"{cpu.n} processes" if cpu else f"{settings.engine.render_threads} threads",
        "process of its own" if settings.resolved_device_process() else "thread",
        ", ".join(keys.queues(model.name)),
    )
    return engine


def check_mixed(client: Any, model_name: str, digest: str, allow: bool) -> None:
    """Refuse to start (ConfigError) while another live worker serves `model_name` from a checkpoint
    with another digest: its answers and ours would differ under one name. `allow` (allow_mixed, a
    rolling upgrade): only a warning."""
    others = fleet.other_digests(client, model_name, digest)
    if not others:
        return
    listed = ", ".join(f"{w} ({d[:12]})" for w, d in sorted(others.items()))
    if allow:
        log.warning("serving %s from checkpoint %s beside live workers with other checkpoints: %s (allow_mixed)",
                    model_name, digest[:12], listed)
        return
    raise ConfigError(f"live workers serve {model_name} from other checkpoints: {listed}; this one is "
                      f"{digest[:12]}. Stop them, serve under another model name, or pass --allow-mixed 1 "
                      f"({env_name('allow_mixed')}=1) for a rolling upgrade")


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


# Allocations between two young collections while serving (Python's default is 700). Requests live
# for a second or so in a worker (buffered, rendered, batched, stored), so at 700 they outlived
# young collections by the thousand and their survivors set off full collections: on the H200
# host 15 of them, ~0.1 s each with the GIL held, in a 10 s phase of short rows (bench.hotpath's
# `worker_gc`). A young collection of this many objects takes a millisecond or two.
SERVING_GC_THRESHOLD = 20_000


def freeze_startup_objects() -> None:
    """Move everything start-up made (imports, the tokenizer, the model's Python objects) out of the
    garbage collector's reach, so a full collection walks only what serving allocates (without it
    each walked them all, ~0.2 s on the 2-core CPU machine), and collect the young generation every
    SERVING_GC_THRESHOLD allocations instead of every 700."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(SERVING_GC_THRESHOLD, *gc.get_threshold()[1:])


WARMUP_WORDS = (
    "Alice from Acme wrote to the support team about order 4471 and the refund was sent "
    "on Monday while the weather in the city stayed green and quiet"
).split()
WARMUP_TRAFFIC_BATCHES = 3  # full batches of short packed rows run at start-up on a GPU (below)


def warmup_row(max_window_tokens: int) -> dict[str, Any]:
    """A long synthetic row (choice + span blocks) whose windows fill `max_window_tokens`."""
    words = WARMUP_WORDS
    n = max_window_tokens * 2
    return {
        "id": WARMUP_ID,
        "task": "choice:warmup",
        "text": " ".join(words[i % len(words)] for i in range(n)),
        "questions": [
            {"question": "Is the customer satisfied?", "options": ["yes", "no"]},
            {"task": "span:warmup", "labels": ["person", "company"]},
        ],
    }


def measure_worst_batch_s(model: Any, settings: EngineSettings, pipeline: Any = None) -> float:
    """Run one batch at `max_batch_tokens` (copies of the longest window of `warmup_row`) twice;
    returns the second, warm time in seconds (the first pays one-off start-up costs)."""
    if pipeline is None:
        import vela2.pipeline as pipeline
    prep = pipeline.prepare(model, warmup_row(model.config.max_window_tokens))
    longest = max(prep.sequences, key=lambda s: s.num_tokens)
    batch = [longest] * max(1, settings.max_batch_tokens // longest.num_tokens)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        pipeline.run_batch(model, batch, settings.precision, settings.row_tokens or None)
        _synchronize(model)
        times.append(time.perf_counter() - t0)
    # and one short sequence alone: the first small batch would otherwise pay its own one-off costs
    # (kernel choices for small shapes; measured on an H200: 0.5-1.3 s for a first batch of a few rows)
    short = pipeline.prepare(model, {**warmup_row(model.config.max_window_tokens), "text": "Alice from Acme wrote"})
    pipeline.run_batch(model, short.sequences, settings.precision, settings.row_tokens or None)
    _synchronize(model)
    log.info(
        "warm-up batch: %d x %d tokens in %.3f s (first %.3f s)", len(batch), longest.num_tokens, times[1], times[0]
    )
    if getattr(getattr(model, "device", None), "type", None) == "cuda":
        warm_traffic(model, settings, pipeline)
    return times[1]


def warmup_short_rows(n: int) -> list[dict[str, Any]]:
    """n short rows of 5-60 words (a choice question; every third also a span block of 1-3
    labels), all with the warm-up id: the shape of online traffic."""
    rows = []
    for i in range(n):
        k = 5 + (i * 7) % 56
        questions: list[dict[str, Any]] = [{"question": "Is the customer satisfied?",
                                            "options": ["yes", "no", "maybe"][: 2 + i % 2]}]
        if i % 3 == 0:
            questions.append({"task": "span:warmup", "labels": ["person", "company", "date"][: 1 + i % 3]})
        rows.append({"id": WARMUP_ID, "task": "choice:warmup", "questions": questions,
                     "text": " ".join(WARMUP_WORDS[(i + j) % len(WARMUP_WORDS)] for j in range(k))})
    return rows


def warm_traffic(model: Any, settings: EngineSettings, pipeline: Any) -> None:
    """Run WARMUP_TRAFFIC_BATCHES full batches of short rows packed as the engine packs them, then
    a small one. A fresh CUDA process pays one-off costs on its first batches of a new kind (kernel
    variants compiled for new sizes, pinned host buffers and device memory grown): measured on an
    H200 with the 1.5B shape, the first real batches after the long-window warm-up took 1.0 s (24
    short rows) and 1.5 s (a full batch; 0.4 s warm) and the next launch waited 0.4 s, while the
    device sat idle behind them. Paid here, before the worker says it is ready."""
    from vela2.packing import pack

    rows = warmup_short_rows(1 + 2 * WARMUP_TRAFFIC_BATCHES * settings.max_batch_tokens // 100)
    seqs = [s for row in rows for s in pipeline.prepare(model, row).sequences]
    batches = pack([s.num_tokens for s in seqs], settings.max_batch_tokens, settings.row_tokens or None)
    t0 = time.perf_counter()
    for b in [*batches[:WARMUP_TRAFFIC_BATCHES], batches[-1][:24]]:
        pipeline.run_batch(model, [seqs[i] for i in b], settings.precision, settings.row_tokens or None)
    _synchronize(model)
    log.info("warm-up traffic: %d batches of short rows in %.3f s", WARMUP_TRAFFIC_BATCHES + 1,
             time.perf_counter() - t0)


def _synchronize(model: Any) -> None:
    torch = sys.modules.get("torch")
    device = getattr(model, "device", None)
    if torch is not None and getattr(device, "type", None) == "cuda":
        torch.cuda.synchronize(device)


MIN_VISIBILITY_S = 5.0  # below this the leases' renewals (a quarter of it) leave no room for a slow Redis


def required_visibility_s(max_wait_ms: float, worst_batch_s: float) -> float:
    """The least visibility timeout: max(MIN_VISIBILITY_S, max_wait + 4 x worst batch)."""
    return max(MIN_VISIBILITY_S, max_wait_ms / 1e3 + 4 * worst_batch_s)


def check_visibility(visibility_timeout_s: float, max_wait_ms: float, worst_batch_s: float) -> None:
    """Refuse to start (ConfigError) when one batch could keep the engine from progressing for a
    whole visibility timeout (its leases would stop and its messages go to another worker)."""
    need = required_visibility_s(max_wait_ms, worst_batch_s)
    if visibility_timeout_s < need:
        raise ConfigError(
            f"visibility timeout {visibility_timeout_s:g} s is too short: it must be at least "
            f"max({MIN_VISIBILITY_S:g} s, max_wait {max_wait_ms / 1e3:g} s + 4 x worst batch {worst_batch_s:.3f} s)"
            f" = {need:.1f} s; raise --visibility-timeout-s, or lower --max-batch-tokens"
        )
