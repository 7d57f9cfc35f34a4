"""Prometheus metrics of one worker process, served on `--metrics-port` at /metrics.

Every metric is prefixed `vela2_`; failures are labelled by reason, durations by stage. Queue depth
is read from Redis at scrape time (the queue lists, kombu's priority sub-lists and the unacked hash),
because LLEN alone misses what workers hold: see deploy/README.md for autoscaling on it. Each
`Metrics` has its own registry, so tests can build several in one process.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from vela2.text.packing import padded_tokens
from vela2.wire import fleet, keys
from vela2.wire.jobs import JOB_FIELDS, STATUSES, parse_job
from worker.obs.health import Health
from worker.obs.health import serve as serve_http
from worker.transport.retry import write_blocked_seconds

log = logging.getLogger(__name__)

_S_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKEN_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
_FRACTION_BUCKETS = (0.0, 0.01, 0.02, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75)


class QueueDepthCollector(Collector):
    """`vela2_queue_depth{queue}` and `vela2_unacked_messages`, read from Redis at scrape time (one
    pipelined round trip)."""

    def __init__(self, redis: Any, queues: list[str]):
        self.redis = redis
        self.queues = queues

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            depths, tenants = fleet.depths(self.redis, self.queues)
        except Exception as e:  # a scrape must not fail because Redis is away; the gauges are just absent
            log.warning("queue depth unavailable: %s", e)
            return
        g = GaugeMetricFamily("vela2_queue_depth", "Messages waiting in Redis, by queue", labels=["queue"])
        for q in self.queues:
            g.add_metric([q], float(depths[q]))
        yield g
        t = GaugeMetricFamily("vela2_tenant_queue_depth", f"Messages waiting in Redis by queue and tenant: the "
                              f"{TENANT_LABELS} tenants with the most, the rest as tenant {OTHER_TENANTS!r}",
                              labels=["queue", "tenant"])
        for q in self.queues:
            for tenant, n in top_tenants(tenants[q]).items():
                t.add_metric([q, tenant], float(n))
        yield t
        yield GaugeMetricFamily("vela2_unacked_messages", "Messages delivered to some worker (of any model) and not "
                                "yet acked: buffered or running (kombu's unacked hash)",
                                value=float(depths[keys.UNACKED_KEY]))


TENANT_LABELS = 20  # tenants a per-tenant gauge names (the most loaded); bounded series whatever the tenants
OTHER_TENANTS = "_other"  # the label of the rest of them, summed


def top_tenants(counts: dict[str, int], n: int = TENANT_LABELS) -> dict[str, int]:
    """The `n` largest of `counts`, the rest summed under OTHER_TENANTS (absent when none is left)."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    out = dict(ranked[:n])
    if rest := sum(v for _, v in ranked[n:]):
        out[OTHER_TENANTS] = rest
    return out


JOBS_SCRAPED = 1000  # the newest jobs of a model a scrape reads (one pipelined round trip)


class JobsCollector(Collector):
    """`vela2_jobs{status}`: the model's newest JOBS_SCRAPED bulk jobs by status (vela2.wire.jobs:
    validating, in_progress, cancelling, completed, cancelled, expired, failed), read from Redis at
    scrape time: the index, then one HMGET per job, in one pipeline after the index read."""

    def __init__(self, redis: Any, model: str):
        self.redis = redis
        self.model = model

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            jobs = self.redis.zrevrange(keys.jobs_key(self.model), 0, JOBS_SCRAPED - 1)
            pipe = self.redis.pipeline(transaction=False)
            for job in jobs:
                pipe.hmget(keys.job_key(job.decode() if isinstance(job, bytes) else job), JOB_FIELDS)
            records = pipe.execute() if jobs else []
        except Exception as e:  # a scrape must not fail because Redis is away; the gauge is just absent
            log.warning("jobs by status unavailable: %s", e)
            return
        now = time.time()
        counts = dict.fromkeys(STATUSES, 0)
        for values in records:
            info = parse_job(values, now)
            if info is not None:
                counts[info.status] += 1
        g = GaugeMetricFamily("vela2_jobs", f"Bulk jobs of this model by status (the newest {JOBS_SCRAPED:,})",
                              labels=["status"])
        for status, n in counts.items():
            g.add_metric([status], float(n))
        yield g


class AmqpQueueDepthCollector(Collector):
    """`vela2_queue_depth{queue}` of RabbitMQ queues at scrape time: each queue's ready messages (a
    passive declare). Messages delivered and not yet acked are not in it (AMQP does not tell them;
    RabbitMQ's management API or its Prometheus plugin does, as messages_unacknowledged)."""

    def __init__(self, url: str, queues: list[str]):
        self.url = url
        self.queues = queues

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("vela2_queue_depth", "Messages ready in RabbitMQ, by queue", labels=["queue"])
        try:
            depths = fleet.amqp_queue_depths(self.url, self.queues)
        except Exception as e:  # a scrape must not fail because the broker is away; the gauge is just absent
            log.warning("queue depth unavailable: %s", e)
            return
        for q in self.queues:
            g.add_metric([q], float(depths[q]))
        yield g


def gpu_memory(device: str) -> dict[str, float] | None:
    """This process's CUDA memory on `device` (bytes: allocated, reserved, peak, total), or None
    off CUDA. Host-side counters: no sync, cheap enough to read after every batch."""
    torch = sys.modules.get("torch")
    if torch is None or not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    d = torch.device(device)
    return {"allocated": float(torch.cuda.memory_allocated(d)), "reserved": float(torch.cuda.memory_reserved(d)),
            "peak": float(torch.cuda.max_memory_allocated(d)),
            "total": float(torch.cuda.get_device_properties(d).total_memory)}


