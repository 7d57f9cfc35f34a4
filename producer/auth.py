"""API keys of the HTTP route: who may ask, as which tenant, for which models.

A key is a bearer token (``Authorization: Bearer <key>``). Only its SHA-256 is kept: a keys file
(``vela2 http --api-keys-file F``, or ``VELA2_API_KEYS_FILE``) or the ``VELA2_API_KEYS`` variable
holds one JSON object per line::

    {"tenant": "acme", "sha256": "<hex digest of the key>", "models": ["vela2-demo"],
     "quotas": {"requests_per_s": 50}, "share": 2}

``models`` is optional (absent: every model). ``quotas`` is optional (absent: the tenant's in
``--quotas-file``, else none): the caller's limits, enforced by the route across its replicas
(producer.quotas: requests_per_s, tokens_per_s, queued, stored_bytes, live_jobs, job_lines); past
them: 429 (507 for stored_bytes) ``quota_exceeded``.
``share`` is optional (default 1): the tenant's weight in the workers' fair share (a tenant of share 2
gets twice the messages and device tokens of one of share 1 while both wait; several keys of one
tenant: the largest). ``webhook_secret`` is optional: the secret that signs the tenant's job webhooks
(producer.webhooks; absent: the route's ``--webhook-secret``); ``webhook_url`` is optional: where the
key's jobs' completion events go when a job names none. Several keys may name one tenant
(rotation; each key carries its own quotas). Make a key with
``python -m producer.auth new TENANT [--models a,b]``: it prints the key once (give it to the
caller) and the line to append to the keys file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from producer.quotas import Quotas
from vela2.errors import ConfigError
from vela2.wire.keys import tenant_problem

ENV_API_KEYS = "VELA2_API_KEYS"
ENV_API_KEYS_FILE = "VELA2_API_KEYS_FILE"
KEY_PREFIX = "vela2_"  # every key made here starts so (secret scanners can find leaked ones)
MAX_KEY_CHARS = 512  # a longer Authorization value is refused without hashing it
MIN_SHARE, MAX_SHARE = 0.01, 1000  # a tenant's weight in the fair share


@dataclass(frozen=True)
class ApiKey:
    """One accepted key: its hash, its tenant and the models it may use (None: all)."""

    tenant: str
    sha256: str
    models: frozenset[str] | None = None
    quotas: Quotas | None = None  # the caller's limits (producer.quotas)
    share: float | None = None  # the tenant's weight in the fair share (None: 1)
    webhook_secret: str | None = None  # signs its tenant's job webhooks (producer.webhooks; None: the route's)
    webhook_url: str | None = None  # where its jobs' completion events go when a job names none

    def line(self) -> str:
        """Its keys-file line."""
        obj: dict = {"tenant": self.tenant, "sha256": self.sha256}
        if self.models is not None:
            obj["models"] = sorted(self.models)
        if self.quotas is not None:
            obj["quotas"] = self.quotas.to_dict()
        if self.share is not None:
            obj["share"] = self.share
        if self.webhook_secret is not None:
            obj["webhook_secret"] = self.webhook_secret
        if self.webhook_url is not None:
            obj["webhook_url"] = self.webhook_url
        return json.dumps(obj)


@dataclass(frozen=True)
class Refusal:
    """Why a request is not let in: HTTP 401 (no or unknown key) or 403 (not for this model)."""

    status: int
    type: str  # "unauthorized" / "forbidden"
    message: str


def hash_key(key: str) -> str:
    """The hex SHA-256 a keys file stores for `key`."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class KeyRing:
    """The accepted keys, by hash."""

    def __init__(self, keys: list[ApiKey]):
        self.keys = keys
        self._by_hash = {k.sha256: k for k in keys}

    def __len__(self) -> int:
        return len(self.keys)

    def webhook_secrets(self) -> dict[str, str]:
        """Tenant -> the secret that signs its jobs' webhooks (the first of its keys that names one)."""
        out: dict[str, str] = {}
        for k in self.keys:
            if k.webhook_secret is not None:
                out.setdefault(k.tenant, k.webhook_secret)
        return out

    def shares(self) -> dict[str, float | None]:
        """Each tenant's weight in the fair share: the largest its keys name (None: none names one)."""
        out: dict[str, float | None] = {}
        for k in self.keys:
            have = out.get(k.tenant)
            out[k.tenant] = k.share if have is None else max(have, k.share or have)
        return out

    @classmethod
    def parse(cls, text: str, source: str) -> KeyRing:
        """Keys from JSON lines (blank lines and lines starting with # ignored); raises ConfigError
        naming the source and line of the first bad one."""
        keys: list[ApiKey] = []
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{source} line {n}"
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise ConfigError(f"{where}: not JSON ({e})") from None
            if not isinstance(obj, dict) or set(obj) - {"tenant", "sha256", "models", "quotas", "share",
                                                        "webhook_secret", "webhook_url"}:
                raise ConfigError(f"{where}: an object with tenant, sha256 and optionally models, quotas, share, "
                                  "webhook_secret and webhook_url is expected")
            tenant, digest, models = obj.get("tenant"), obj.get("sha256"), obj.get("models")
            if problem := tenant_problem(tenant):
                raise ConfigError(f"{where}: {problem}")
            if not isinstance(digest, str) or len(digest) != 64 or set(digest) - set("0123456789abcdef"):
                raise ConfigError(f"{where}: sha256 must be 64 lowercase hex digits (python -m producer.auth new)")
            if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) for m in models)):
                raise ConfigError(f"{where}: models must be a list of model names")
            quotas = Quotas.parse(obj["quotas"], where) if "quotas" in obj else None
            share = obj.get("share")
            if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                      or not MIN_SHARE <= share <= MAX_SHARE):
                raise ConfigError(f"{where}: share must be a number from {MIN_SHARE} to {MAX_SHARE:,}; got {share!r}")
            secret, url = obj.get("webhook_secret"), obj.get("webhook_url")
            if secret is not None and (not isinstance(secret, str) or len(secret) < 16):
                raise ConfigError(f"{where}: webhook_secret must be a string of 16 characters or more (whsec_...)")
            if url is not None and not isinstance(url, str):
                raise ConfigError(f"{where}: webhook_url must be a URL string")
            keys.append(ApiKey(str(tenant), digest, frozenset(models) if models is not None else None, quotas,
                               None if share is None else float(share), secret, url))
        return cls(keys)

    @classmethod
    def load(cls, path: str | None = None, environ: dict[str, str] | None = None) -> KeyRing:
        """The keys of `path` (else VELA2_API_KEYS_FILE) plus those of VELA2_API_KEYS."""
        env = os.environ if environ is None else environ
        path = path or env.get(ENV_API_KEYS_FILE) or None
        keys: list[ApiKey] = []
        if path:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except OSError as e:
                raise ConfigError(f"cannot read the API keys file {path!r}: {e.strerror or e}") from None
            keys += cls.parse(text, path).keys
        if env.get(ENV_API_KEYS):
            keys += cls.parse(env[ENV_API_KEYS], ENV_API_KEYS).keys
        return cls(keys)

    def check(self, authorization: str | None, model: str) -> ApiKey | Refusal:
        """The key an Authorization header presents, if it may use `model`; else why not."""
        if not authorization:
            return Refusal(401, "unauthorized", "an API key is required: Authorization: Bearer <key>")
        scheme, _, key = authorization.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return Refusal(401, "unauthorized", "the Authorization header must be: Bearer <key>")
        found = self._by_hash.get(hash_key(key)) if len(key) <= MAX_KEY_CHARS else None
        if found is None:
            return Refusal(401, "unauthorized", "unknown API key")
        if found.models is not None and model not in found.models:
            return Refusal(403, "forbidden", f"this API key (tenant {found.tenant!r}) may not use model {model!r}")
        return found


def new_key(tenant: str, models: list[str] | None = None) -> tuple[str, ApiKey]:
    """A fresh random key and its keys-file entry; ConfigError for a tenant name that cannot be one."""
    if problem := tenant_problem(tenant):
        raise ConfigError(problem)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, ApiKey(tenant, hash_key(key), frozenset(models) if models is not None else None)


def main(argv: list[str] | None = None) -> int:
    """`python -m producer.auth new TENANT [--models a,b]`: print a new key, then its keys-file line."""
    ap = argparse.ArgumentParser(prog="python -m producer.auth", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    new = sub.add_parser("new", help="make a key: prints the key, then the line for the keys file")
    new.add_argument("tenant")
    new.add_argument("--models", default=None, help="comma list of the models it may use (default: all)")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m] if args.models is not None else None
    try:
        key, entry = new_key(args.tenant, models)
    except ConfigError as e:
        print(f"python -m producer.auth: {e}", file=sys.stderr)
        return 2
    print(key)
    print(entry.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
