"""How `vela2 http` serves the app: its arguments (`build_parser`) and uvicorn's h11 protocol with a
timeout on a request's line and headers (`headers_timeout_protocol`: uvicorn alone would hold a
connection whose headers never come for ever). producer.http.app's `serve` and `main` use them."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from producer.arguments import ENV_MODEL
from producer.auth import ENV_API_KEYS, ENV_API_KEYS_FILE
from producer.client import DEFAULT_MODEL, DEFAULT_REDIS_URL
from producer.files import DEFAULT_FILE_EXPIRES_S
from producer.http.state import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_WAIT_S,
    DEFAULT_REDIS_CONNECTIONS,
    DEFAULT_REDIS_WAIT_S,
    DEFAULT_TIMEOUT_S,
    DEFAULT_UPLOAD_PROCESSES,
    DEFAULT_UPLOAD_TIMEOUT_S,
    DEFAULT_UPLOADS_PER_TENANT,
)
from producer.webhooks import ENV_WEBHOOK_SECRET
from vela2.cli import Parser
from vela2.wire.cells import ENV_CELLS_FILE, cells_file_from_env
from vela2.wire.urls import ENV_BROKER_URL, add_url_arguments

DESCRIPTION = "`vela2 http`: the HTTP route for SystemOne requests (an ASGI app; FastAPI, served by uvicorn)."
DEFAULT_PORT = 8000
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
DEFAULT_HEADERS_TIMEOUT_S = 10.0  # longest a request line and headers may take to arrive, then the connection closes


def headers_timeout_protocol(timeout_s: float) -> type:
    """uvicorn's h11 protocol, closing a connection whose request line and headers have not all
    arrived within `timeout_s` of the connection (or of the previous response): uvicorn itself
    would hold such a connection for ever (a slowloris)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadersTimeout(H11Protocol):
        _headers_timer: asyncio.TimerHandle | None = None
        _waiting_for: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._waiting_for = self.cycle  # a request whose headers arrive replaces this cycle
            self._headers_timer = self.loop.call_later(timeout_s, self._headers_timed_out)

        def _disarm(self) -> None:
            timer, self._headers_timer = self._headers_timer, None
            if timer is not None:
                timer.cancel()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not self._waiting_for:  # the headers are in: the body has its own timeout
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._disarm()
                self._arm()  # the next request on this connection gets the same time

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _headers_timed_out(self) -> None:
            self._headers_timer = None
            if not self.transport.is_closing():
                self.logger.warning("closing a connection whose request headers did not arrive within %g s",
                                    timeout_s)
                self.transport.close()

    return HeadersTimeout


def _positive(kind: type) -> Any:
    def parse(raw: str) -> Any:
        value = kind(raw)
        if not value > 0:  # NaN too
            raise argparse.ArgumentTypeError(f"must be > 0; got {raw}")
        return value

    return parse


def _at_least_zero(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0; got {raw}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The `vela2 http` arguments (shared with the CLI)."""
    ap = Parser(prog="vela2 http", description=DESCRIPTION)
    add_url_arguments(ap, DEFAULT_REDIS_URL)
    ap.add_argument("--broker", default=os.environ.get(ENV_BROKER_URL) or None,
                    help=f"the workers' broker URL when it is not the Redis of --redis (default ${ENV_BROKER_URL})")
    ap.add_argument("--cells", default=cells_file_from_env(), metavar="FILE",
                    help=f"serve over these Redis cells (vela2.wire.cells; default ${ENV_CELLS_FILE}): each request "
                    "in its id's cell, each job in its job id's cell; instead of --redis / --broker")
    ap.add_argument("--host", default="127.0.0.1", help="interface (0.0.0.0 inside a container)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT)
    ap.add_argument("--model", default=os.environ.get(ENV_MODEL, DEFAULT_MODEL), help="the model served")
    ap.add_argument("--wait-replicas", type=_at_least_zero, default=0, metavar="N",
                    help="accept a submission once N replicas of the broker's Redis hold it (Redis WAIT; Sentinel)")
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="default wait for an answer")
    ap.add_argument("--max-wait-s", type=float, default=DEFAULT_MAX_WAIT_S, help="largest wait_s accepted")
    ap.add_argument("--log-level", default="info")
    ap.add_argument("--api-keys-file", default=None,
                    help=f"the API keys callers present (producer.auth; default ${ENV_API_KEYS_FILE}, "
                    f"plus ${ENV_API_KEYS})")
    ap.add_argument("--quotas-file", default=None, metavar="F",
                    help='tenant -> quotas (JSON) for keys that name none; tenant "" is keyless callers (--no-auth)')
    ap.add_argument("--redis-connections", type=_positive(int), default=DEFAULT_REDIS_CONNECTIONS,
                    help="Redis connections of this process (requests wait for a free one)")
    ap.add_argument("--redis-wait-s", type=_positive(float), default=DEFAULT_REDIS_WAIT_S,
                    help="longest a request waits for a Redis connection, then 429 + Retry-After")
    ap.add_argument("--body-timeout-s", type=_positive(float), default=DEFAULT_BODY_TIMEOUT_S,
                    help="longest a request body may take to arrive, then 408")
    ap.add_argument("--headers-timeout-s", type=_positive(float), default=DEFAULT_HEADERS_TIMEOUT_S,
                    help="longest a request's line and headers may take to arrive, then the connection is closed")
    ap.add_argument("--max-batch-bytes", type=_positive(int), default=DEFAULT_MAX_BATCH_BYTES,
                    help="largest JSONL body of POST /v1/batches (held in memory while it is submitted)")
    ap.add_argument("--upload-processes", type=_positive(int), default=DEFAULT_UPLOAD_PROCESSES,
                    help="processes that parse and queue batch uploads: online requests never wait for them")
    ap.add_argument("--upload-timeout-s", type=_positive(float), default=DEFAULT_UPLOAD_TIMEOUT_S,
                    help="longest one upload may take to register its lines, then 408 upload_timeout (the job fails)")
    ap.add_argument("--uploads-per-tenant", type=_positive(int), default=DEFAULT_UPLOADS_PER_TENANT,
                    help="batch uploads one tenant may have in progress at once; more get 429 too_many_uploads")
    ap.add_argument("--file-expires-s", type=_positive(int), default=DEFAULT_FILE_EXPIRES_S,
                    help="how long a file uploaded to POST /v1/files lives (its bytes count in stored_bytes)")
    ap.add_argument("--webhook-allow", action="append", metavar="ORIGIN",
                    help="an origin jobs' completion webhooks may go to (https://hooks.example.com, "
                    "https://*.example.com, http://127.0.0.1:8080; repeat for more; none: webhooks off)")
    ap.add_argument("--webhook-secret", default=os.environ.get(ENV_WEBHOOK_SECRET) or None,
                    help=f"the secret that signs webhooks (whsec_...; default ${ENV_WEBHOOK_SECRET}); a key's "
                    "webhook_secret in the keys file signs its tenant's instead")
    ap.add_argument("--no-auth", action="store_true",
                    help="serve without authentication (loopback only; it says so at start)")
    return ap
