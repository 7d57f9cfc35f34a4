"""How a load run sends: through `producer.AsyncClient` on a Redis URL (rows or SystemOne requests,
one or several per message), or through the HTTP route (POST /v1/system_one, SystemOne only). A
driver sends a group of requests (one message) and returns, per request, when its answer arrived,
its status and its timings; an answer not there within the timeout is lost (status "lost")."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from vela2.config import install_hint

LOST = "lost"
DEFAULT_POLL_S = 0.002  # the AsyncClient's shortest pause between two reads of the awaited results
SUBMITS_AT_ONCE = 32  # submits of one client process in flight at once (each holds a Redis connection)
ROUTE_MAX_WAIT_S = 60.0  # the longest wait_s the route takes by default (vela2 http --max-wait-s); 202 past it


@dataclass
class Answered:
    """When (time.monotonic) a request's answer arrived (None: lost), its status and its timings."""

    at: float | None
    status: str
    timings: dict[str, float]


def _answered(answer: Any) -> Answered:
    status = str(answer.get("status", "ok")) if isinstance(answer, dict) else "ok"
    if status == "error" and isinstance(answer.get("error"), dict):
        status = f"error:{answer['error'].get('type', '?')}"
    timings = answer.get("timings") if isinstance(answer, dict) else None
    return Answered(time.monotonic(), status, dict(timings) if isinstance(timings, dict) else {})


class RedisDriver:
    """Sends with producer.AsyncClient (`backfill`: to the backfill queue; `per_message` requests
    share one message when sent together)."""

    def __init__(self, redis_url: str, model: str, *, timeout_s: float, backfill: bool = False,
                 poll_s: float = DEFAULT_POLL_S, tenant: str | None = None):
        self.redis_url, self.model, self.timeout_s, self.backfill = redis_url, model, timeout_s, backfill
        self.poll_s, self.tenant = poll_s, tenant
        self.client: Any = None
        self._submits: asyncio.Semaphore | None = None

    async def __aenter__(self) -> RedisDriver:
        from producer.aio import AsyncClient

        self.client = AsyncClient(self.redis_url, model=self.model, poll_min_s=self.poll_s,
                                  poll_max_s=max(self.poll_s, 0.02), tenant=self.tenant)
        self._submits = asyncio.Semaphore(SUBMITS_AT_ONCE)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()

    async def send(self, requests: list[dict[str, Any]]) -> list[Answered]:
        """Queue `requests` as one message, then await each answer."""
        assert self._submits is not None, "use the driver in `async with`"
        async with self._submits:  # the pool's connections are bounded: a burst waits here for one
            if len(requests) == 1:
                ids = [await self.client.submit(requests[0], backfill=self.backfill)]
            else:
                ids = await self.client.submit_many(requests, backfill=self.backfill, chunk_size=len(requests))
        return list(await asyncio.gather(*(self._wait(rid) for rid in ids)))

    async def _wait(self, rid: str) -> Answered:
        try:
            return _answered(await self.client.answer(rid, timeout_s=self.timeout_s))
        except TimeoutError:
            return Answered(None, LOST, {})
        except Exception as e:  # ResultExpired and the like: answered, in a way
            return Answered(time.monotonic(), f"error:{type(e).__name__}", {})


class HttpDriver:
    """Sends SystemOne requests to POST /v1/system_one of `base_url` (with `api_key` when given),
    waiting there up to the timeout; a 202 (answer late) is followed by GETs of its result URL."""

    def __init__(self, base_url: str, *, timeout_s: float, api_key: str | None = None, connections: int = 256):
        self.base_url, self.timeout_s = base_url.rstrip("/"), timeout_s
        self.api_key, self.connections = api_key, connections
        self.http: Any = None

    async def __aenter__(self) -> HttpDriver:
        try:
            import httpx
        except ImportError:
            raise SystemExit(f"vela2 loadtest --http needs httpx, the 'producer' extra: {install_hint('producer')}") \
                from None
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        limits = httpx.Limits(max_connections=self.connections, max_keepalive_connections=self.connections)
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers, limits=limits,
                                      timeout=self.timeout_s + 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def send(self, requests: list[dict[str, Any]]) -> list[Answered]:
        """POST each request (the route takes one per call)."""
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: dict[str, Any]) -> Answered:
        deadline = time.monotonic() + self.timeout_s
        try:
            wait_s = min(self.timeout_s, ROUTE_MAX_WAIT_S)
            r = await self.http.post("/v1/system_one", json=request, params={"wait_s": wait_s})
            while r.status_code == 202 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
                r = await self.http.get(r.json()["result_url"])
        except Exception as e:  # the route away: every request of the point sees it
            return Answered(time.monotonic(), f"error:{type(e).__name__}", {})
        if r.status_code == 202:
            return Answered(None, LOST, {})
        try:
            body = r.json()
        except ValueError:
            return Answered(time.monotonic(), f"error:http_{r.status_code}", {})
        got = _answered(body)
        if r.status_code >= 400 and got.status == "ok":
            got.status = f"error:http_{r.status_code}"
        return got
