"""Completion callbacks of bulk jobs (issue 39): when a job that names a webhook URL ends (`completed`,
`failed`, `expired`, `cancelled`), the HTTP route POSTs an event in OpenAI's webhook shape,

    {"id": "evt_<hex>", "object": "event", "type": "batch.completed", "created_at": <unix s>,
     "data": {"id": "batch_<hex>"}}

signed per the Standard Webhooks scheme: headers `webhook-id` (the event's id, the same on every
retry: receivers deduplicate by it), `webhook-timestamp` (unix seconds of this attempt) and
`webhook-signature` (`v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`, keyed by the secret's
bytes: `whsec_<base64>` decoded). The `openai` package's `client.webhooks.unwrap(body, headers)`
verifies it as OpenAI's own.

Delivery is at least once, never from a worker: a job with a webhook is entered in its cell's
`vela2:webhooks` sorted set (job -> when to look next) when it is created; every route process looks
at the due entries every POLL_S, takes each for LEASE_S (SET NX, so replicas do not send one event at
once), and POSTs the event of an ended job; a 2xx answer removes the entry, anything else (an error,
a timeout, another status; redirects are not followed) retries with backoff (BACKOFF_START_S,
doubling up to BACKOFF_MAX_S) up to MAX_ATTEMPTS, then gives up (logged, and `webhook_failed_at` on
the job). A job not ended yet is looked at again after POLL_S.

URLs are checked against the operator's allowlist (`--webhook-allow`, origins such as
`https://hooks.example.com`, `https://*.example.com`, `http://127.0.0.1:8080`; a `*` port allows any)
when the job is created and again before each POST: no request goes to a host the operator did not
name (SSRF). No allowlist: webhooks are refused.
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import hashlib
import hmac
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from vela2.errors import ConfigError
from vela2.wire.jobs import ENDED, JOB_FIELDS, parse_job
from vela2.wire.keys import job_key

log = logging.getLogger(__name__)

WEBHOOKS_KEY = "vela2:webhooks"  # job (scoped id) -> unix time to look at it next
LEASE_PREFIX = "vela2:webhook-lease:"
ENV_WEBHOOK_SECRET = "VELA2_WEBHOOK_SECRET"
POLL_S = 1.0  # how often a route process looks for due entries
LEASE_S = 30  # one process's hold on an entry while it sends
SEND_TIMEOUT_S = 10.0  # one POST's limit
BACKOFF_START_S, BACKOFF_MAX_S = 2.0, 3600.0
MAX_ATTEMPTS = 16  # about 10 hours of retries with the backoff above
MAX_URL_CHARS = 2048
BATCH = 100  # entries one look takes


def new_secret() -> str:
    """A fresh signing secret in the Standard Webhooks form (`whsec_<base64 of 24 random bytes>`)."""
    return "whsec_" + base64.b64encode(uuid.uuid4().bytes + uuid.uuid4().bytes[:8]).decode()


def secret_bytes(secret: str) -> bytes:
    """The HMAC key of a secret: `whsec_<base64>` decoded, else its UTF-8 bytes."""
    return base64.b64decode(secret[6:]) if secret.startswith("whsec_") else secret.encode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value: `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`."""
    mac = hmac.new(secret_bytes(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


@dataclass(frozen=True)
class WebhookPolicy:
    """What the operator allows: the origins webhooks may go to and the signing secret (per tenant,
    else the route's)."""

    allow: tuple[str, ...] = ()
    secret: str | None = None
    tenant_secrets: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for origin in self.allow:
            parse_origin(origin)  # ConfigError at start for an entry that is no origin

    def secret_of(self, tenant: str | None) -> str | None:
        return self.tenant_secrets.get(tenant or "", self.secret)

    def problem(self, url: Any, tenant: str | None) -> str | None:
        """Why `url` may not be a webhook of `tenant`'s jobs, or None when it may."""
        if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
            return f"webhook_url must be a URL of at most {MAX_URL_CHARS} characters"
        if not self.allow:
            return "webhooks are off: the route was started without --webhook-allow"
        if self.secret_of(tenant) is None:
            return "webhooks are off: no signing secret (--webhook-secret or the key's webhook_secret)"
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:
            return f"webhook_url {url[:200]!r} is no URL: {e}"
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
            return f"webhook_url {url[:200]!r} must be http(s)://host[:port]/path, without credentials"
        port = port or (443 if parts.scheme == "https" else 80)
        for origin in self.allow:
            scheme, host, want = parse_origin(origin)
            if (scheme == parts.scheme and fnmatch.fnmatchcase(parts.hostname.lower(), host)
                    and want in ("*", str(port))):
                return None
        return f"webhook_url {url[:200]!r} is not in the allowlist (--webhook-allow)"


ORIGIN_RE = re.compile(r"(https?)://([A-Za-z0-9*.\-]+)(?::(\d+|\*))?/?")


def parse_origin(origin: str) -> tuple[str, str, str]:
    """(scheme, host pattern, port or "*") of an allowlist entry `scheme://host[:port]` (the host may
    hold `*`: `*.example.com`; no port: the scheme's); ConfigError naming it otherwise."""
    m = ORIGIN_RE.fullmatch(origin.strip())
    if m is None:
        raise ConfigError(f"--webhook-allow {origin!r}: an origin like https://hooks.example.com, "
                          "https://*.example.com or http://127.0.0.1:8080")
    scheme, host, port = m.group(1), m.group(2).lower(), m.group(3)
    return scheme, host, port or ("443" if scheme == "https" else "80")


def event(info: Any) -> dict[str, Any]:
    """The event of an ended job (OpenAI's batch webhook events): its id is the same for every
    attempt, so a receiver can drop a repeat."""
    kind = {"completed": "batch.completed", "failed": "batch.failed", "expired": "batch.expired",
            "cancelled": "batch.cancelled"}[info.status]
    evt = "evt_" + hashlib.sha256(f"{info.id} {info.status}".encode()).hexdigest()[:32]
    at = int(info.ended_at or info.beat or info.created_at)
    return {"id": evt, "object": "event", "type": kind, "created_at": at, "data": {"id": info.id}}


async def register(redis: Any, job_wire_id: str, url: str) -> None:
    """Note `url` on the job's record and enter the job among those whose end is to be told."""
    pipe = redis.pipeline(transaction=True)
    pipe.hset(job_key(job_wire_id), "webhook_url", url)
    pipe.zadd(WEBHOOKS_KEY, {job_wire_id: time.time() + POLL_S})
    await pipe.execute()


class Deliverer:
    """The background task of one route process: sends the due events of every cell's jobs."""

    def __init__(self, redises: list[Any], policy: WebhookPolicy, poll_s: float = POLL_S):
        self.redises, self.policy, self.poll_s = redises, policy, poll_s
        self.sent = 0  # events delivered by this process (tests read it)
        self._task: asyncio.Task | None = None
        self._http: Any = None

    def start(self) -> None:
        import httpx

        self._http = httpx.AsyncClient(timeout=SEND_TIMEOUT_S, follow_redirects=False)
        self._task = asyncio.create_task(self._run(), name="vela2-webhooks")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._http is not None:
            await self._http.aclose()

    async def _run(self) -> None:
        while True:
            for redis in self.redises:
                try:
                    await self.look(redis)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # a cell away: look again at the next tick
                    log.warning("webhooks: could not look at due events (%s: %s)", type(e).__name__, e)
            await asyncio.sleep(self.poll_s)

    async def look(self, redis: Any) -> None:
        """Send the events due now in one Redis (ended jobs), reschedule the others."""
        now = time.time()
        due = await redis.zrangebyscore(WEBHOOKS_KEY, "-inf", now, start=0, num=BATCH)
        for raw in due:
            job = raw.decode() if isinstance(raw, bytes) else raw
            if await redis.set(LEASE_PREFIX + job, "1", nx=True, ex=LEASE_S):
                try:
                    await self._one(redis, job)
                finally:
                    await redis.delete(LEASE_PREFIX + job)

    async def _one(self, redis: Any, job: str) -> None:
        values = await redis.hmget(job_key(job), [*JOB_FIELDS, "webhook_url", "webhook_attempts", "tenant"])
        info = parse_job(values[: len(JOB_FIELDS)], time.time())
        url, attempts, tenant = (v.decode() if isinstance(v, bytes) else v for v in values[len(JOB_FIELDS):])
        if info is None or not url:  # the job expired, or never had a webhook
            await redis.zrem(WEBHOOKS_KEY, job)
            return
        if info.status not in ENDED:
            await redis.zadd(WEBHOOKS_KEY, {job: time.time() + self.poll_s})
            return
        n = int(attempts or 0) + 1
        ok, why = await self._send(url, tenant or None, info)
        if ok:
            self.sent += 1
            pipe = redis.pipeline(transaction=False)
            pipe.zrem(WEBHOOKS_KEY, job)
            pipe.hset(job_key(job), mapping={"webhook_delivered_at": time.time(), "webhook_attempts": n})
            await pipe.execute()
            return
        if n >= MAX_ATTEMPTS:
            log.warning("webhooks: giving up on %s's event after %d attempts (%s)", info.id, n, why)
            pipe = redis.pipeline(transaction=False)
            pipe.zrem(WEBHOOKS_KEY, job)
            pipe.hset(job_key(job), mapping={"webhook_failed_at": time.time(), "webhook_attempts": n})
            await pipe.execute()
            return
        wait = min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** (n - 1))
        log.info("webhooks: %s's event not acknowledged (%s); attempt %d again in %g s", info.id, why, n + 1, wait)
        pipe = redis.pipeline(transaction=False)
        pipe.hset(job_key(job), "webhook_attempts", n)
        pipe.zadd(WEBHOOKS_KEY, {job: time.time() + wait})
        await pipe.execute()

    async def _send(self, url: str, tenant: str | None, info: Any) -> tuple[bool, str]:
        """POST the job's event to `url`, signed: (acknowledged, why not)."""
        problem = self.policy.problem(url, tenant)  # the allowlist may have changed since the job was made
        if problem is not None:
            return False, problem
        secret = self.policy.secret_of(tenant)
        assert secret is not None  # problem() checked it
        evt = event(info)
        body = json.dumps(evt, separators=(",", ":")).encode()
        ts = int(time.time())
        headers = {"content-type": "application/json", "webhook-id": evt["id"], "webhook-timestamp": str(ts),
                   "webhook-signature": sign(secret, evt["id"], ts, body), "user-agent": "vela2-webhooks"}
        try:
            r = await self._http.post(url, content=body, headers=headers)
        except Exception as e:  # refused, timed out, TLS: retried
            return False, f"{type(e).__name__}: {e}"
        return (200 <= r.status_code < 300), f"HTTP {r.status_code}"
