"""The worker's HTTP surface on its metrics port: `/metrics` (Prometheus text), `/livez` and `/readyz`.

- `/livez`: 200 while the engine makes progress; 503 once it has made none for a whole visibility
  timeout (a hung device: its leases stopped renewing, so its messages go to other workers; an
  orchestrator should restart it).
- `/readyz`: 200 once the checkpoint is loaded, the warm-up batches ran and the engine serves;
  503 before (its reason names the start-up stage: "starting: loading weights 3/8"), while it shuts
  down, once its checkpoint's files were found to differ from their manifest (worker.runtime.verify),
  and while Redis does not take its heartbeat (so a load balancer or `kubectl rollout` waits
  for real readiness, as Triton and TEI do).

A worker with a metrics port serves both from the first second of its life, before the model stack
is even imported (worker.runtime.early): /livez answers 200 while the model loads, so a liveness
probe needs no initial delay longer than the load.

Both answer JSON: {"live"/"ready": bool, "reason": str, "model", "digest"} (the digest is empty
until the checkpoint's identity is known).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger(__name__)


class Health:
    """What /livez and /readyz report: start-up sets `serving` once the engine runs; the callables
    are the engine's and the leases' own views."""

    def __init__(self, model: str, digest: str = ""):
        self.model, self.digest = model, digest
        self.serving = False  # set once the engine runs (the model loaded and warm)
        self.stage = "loading the checkpoint and warming up"  # what start-up is doing (begin())
        self.started = time.monotonic()
        self.stopping: Callable[[], bool] = lambda: False  # a warm shutdown has begun
        self.stalled: Callable[[], bool] = lambda: False  # the leases' view of engine progress
        self.beat_error: Callable[[], str | None] = lambda: None  # the last heartbeat's failure, if any
        self.fault: str | None = None  # why this worker takes no more work (its checkpoint changed)

    def begin(self, stage: str, at: float | None = None) -> None:
        """Start-up has reached `stage` (what /readyz names until ready) at time.monotonic() `at`
        (default now); logged with the seconds since this Health was made (the process's launch,
        for the early one)."""
        self.stage = stage
        log.info("start-up: %s (%.1f s)", stage, (time.monotonic() if at is None else at) - self.started)

    def live(self) -> tuple[bool, str]:
        if self.stalled():
            return False, "the engine has made no progress for a whole visibility timeout"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if self.fault is not None:
            return False, self.fault
        if self.stopping():
            return False, "shutting down"
        if not self.serving:
            return False, f"starting: {self.stage}"
        if self.stalled():
            return False, "stalled"
        error = self.beat_error()
        if error is not None:
            return False, f"Redis does not take the heartbeat: {error}"
        return True, "ok"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass  # a probe every few seconds must not fill the worker's log


def app(registry: CollectorRegistry, health: Health | None) -> Callable:
    """The WSGI app: /livez and /readyz from `health` (404 without one), everything else metrics."""
    metrics = make_wsgi_app(registry)

    def serve(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/livez", "/readyz") and health is not None:
            ok, reason = health.live() if path == "/livez" else health.ready()
            key = "live" if path == "/livez" else "ready"
            body = json.dumps({key: ok, "reason": reason, "model": health.model, "digest": health.digest}).encode()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        return metrics(environ, start_response)

    return serve


def serve(port: int, host: str, registry: CollectorRegistry, health: Health | None) -> WSGIServer:
    """Serve `app` on host:port from a daemon thread; returns the server (its port if 0 was asked)."""
    server = make_server(host, port, app(registry, health), server_class=_Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="vela2-http", daemon=True).start()
    return server
