"""Prometheus metrics of one worker process (minimal for now; the metrics issue completes it).

Every metric is prefixed `vela2_`; failures are labelled by reason. Each `Metrics` has its own
registry, so tests can build several in one process; `serve(port)` exposes it over HTTP.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

_MS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKEN_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class Metrics:
    """The worker's counters and histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.results = Counter("vela2_results", "Results stored, by status", ["status"], registry=r)
        self.failures = Counter("vela2_failures", "Failed requests, by reason", ["reason"], registry=r)
        self.duplicates = Counter("vela2_duplicate_deliveries", "Requests that already had a result", registry=r)
        self.batches = Counter("vela2_batches", "Batches run (retried halves included)", ["outcome"], registry=r)
        self.batch_size = Histogram("vela2_batch_size", "Sequences per batch", buckets=_SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("vela2_batch_tokens", "Real tokens per batch", buckets=_TOKEN_BUCKETS, registry=r)
        self.batch_padding = Histogram(
            "vela2_batch_padding_ratio",
            "Padded / real tokens per batch",
            buckets=(1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0),
            registry=r,
        )
        self.latency = Histogram(
            "vela2_latency_ms", "Per-request time by stage", ["stage"], buckets=_MS_BUCKETS, registry=r
        )
        self.buffered = Gauge("vela2_buffered_messages", "Messages held by the engine", registry=r)
        self.waiting = Gauge("vela2_waiting_sequences", "Sequences waiting in length buckets", registry=r)

    def observe_batch(self, tokens: list[int], ok: bool) -> None:
        """One batch over sequences of these lengths."""
        self.batches.labels("ok" if ok else "raised").inc()
        if ok and tokens:
            self.batch_size.observe(len(tokens))
            self.batch_tokens.observe(sum(tokens))
            self.batch_padding.observe(max(tokens) * len(tokens) / max(1, sum(tokens)))

    def observe_result(self, status: str, reason: str | None, timings: dict[str, float] | None) -> None:
        """One stored result; `reason` = error.type of a failed one."""
        self.results.labels(status).inc()
        if reason:
            self.failures.labels(reason).inc()
        for stage, ms in (timings or {}).items():
            self.latency.labels(stage.removesuffix("_ms")).observe(ms)

    def serve(self, port: int) -> None:
        """Expose the metrics on http://0.0.0.0:<port>/metrics (a daemon thread)."""
        start_http_server(port, registry=self.registry)
        log.info("metrics on port %d", port)
