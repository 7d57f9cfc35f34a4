"""The settings of one route (`vela2 http`, producer.http.app.create_app / serve), each declared once:
`Settings`, whose plain fields (`setting(...)`) make the command's flags (producer.http.server.
build_parser), are checked however the app is made, and reach the app by name."""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any

from producer.arguments import ENV_MODEL
from producer.auth import KeyRing
from producer.brokers import check_wait_replicas
from producer.client import DEFAULT_MODEL, DEFAULT_REDIS_URL
from producer.files import DEFAULT_FILE_EXPIRES_S
from producer.liveness import DEFAULT_GRACE_S, MIN_GRACE_S
from producer.quotas import Quotas
from producer.webhooks import WebhookPolicy
from vela2.errors import ConfigError
from vela2.wire.cells import CellMap
from vela2.wire.urls import ENV_BROKER_URL

# the no-worker grace: 0 turns it off; a shorter one would take a live worker between beats for none
GRACE_CHECK = f"0 (never) or >= {MIN_GRACE_S:g}"
PATH_CHECK = "empty or a path starting with /"
# A plain setting's check: its text (as errors say it) and the test a value passes (NaN passes neither)
CHECKS: dict[str, Callable[[Any], bool]] = {"> 0": lambda v: v > 0, ">= 0": lambda v: v >= 0,
                                            GRACE_CHECK: lambda v: v == 0 or v >= MIN_GRACE_S,
                                            PATH_CHECK: lambda v: v == "" or v.startswith("/")}


def setting(default: Any, help: str | None, *, check: str | None = None, flag: str | None = None,
            env: str | None = None, metavar: str | None = None) -> Any:
    """A plain route setting: its default, its `--help` text (None: argparse's "default: X"), its check
    (a key of CHECKS; None: any value of its type) and, where the rule's do not fit, its flag (the
    rule: --name-with-dashes), the environment variable whose value (when not empty) is the flag's
    default, and the flag's metavar (the rule: the flag's name in capitals)."""
    return field(default=default, metadata={"help": help, "check": check, "flag": flag, "env": env,
                                            "metavar": metavar})


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every setting of one route, declared once, in the order `vela2 http --help` lists their flags:
    what create_app makes the app with, and what serve runs it with (host, port, log_level and
    headers_timeout_s are uvicorn's: the app itself ignores them).

    A field declared with `setting(...)` is a plain value: its flag, type, default, check and help
    come from the declaration (producer.http.server.build_parser makes the flags, `flag_settings`
    lists them, and `vela2 http` copies each parsed flag into its field). The others are made by
    conversions of their own (producer.http.server.OWN_FLAGS adds their flags, producer.http.app.main
    converts them): `redis_url` from --redis / --redis-url-file ($VELA2_REDIS_URL /
    $VELA2_REDIS_URL_FILE; vela2.wire.urls.url_from_args); `cells` (vela2.wire.cells: then
    redis_url and broker_url are unused) from --cells FILE or $VELA2_CELLS_FILE
    (producer.arguments.cells_from_args); `keys` (None: no authentication) from --api-keys-file
    ($VELA2_API_KEYS_FILE, $VELA2_API_KEYS; producer.auth.KeyRing.load), or None with --no-auth;
    `tenant_quotas` (tenant -> quotas for keys that name none; "": keyless callers) from
    --quotas-file (producer.quotas.load_quotas_file); `webhooks` (where jobs' completion webhooks may
    go, how they are signed; producer.webhooks) from --webhook-allow, --webhook-secret
    ($VELA2_WEBHOOK_SECRET) and the keys' secrets (producer.http.app.webhook_policy). Raises
    ConfigError naming a value its check refuses, InvalidRequest for wait_replicas over RabbitMQ."""

    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str | None = setting(
        None, f"the workers' broker URL when it is not the Redis of --redis (default ${ENV_BROKER_URL})",
        flag="--broker", env=ENV_BROKER_URL)
    cells: CellMap | None = None
    host: str = setting("127.0.0.1", "interface (0.0.0.0 inside a container)")
    port: int = setting(8000, None)
    model: str = setting(DEFAULT_MODEL, "the model served", env=ENV_MODEL)
    wait_replicas: int = setting(
        0, "accept a submission once N replicas of the broker's Redis hold it (Redis WAIT; Sentinel)",
        check=">= 0", metavar="N")
    timeout_s: float = setting(10.0, "default wait for an answer", check=">= 0")  # of POST, unless it names wait_s
    max_wait_s: float = setting(60.0, "largest wait_s accepted", check=">= 0")
    no_worker_grace_s: float = setting(
        DEFAULT_GRACE_S, "a wait ends with 503 no_worker once no worker of the model has beaten for this long "
        "(the request stays queued; 0: never)", check=GRACE_CHECK)
    log_level: str = setting("info", None)
    metrics_path: str = setting(
        "/metrics", "where Prometheus reads the route's metrics (producer.http.metrics; no API key, as /healthz; "
        "empty: not served)", check=PATH_CHECK)
    keys: KeyRing | None
    tenant_quotas: Mapping[str, Quotas] = field(default_factory=dict)
    redis_connections: int = setting(64, "Redis connections of this process (requests wait for a free one)",
                                     check="> 0")
    redis_wait_s: float = setting(5.0, "longest a request waits for a Redis connection, then 429 + Retry-After",
                                  check="> 0")
    body_timeout_s: float = setting(30.0, "longest a request body may take to arrive, then 408", check="> 0")
    headers_timeout_s: float = setting(
        10.0, "longest a request's line and headers may take to arrive, then the connection is closed",
        check="> 0")
    max_batch_bytes: int = setting(
        64 << 20, "largest JSONL body of POST /v1/batches (held in memory while it is submitted)", check="> 0")
    upload_processes: int = setting(
        2, "processes that parse and queue batch uploads: online requests never wait for them", check="> 0")
    upload_timeout_s: float = setting(
        300.0, "longest one upload may take to register its lines, then 408 upload_timeout (the job fails)",
        check="> 0")
    uploads_per_tenant: int = setting(
        2, "batch uploads one tenant may have in progress at once; more get 429 too_many_uploads", check="> 0")
    file_expires_s: int = setting(
        DEFAULT_FILE_EXPIRES_S, "how long a file uploaded to POST /v1/files lives (its bytes count in "
        "stored_bytes)", check="> 0")
    webhooks: WebhookPolicy = field(default_factory=WebhookPolicy)

    def __post_init__(self) -> None:
        # create_app's callers have passed None for "none" (tenant_quotas, webhooks): kept working
        object.__setattr__(self, "tenant_quotas", dict(self.tenant_quotas or {}))
        if self.webhooks is None:
            object.__setattr__(self, "webhooks", WebhookPolicy())
        for spec in flag_settings():
            if (problem := spec.problem(getattr(self, spec.name))) is not None:
                raise ConfigError(f"{spec.name} {problem}")
        for url in ([c.broker_url for c in self.cells.cells] if self.cells is not None else [self.broker_url]):
            check_wait_replicas(self.wait_replicas, url)  # WAIT needs a Redis broker (each cell's)

    def quotas(self, tenant: str | None, key_quotas: Quotas | None) -> Quotas | None:
        """A caller's quotas: its key's, else its tenant's in the quotas file (keyless: tenant "")."""
        return key_quotas if key_quotas is not None else self.tenant_quotas.get(tenant or "")


_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "str | None": str}


