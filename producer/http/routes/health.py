"""GET /healthz (liveness: 200 with the queue depths when Redis answers, else 503) and GET /readyz
(readiness: 200 when at least one worker of the model has beaten within READY_STALE_S, else 503:
``no_worker``, or Redis ``unavailable``). Workers beat every HEARTBEAT_S into
``vela2:workers:<model>`` while their engine makes progress; a stalled or stopped one drops out.
Over cells both read every cell at once and merge: 200 ``degraded`` while some cells do not answer
(or, for /readyz, have no live worker), 503 only when none does; each cell's figures in ``cells``.
Neither needs an API key."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

import redis.exceptions
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from producer.http.deps import Shared
from producer.http.models import CellHealth, CellReady, Health, Ready
from vela2.wire import taking
from vela2.wire.keys import HEARTBEAT_S, queue_name, workers_key

READY_STALE_S = 3 * HEARTBEAT_S  # a worker whose last heartbeat is older is not counted live

router = APIRouter()


def _why(e: BaseException) -> str:
    return str(e) or type(e).__name__


async def _depths(redis: Any, model: str) -> dict[str, int]:
    """{online, backfill}: the messages waiting on the model's queues of one Redis."""
    await redis.ping()
    queues = [queue_name(model), queue_name(model, backfill=True)]
    depths = taking.read_depths(queues, await taking.DEPTH.run_async(redis, *taking.depth_call(queues)))
    online, backfill = (depths[q][0] for q in queues)
    return {"online": int(online), "backfill": int(backfill)}


async def _each(state: Any, read: Any) -> dict[str, Any]:
    """Cell name -> read(redis) of every Redis of the route at once (a RedisError for one that failed)."""
    named = state.redises()
    got = await asyncio.gather(*(read(r) for _, r in named), return_exceptions=True)
    for g in got:
        if isinstance(g, BaseException) and not isinstance(g, redis.exceptions.RedisError):
            raise g
    return dict(zip((n for n, _ in named), got, strict=True))


@router.get(
    "/healthz",
    summary="Liveness: Redis reachable",
    response_model=Health,
    responses={503: {"model": Health, "description": "redis is unreachable (over cells: no cell answers)"}},
)
async def healthz(state: Shared) -> JSONResponse:
    model = state.settings.model
    got = await _each(state, lambda r: _depths(r, model))
    ok = {n: g for n, g in got.items() if not isinstance(g, BaseException)}
    failed = {n: g for n, g in got.items() if isinstance(g, BaseException)}
    cells = None if state.map is None else {
        n: CellHealth(redis=_why(g), queue_depth=None) if isinstance(g, BaseException)
        else CellHealth(redis="ok", queue_depth=g) for n, g in got.items()}
    if not ok:
        body = Health(status="unavailable", model=model, redis=_why(next(iter(failed.values()))), cells=cells)
        return JSONResponse(body.model_dump(mode="json", exclude_none=True), status_code=503)
    depth = {k: sum(d[k] for d in ok.values()) for k in ("online", "backfill")}
    body = Health(status="degraded" if failed else "ok", model=model,
                  redis=_why(next(iter(failed.values()))) if failed else "ok", queue_depth=depth, cells=cells)
    return JSONResponse(body.model_dump(mode="json", exclude_none=True))


@router.get(
    "/readyz",
    summary="Readiness: Redis reachable and a live worker serving the model",
    response_model=Ready,
    responses={503: {"model": Ready, "description": "no live worker for the model, or Redis unreachable"}},
)
async def readyz(state: Shared) -> JSONResponse:
    model = state.settings.model
    since = time.time() - READY_STALE_S
    got = await _each(state, lambda r: r.zcount(workers_key(model), since, "+inf"))
    live = {n: int(g) for n, g in got.items() if not isinstance(g, BaseException)}
    failed = {n: g for n, g in got.items() if isinstance(g, BaseException)}
    cells = None if state.map is None else {
        n: CellReady(redis=_why(g), workers=0) if isinstance(g, BaseException)
        else CellReady(redis="ok", workers=int(g)) for n, g in got.items()}
    workers = sum(live.values())
    redis_said = _why(next(iter(failed.values()))) if failed else "ok"
    status: Literal["ready", "degraded", "no_worker", "unavailable"]
    if not live:
        status = "unavailable"
    elif not workers:
        status = "no_worker"
    else:
        status = "degraded" if failed or not all(live.values()) else "ready"
    body = Ready(status=status, model=model, workers=workers, redis=redis_said, cells=cells)
    return JSONResponse(body.model_dump(mode="json", exclude_none=True),
                        status_code=200 if status in ("ready", "degraded") else 503)
