"""How `vela2 http` serves the app: its arguments (`build_parser`: a flag per plain setting of
producer.http.settings.Settings, made from its declaration, and the flags of the settings converted by
hand, `OWN_FLAGS`), the Settings of parsed arguments (`settings_from_args`), and uvicorn's h11 protocol
with a timeout on a request's line and headers (`headers_timeout_protocol`: uvicorn alone would hold a
connection whose headers never come for ever). producer.http.app's `serve` and `main` use them."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from producer.auth import ENV_API_KEYS, ENV_API_KEYS_FILE
from producer.client import DEFAULT_REDIS_URL
from producer.http.settings import FlagSetting, Settings, flag_settings
from producer.webhooks import ENV_WEBHOOK_SECRET
from vela2.cli import Parser
from vela2.wire.cells import ENV_CELLS_FILE, cells_file_from_env
from vela2.wire.urls import add_url_arguments

DESCRIPTION = "`vela2 http`: the HTTP route for SystemOne requests (an ASGI app; FastAPI, served by uvicorn)."
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


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


def _cells_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cells", default=cells_file_from_env(), metavar="FILE",
                    help=f"serve over these Redis cells (vela2.wire.cells; default ${ENV_CELLS_FILE}): each request "
                    "in its id's cell, each job in its job id's cell; instead of --redis / --broker")


def _keys_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--api-keys-file", default=None,
                    help=f"the API keys callers present (producer.auth; default ${ENV_API_KEYS_FILE}, "
                    f"plus ${ENV_API_KEYS})")


def _quotas_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quotas-file", default=None, metavar="F",
                    help='tenant -> quotas (JSON) for keys that name none; tenant "" is keyless callers (--no-auth)')


def _webhook_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--webhook-allow", action="append", metavar="ORIGIN",
                    help="an origin jobs' completion webhooks may go to (https://hooks.example.com, "
                    "https://*.example.com, http://127.0.0.1:8080; repeat for more; none: webhooks off)")
    ap.add_argument("--webhook-secret", default=os.environ.get(ENV_WEBHOOK_SECRET) or None,
                    help=f"the secret that signs webhooks (whsec_...; default ${ENV_WEBHOOK_SECRET}); a key's "
                    "webhook_secret in the keys file signs its tenant's instead")


# The flags of the Settings fields that are not plain values, each converted by producer.http.app.main
# (Settings' docstring says how); --no-auth (keys None) comes last, after every setting's.
OWN_FLAGS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "redis_url": lambda ap: add_url_arguments(ap, DEFAULT_REDIS_URL),
    "cells": _cells_flag,
    "keys": _keys_flag,
    "tenant_quotas": _quotas_flag,
    "webhooks": _webhook_flags,
}


def _add_flag(ap: argparse.ArgumentParser, spec: FlagSetting) -> None:
    """The flag of one plain setting, its value in `args.<field name>`."""
    ap.add_argument(spec.flag, dest=spec.name, type=spec.parse, default=spec.flag_default(), metavar=spec.metavar,
                    help=None if spec.help is None else spec.help.replace("%", "%%"))


def build_parser() -> argparse.ArgumentParser:
    """The `vela2 http` arguments (shared with the CLI), in Settings' order: a plain setting's flag
    made from its declaration, another field's by OWN_FLAGS."""
    ap = Parser(prog="vela2 http", description=DESCRIPTION)
    plain = {spec.name: spec for spec in flag_settings()}
    for f in fields(Settings):
        if f.name in plain:
            _add_flag(ap, plain[f.name])
        else:
            OWN_FLAGS[f.name](ap)
    ap.add_argument("--no-auth", action="store_true",
                    help="serve without authentication (loopback only; it says so at start)")
    return ap


def settings_from_args(args: argparse.Namespace, **converted: Any) -> Settings:
    """The Settings of parsed `vela2 http` arguments: every plain setting's flag, and `converted`, the
    fields OWN_FLAGS' flags were converted into (redis_url, cells, keys, tenant_quotas, webhooks)."""
    return Settings(**{spec.name: getattr(args, spec.name) for spec in flag_settings()}, **converted)