@dataclass(frozen=True)
class FlagSetting:
    """One plain setting as `vela2 http` takes it: the field's name, its flag, type, declared default,
    check, help, environment variable and metavar (from its `setting(...)`)."""

    name: str
    flag: str
    type: type
    default: Any
    check: str | None
    help: str | None
    env: str | None
    metavar: str

    def flag_default(self) -> Any:
        """The flag's default: the environment variable's value when it is set and not empty (parsed
        and checked by argparse as if given), else the declared default."""
        return (os.environ.get(self.env) if self.env else None) or self.default

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` ("must be > 0; got 0"), None when its check passes."""
        if self.check is None or value is None or CHECKS[self.check](value):
            return None
        return f"must be {self.check}; got {value}"

    def parse(self, raw: str) -> Any:
        """A command line's string as this setting's value; argparse.ArgumentTypeError (argparse
        names the flag before it) for one that is not of its type or fails its check."""
        try:
            value = self.type(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {'an integer' if self.type is int else 'a number'}; got {raw}") from None
        if self.problem(value) is not None:
            raise argparse.ArgumentTypeError(f"must be {self.check}; got {raw}")
        return value


def _flag_setting(f: Field) -> FlagSetting:
    meta = f.metadata
    flag = meta["flag"] or "--" + f.name.replace("_", "-")
    metavar = meta["metavar"] or flag[2:].upper().replace("-", "_")  # argparse's own, from the flag
    return FlagSetting(name=f.name, flag=flag, type=_TYPES[str(f.type)], default=f.default, check=meta["check"],
                       help=meta["help"], env=meta["env"], metavar=metavar)


@functools.cache
def flag_settings() -> tuple[FlagSetting, ...]:
    """The plain settings (the fields declared with `setting(...)`), in Settings' order."""
    return tuple(_flag_setting(f) for f in fields(Settings) if "help" in f.metadata)