class GpuMemoryCollector(Collector):
    """`vela2_gpu_memory_bytes{device, kind=allocated|reserved|peak|total}` for a CUDA device:
    `source()` gives the figures (worker.runtime.device: read where the model lives; a worker whose model
    is in a device process must not open a CUDA context of its own to read zeros)."""

    def __init__(self, device: str, source: Callable[[], dict[str, float] | None]):
        self.device, self.source = device, source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        figures = self.source()
        if not figures:
            return
        g = GaugeMetricFamily("vela2_gpu_memory_bytes", "GPU memory of this worker's device", labels=["device", "kind"])
        for kind, value in figures.items():
            g.add_metric([self.device, kind], value)
        yield g


class Metrics:
    """The worker's counters, histograms and gauges (the engine calls observe_*)."""

    def __init__(self, *, row_tokens: int = 0) -> None:
        self.registry = CollectorRegistry()
        self.row_tokens = row_tokens
        self.server: Any = None  # the metrics HTTP server once serve() ran
        self._children: dict[tuple[int, str], Any] = {}  # see _child
        r = self.registry
        self.requests = Counter("vela2_requests", "Results stored, by status (ok, error, expired, cancelled: "
                                "cancelled before the worker started them, never run)", ["status"], registry=r)
        self.failures = Counter("vela2_failures", "Failed requests, by reason (error type)", ["reason"], registry=r)
        self.duplicates = Counter("vela2_duplicate_deliveries", "Deliveries of requests that already had a result "
                                  "or were being answered",
                                  registry=r)
        self.batches = Counter("vela2_batches", "Batches run (retried halves included), by outcome", ["outcome"],
                               registry=r)
        self.batch_size = Histogram("vela2_batch_size", "Sequences per batch", buckets=_SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("vela2_batch_tokens", "Real tokens per batch", buckets=_TOKEN_BUCKETS,
                                      registry=r)
        self.batch_padding = Histogram("vela2_batch_padding_fraction", "Padding / padded tokens per batch",
                                       buckets=_FRACTION_BUCKETS, registry=r)
        self.duration = Histogram("vela2_request_duration_seconds", "Per-request time by stage",
                                  ["stage"], buckets=_S_BUCKETS, registry=r)
        self.buffered = Gauge("vela2_buffered_messages", "Messages held by this worker's engine", registry=r)
        self.waiting = Gauge("vela2_waiting_sequences", "Sequences waiting in length buckets", registry=r)
        self.write_blocked = Gauge("vela2_redis_write_blocked_seconds", "How long this worker has been waiting for "
                                   "Redis to accept a write (full, loading or away); 0 when it is not", registry=r)
        self.write_blocked.set_function(write_blocked_seconds)
        self.info = Gauge("vela2_worker_info", "Constant 1, labelled with what this worker serves",
                          ["model", "device", "precision"], registry=r)
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total, ...

    def describe_worker(self, *, model: str, device: str, precision: str, redis: Any, queues: list[str],
                        gpu_memory_source: Callable[[], dict[str, float] | None] | None = None,
                        amqp_url: str | None = None, store: Any = None) -> None:
        """Label this worker and register the scrape-time collectors (queue depth: of the Redis broker
        `redis`, or of RabbitMQ at `amqp_url`; jobs by status: in the result store `store`, default
        `redis`; GPU memory: by default this process's own)."""
        self.info.labels(model, device, precision).set(1)
        self.registry.register(AmqpQueueDepthCollector(amqp_url, queues) if amqp_url
                               else QueueDepthCollector(redis, queues))
        self.registry.register(JobsCollector(redis if store is None else store, model))
        self.registry.register(GpuMemoryCollector(device, gpu_memory_source or partial(gpu_memory, device)))

    def padded_tokens(self, tokens: list[int]) -> int:
        """Padded size of a batch of sequences of these lengths, as run_batch lays it out."""
        return padded_tokens(tokens, self.row_tokens or None)

    def observe_batch(self, tokens: list[int], ok: bool) -> None:
        """One batch over sequences of these lengths."""
        self.batches.labels("ok" if ok else "raised").inc()
        if ok and tokens:
            real = sum(tokens)
            self.batch_size.observe(len(tokens))
            self.batch_tokens.observe(real)
            self.batch_padding.observe(1.0 - real / max(1, self.padded_tokens(tokens)))

    def observe_result(self, status: str, reason: str | None, timings: dict[str, float] | None) -> None:
        """One stored result; `reason` = error.type of a failed one; timings in ms by stage."""
        self._child(self.requests, status).inc()
        if reason:
            self.failures.labels(reason).inc()
        for stage, ms in (timings or {}).items():
            self._child(self.duration, stage).observe(ms / 1e3)

    def failure_counts(self) -> dict[str, int]:
        """Failed requests so far, by reason (what `vela2 status` shows per worker)."""
        return {sample.labels["reason"]: int(sample.value) for metric in self.failures.collect()
                for sample in metric.samples if sample.name.endswith("_total")}

    def _child(self, metric: Any, key: str) -> Any:
        """The labelled child of `metric` for `key` (a status, or a stage's `*_ms` timing name),
        looked up once: `labels()` validates and locks on every call, and the engine thread
        observes every result (several timings each)."""
        child = self._children.get((id(metric), key))
        if child is None:
            child = self._children[(id(metric), key)] = metric.labels(key.removesuffix("_ms"))
        return child

    def serve(self, port: int, host: str = "127.0.0.1", health: Health | None = None) -> None:
        """Expose the metrics on http://<host>:<port>/metrics, and with `health` /livez and /readyz
        (worker.obs.health), from a daemon thread."""
        self.server = serve_http(port, host, self.registry, health)
        log.info("metrics%s on %s:%d", " and health" if health else "", host, self.server.server_port)
