"""GET /healthz (liveness: 200 with the queue depths when Redis answers, else 503) and GET /readyz
(readiness: 200 when at least one worker of the model has beaten within READY_STALE_S, else 503:
``no_worker``, or Redis ``unavailable``). Workers beat every HEARTBEAT_S into
``vela2:workers:<model>`` while their engine makes progress; a stalled or stopped one drops out.
Neither needs an API key."""

from __future__ import annotations

import time

import redis.exceptions
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from producer.http.deps import Shared
from producer.http.models import Health, Ready
from vela2.wire import taking
from vela2.wire.keys import HEARTBEAT_S, queue_name, workers_key

READY_STALE_S = 3 * HEARTBEAT_S  # a worker whose last heartbeat is older is not counted live

router = APIRouter()


@router.get(
    "/healthz",
    summary="Liveness: Redis reachable",
    response_model=Health,
    responses={503: {"model": Health, "description": "redis is unreachable"}},
)
async def healthz(state: Shared) -> JSONResponse:
    model = state.settings.model
    c = state.client()
    try:
        await c.ping()
        queues = [queue_name(model), queue_name(model, backfill=True)]
        depths = taking.read_depths(queues, await taking.DEPTH.run_async(c.redis, *taking.depth_call(queues)))
        online, backfill = (depths[q][0] for q in queues)
    except redis.exceptions.RedisError as e:
        body = Health(status="unavailable", model=model, redis=str(e) or type(e).__name__)
        return JSONResponse(body.model_dump(mode="json"), status_code=503)
    depth = {"online": int(online), "backfill": int(backfill)}
    return JSONResponse(Health(status="ok", model=model, redis="ok", queue_depth=depth).model_dump(mode="json"))


@router.get(
    "/readyz",
    summary="Readiness: Redis reachable and a live worker serving the model",
    response_model=Ready,
    responses={503: {"model": Ready, "description": "no live worker for the model, or Redis unreachable"}},
)
async def readyz(state: Shared) -> JSONResponse:
    model = state.settings.model
    since = time.time() - READY_STALE_S
    try:
        live = int(await state.client().redis.zcount(workers_key(model), since, "+inf"))
    except redis.exceptions.RedisError as e:
        body = Ready(status="unavailable", model=model, workers=0, redis=str(e) or type(e).__name__)
        return JSONResponse(body.model_dump(mode="json"), status_code=503)
    body = Ready(status="ready" if live else "no_worker", model=model, workers=live, redis="ok")
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if live else 503)
