"""The bulk-job routes (producer.jobs over HTTP, as OpenAI's batches):

- POST /v1/batches?window_s=&metadata=key=value: a job from a JSONL body (rows, SystemOne requests or
  OpenAI-batch lines ``{"custom_id", "body"}``) of at most ``max_batch_bytes``: 201 with the job once
  its lines are registered and queued (bad lines become error lines of the job);
- GET /v1/batches/{id}: the job (status, exact counts, times, ``request_counts``, metadata);
- POST /v1/batches/{id}/cancel: cancel it (200 with the job; what no worker started is answered
  ``cancelled``);
- GET /v1/batches/{id}/output: its output, one JSONL line per input line in input order (streamed),
  once the job has ended (409 before).

404 for a job that is unknown, another tenant's, or expired with its results (JobNotFound, answered
by the app). producer.jobs is synchronous: it runs in worker threads, over the app's bounded
synchronous pool (RouteState.jobs_client); uploads in processes of their own (RouteState.uploads,
at most --uploads-per-tenant at once per tenant), so online requests never wait behind them.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import StringConstraints

from producer import jobs
from producer.client import Client
from producer.http.body import receive_body
from producer.http.deps import Shared, Tenant
from producer.http.models import Batch, ErrorAnswer, NotFound
from producer.http.responses import error
from producer.quotas import reserve_job, upload_lines
from vela2.api.schemas import ErrorInfo
from vela2.config import LIMITS
from vela2.errors import InvalidRequest
from vela2.wire.jobs import DEFAULT_WINDOW_S, new_job_id
from vela2.wire.keys import job_key, scoped_id

# A batch's metadata over HTTP, as OpenAI's: string pairs (within producer.jobs.submit.MAX_METADATA_BYTES as JSON)
MAX_METADATA_PAIRS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512
MetadataPair = Annotated[str, StringConstraints(
    pattern=rf"^[^=]{{1,{MAX_METADATA_KEY_CHARS}}}=[\s\S]{{0,{MAX_METADATA_VALUE_CHARS}}}$")]

JOB_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"model": NotFound, "description": "no such job (unknown, another tenant's, or expired with its results)"},
    429: {"model": ErrorAnswer, "description": "every Redis connection stayed busy (busy; Retry-After)"},
    503: {"model": ErrorAnswer, "description": "redis is unreachable"},
}

UPLOAD_RETRY_AFTER_S = 5  # Retry-After of a 429 too_many_uploads


def submit_upload(redis_url: str, broker_url: str | None, model: str, wait_replicas: int, tenant: str | None,
                  body: bytes, window_s: float, metadata: dict[str, str], max_seconds: float,
                  job_id: str) -> dict[str, Any]:
    """(in an upload process) Submit `body` as a job of `tenant` within `max_seconds` and return the
    job (Batch dict)."""
    client = Client(redis_url, model=model, broker_url=broker_url, tenant=tenant, wait_replicas=wait_replicas)
    try:
        done = jobs.submit_job(client, io.BytesIO(body), window_s=window_s, metadata=metadata,  # lines, lazily
                               max_seconds=max_seconds, job_id=job_id)
        return jobs.job_info(client, done.id).to_dict()
    finally:
        client.close()

router = APIRouter()


@router.post(
    "/v1/batches",
    summary="Create a bulk job from a JSONL body",
    status_code=201,
    response_model=Batch,
    responses={
        201: {"model": Batch, "description": "created: every line registered, its requests queued"},
        408: {"model": ErrorAnswer, "description": "the body did not arrive within --body-timeout-s, or its lines "
                                                   "were not registered within --upload-timeout-s (upload_timeout: "
                                                   "the job failed)"},
        413: {"model": ErrorAnswer, "description": "body over --max-batch-bytes"},
        429: {"model": ErrorAnswer, "description": "the tenant has --uploads-per-tenant uploads in progress "
                                                   "(too_many_uploads), its live_jobs or job_lines quota "
                                                   "(quota_exceeded: the quota, its limit and the usage; nothing "
                                                   "was created), or every Redis connection stayed busy (busy)"},
        507: {"model": ErrorAnswer, "description": "Redis refuses writes for memory (store_full), or the tenant's "
                                                   "stored results hold its stored_bytes quota (quota_exceeded)"},
        422: {"model": ErrorAnswer, "description": "no body, or window_s / metadata out of bounds"},
        **{k: v for k, v in JOB_RESPONSES.items() if k not in (404, 429)},
    },
    # Any bytes but none are a valid body (no type in its schema): each line is a request, and a line
    # that is not one becomes an error line of the job, never a refusal of the whole body.
    openapi_extra={"requestBody": {"required": True, "content": {"application/jsonl": {"schema": {
        "minLength": 1,
        "description": "one request a line: a row, a SystemOne request, or an OpenAI-batch line "
                       '{"custom_id": ..., "body": <row or SystemOne request>}; bad lines become error '
                       "lines of the job"}}}}},
)
async def create_batch(
    request: Request,
    tenant: Tenant,
    state: Shared,
    window_s: float = Query(DEFAULT_WINDOW_S, gt=0, le=LIMITS.max_deadline_s,
                            description="completion window: requests not started by then are answered expired"),
    metadata: Sequence[MetadataPair] | None = Query(
        None, max_length=MAX_METADATA_PAIRS, description=f"key=value pairs kept on the job (as OpenAI's: at "
        f"most {MAX_METADATA_PAIRS}, keys of 1-{MAX_METADATA_KEY_CHARS} characters without '=', values of at "
        f"most {MAX_METADATA_VALUE_CHARS}); repeat the parameter for each pair"),
) -> JSONResponse:
    body = await receive_body(request, state.settings.max_batch_bytes, state.settings.body_timeout_s)
    if isinstance(body, JSONResponse):
        return body
    if not body:
        return error(422, InvalidRequest("the request body is empty: a batch needs at least one line"))
    meta = dict(pair.split("=", 1) for pair in metadata or [])
    limit = state.settings.uploads_per_tenant
    running = state.uploading.get(tenant, 0)
    if running >= limit:
        message = f"{running} batch uploads of this tenant are in progress; limit {limit} (--uploads-per-tenant)"
        info = ErrorInfo(type="too_many_uploads", message=message + ": retry when one ends")
        return JSONResponse(ErrorAnswer(error=info).model_dump(mode="json"), status_code=429,
                            headers={"Retry-After": str(UPLOAD_RETRY_AFTER_S)})

    s = state.settings
    job_id = new_job_id()
    # the tenant's stored bytes checked, its live jobs and their lines counted (this one reserved),
    # before anything is written (quota_exceeded)
    quotas = getattr(request.state, "quotas", None)
    redis = state.client(tenant).redis
    await state.usage.check(redis, tenant or "", quotas)
    await reserve_job(redis, tenant or "", quotas, job_key(scoped_id(tenant, job_id)), upload_lines(body))
    state.uploading[tenant] = running + 1
    try:
        created = await asyncio.get_running_loop().run_in_executor(
            state.uploads, submit_upload, s.redis_url, s.broker_url, s.model, s.wait_replicas, tenant, body,
            window_s, meta, s.upload_timeout_s, job_id)
    finally:
        state.uploading[tenant] -= 1
        if not state.uploading[tenant]:
            del state.uploading[tenant]
    return JSONResponse(created, status_code=201)


@router.get("/v1/batches/{job_id}", summary="A bulk job: status and exact counts", response_model=Batch,
            responses=JOB_RESPONSES)
async def get_batch(job_id: str, tenant: Tenant, state: Shared) -> JSONResponse:
    info = await asyncio.to_thread(jobs.job_info, state.jobs_client(tenant), job_id)
    return JSONResponse(info.to_dict())


@router.post("/v1/batches/{job_id}/cancel", summary="Cancel a bulk job", response_model=Batch,
             responses=JOB_RESPONSES)
async def cancel_batch(job_id: str, tenant: Tenant, state: Shared) -> JSONResponse:
    info = await asyncio.to_thread(jobs.cancel_job, state.jobs_client(tenant), job_id)
    return JSONResponse(info.to_dict())


@router.get(
    "/v1/batches/{job_id}/output",
    summary="A bulk job's output, one JSONL line per input line, in input order",
    responses={
        200: {"description": "streamed JSONL: the answers (OpenAI-batch lines for custom_id input lines)",
              "content": {"application/jsonl": {"schema": {"type": "string"}}}},
        409: {"model": ErrorAnswer, "description": "the job has not ended yet (job_running)"},
        **JOB_RESPONSES,
    },
)
async def batch_output(job_id: str, tenant: Tenant, state: Shared) -> Any:
    c = state.jobs_client(tenant)
    info = await asyncio.to_thread(jobs.job_info, c, job_id)
    if not info.ended:
        info_err = ErrorInfo(type="job_running", message=f"job {job_id} is {info.status} ({info.answered:,} of "
                             f"{info.total:,} lines answered); its output is served once it has ended")
        return JSONResponse(ErrorAnswer(model=state.settings.model, error=info_err).model_dump(mode="json"),
                            status_code=409)

    def lines() -> Any:  # a sync iterator: Starlette runs it in a worker thread, page by page
        for line, _ in jobs.job_lines(c, job_id):
            yield json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"

    return StreamingResponse(lines(), media_type="application/jsonl")
