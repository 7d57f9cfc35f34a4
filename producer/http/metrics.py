"""The route's own Prometheus metrics, served at GET /metrics (`--metrics-path`; no API key, as
/healthz): every HTTP request answered, by route template, method and status, how long it took, and
how many are in flight; plus the process's own (`process_*`).

Labels are bounded whatever callers send: the route is the matched template
(``/v1/results/{request_id}``, never the id), ``unmatched`` for a path no route has; a method outside
the HTTP standard ones counts as ``other``. A request's duration runs from its arrival to the end of
its response's body (a streamed download included), or to the disconnect that ended it.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.process_collector import ProcessCollector

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# from a result read (ms) to a long wait_s (up to --max-wait-s, 60 s by default) and an upload
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class RouteMetrics:
    """The families of one app, in a registry of its own (two apps in one process never share one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("vela2_http_requests", "HTTP requests answered, by route template, method and "
                                "status code", ["route", "method", "status"], registry=self.registry)
        self.duration = Histogram("vela2_http_request_duration_seconds", "time from a request's arrival to the "
                                  "end of its response", ["route", "method"], buckets=DURATION_BUCKETS,
                                  registry=self.registry)
        self.in_flight = Gauge("vela2_http_requests_in_flight", "HTTP requests being answered now",
                               registry=self.registry)
        ProcessCollector(registry=self.registry)

    def render(self) -> bytes:
        """The Prometheus text of every family."""
        return generate_latest(self.registry)


class MetricsMiddleware:
    """ASGI middleware counting every HTTP request of the app it wraps into `metrics` (outermost but
    for Starlette's own error middleware: a request that raised counts as the 500 it is answered)."""

    def __init__(self, app: Any, metrics: RouteMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what a request that raised before its response started is answered
        observed = False

        def observe() -> None:
            nonlocal observed
            if observed:
                return
            observed = True
            self.metrics.in_flight.dec()
            # set by the router on a match; the template without its convertors ({request_id}, not {...:any_id})
            route = getattr(scope.get("route"), "path_format", None) or "unmatched"
            method = scope.get("method", "") if scope.get("method") in METHODS else "other"
            self.metrics.requests.labels(route, method, str(status)).inc()
            self.metrics.duration.labels(route, method).observe(time.perf_counter() - start)

        async def sending(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                observe()  # the response is out: what follows (a background task) is not its time

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, sending)
        finally:
            observe()
