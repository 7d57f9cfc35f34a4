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
from producer.cells import CellsClient
from producer.client import Client
from producer.http.body import receive_body
from producer.http.deps import Shared, Tenant
from producer.http.errors import form_hint, jsonl_hint
from producer.http.models import Batch, BatchList
from producer.http.responses import declared, error, error_response
from producer.http.state import RouteState
from producer.quotas import reserve_job, upload_lines
from producer.webhooks import MAX_URL_CHARS, register
from vela2.config import LIMITS
from vela2.errors import InvalidRequest
from vela2.wire.cells import CellMap
from vela2.wire.jobs import DEFAULT_WINDOW_S, new_job_id, parse_window
from vela2.wire.keys import id_problem, job_key, scoped_id

# A batch's metadata over HTTP, as OpenAI's: string pairs (within producer.jobs.submit.MAX_METADATA_BYTES as JSON)
MAX_METADATA_PAIRS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512
MetadataPair = Annotated[str, StringConstraints(
    pattern=rf"^[^=]{{1,{MAX_METADATA_KEY_CHARS}}}=[\s\S]{{0,{MAX_METADATA_VALUE_CHARS}}}$")]

JOB_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: declared("no such job (not_found: unknown, another tenant's, or expired with its results)"),
    429: declared("every Redis connection stayed busy (busy; Retry-After)"),
    503: declared("redis is unreachable"),
}

UPLOAD_RETRY_AFTER_S = 5  # Retry-After of a 429 too_many_uploads
ENDPOINTS = ("/v1/system_one",)  # what a batch's lines are requests of (OpenAI's batch-create `endpoint`)
MAX_LIST = 100  # the largest `limit` of GET /v1/batches (OpenAI's)
LIST_SCAN = 10_000  # GET /v1/batches pages through the tenant's newest this many jobs


def submit_upload(where: str | CellMap, broker_url: str | None, model: str, wait_replicas: int, tenant: str | None,
                  body: bytes, window_s: float, metadata: dict[str, str], max_seconds: float,
                  job_id: str, input_file_id: str | None = None) -> dict[str, Any]:
    """(in an upload process) Submit `body` as a job of `tenant` within `max_seconds` and return the
    job (Batch dict). `where`: the Redis URL, or the route's cells (the job goes to its id's cell)."""
    client: Client | CellsClient = (
        CellsClient(where, model=model, tenant=tenant, wait_replicas=wait_replicas) if isinstance(where, CellMap)
        else Client(where, model=model, broker_url=broker_url, tenant=tenant, wait_replicas=wait_replicas))
    try:
        done = jobs.submit_job(client, io.BytesIO(body), window_s=window_s, metadata=metadata,  # lines, lazily
                               max_seconds=max_seconds, job_id=job_id, input_file_id=input_file_id)
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
        400: declared("an application/json body that is no valid batch-create request (input_file_id, endpoint, "
                      "completion_window, metadata; a SystemOne request or a row gets a hint saying where it goes)"),
        404: declared("input_file_id names no file of the tenant (not_found)"),
        408: declared("the body did not arrive within --body-timeout-s, or its lines were not registered within "
                      "--upload-timeout-s (upload_timeout: the job failed)"),
        413: declared("body over --max-batch-bytes"),
        429: declared("the tenant has --uploads-per-tenant uploads in progress (too_many_uploads), its live_jobs or "
                      "job_lines quota (quota_exceeded: the quota, its limit and the usage; nothing was created), or "
                      "every Redis connection stayed busy (busy)"),
        507: declared("Redis refuses writes for memory (store_full), or the tenant's stored results hold its "
                      "stored_bytes quota (quota_exceeded)"),
        422: declared("no body, or window_s / metadata out of bounds"),
        **{k: v for k, v in JOB_RESPONSES.items() if k not in (404, 429)},
    },
    # Any bytes but none are a valid body (no type in its schema): each line is a request, and a line
    # that is not one becomes an error line of the job, never a refusal of the whole body.
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["input_file_id", "endpoint", "completion_window"],
        "additionalProperties": False,
        "description": "OpenAI's batch-create: the lines are the file input_file_id's (POST /v1/files)",
        "properties": {
            "input_file_id": {"type": "string", "minLength": 1},
            "endpoint": {"type": "string", "enum": list(ENDPOINTS)},
            # hours up to 720, minutes up to 9,999, seconds up to 999,999: within LIMITS.max_deadline_s
            "completion_window": {"type": "string", "example": "24h", "pattern":
                                  "^(?:[1-9][0-9]?|[1-6][0-9]{2}|7[01][0-9]|720)h$|^[1-9][0-9]{0,3}m$|^[1-9][0-9]{0,5}s$"},
            "metadata": {"type": ["object", "null"], "maxProperties": MAX_METADATA_PAIRS,
                         "propertyNames": {"minLength": 1, "maxLength": MAX_METADATA_KEY_CHARS},
                         "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE_CHARS}},
            "output_expires_after": {"type": "object", "description": "accepted and ignored: outputs are views "
                                     "of the job's answers, which live result_expires_s"},
            "webhook_url": {"type": ["string", "null"], "maxLength": MAX_URL_CHARS, "description": "POSTed a "
                            "signed event when the job ends (an origin of --webhook-allow; the SDK's extra_body)"}}}},
        "application/jsonl": {"schema": {
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
    webhook_url: str | None = Query(None, max_length=MAX_URL_CHARS, description="POSTed a signed event when the "
                                    "job ends (an origin of --webhook-allow; producer.webhooks)"),
) -> JSONResponse:
    body = await receive_body(request, state.settings.max_batch_bytes, state.settings.body_timeout_s)
    if isinstance(body, JSONResponse):
        return body
    input_file_id = None
    if request.headers.get("content-type", "").split(";")[0].strip() == "application/json":
        asked = await _create_params(body, tenant, state)  # OpenAI's batches.create: the lines are a file's
        if isinstance(asked, JSONResponse):
            return asked
        body, window_s, meta, input_file_id, webhook_url = asked
    else:
        meta = dict(pair.split("=", 1) for pair in metadata or [])
    if not body:
        return error(422, InvalidRequest("the request body is empty: a batch needs at least one line"))
    webhook_url = webhook_url or getattr(request.state, "webhook_url", None)  # the job's, else its key's
    if webhook_url is not None and (problem := state.settings.webhooks.problem(webhook_url, tenant)):
        return error_response(400, "invalid_request", problem, param="webhook_url")
    return await _create(request, tenant, state, body, window_s, meta, input_file_id, webhook_url)


async def _create(request: Request, tenant: str | None, state: RouteState, body: bytes, window_s: float,
                  meta: dict[str, str], input_file_id: str | None, webhook_url: str | None) -> JSONResponse:
    """Create the job of `body`'s lines in an upload process (at most --uploads-per-tenant at once),
    its quotas checked and reserved first: 201 with the job (its webhook registered)."""
    limit = state.settings.uploads_per_tenant
    running = state.uploading.get(tenant, 0)
    if running >= limit:
        message = f"{running} batch uploads of this tenant are in progress; limit {limit} (--uploads-per-tenant)"
        return error_response(429, "too_many_uploads", message + ": retry when one ends",
                              headers={"Retry-After": str(UPLOAD_RETRY_AFTER_S)})
    s = state.settings
    job_id = new_job_id()
    # the tenant's stored bytes checked, its live jobs and their lines counted (this one reserved),
    # before anything is written (quota_exceeded)
    quotas = getattr(request.state, "quotas", None)
    await state.usage.check([r for _, r in state.redises()], tenant or "", quotas)
    try:  # counted in the cell that will hold the job (over cells: per cell)
        await reserve_job(state.job_redis(job_id), tenant or "", quotas, job_key(scoped_id(tenant, job_id)),
                          upload_lines(body))
    except Exception as e:
        raise state.cell_down(job_id, e) or e from e
    state.uploading[tenant] = running + 1
    try:
        created = await asyncio.get_running_loop().run_in_executor(
            state.uploads, submit_upload, s.cells or s.redis_url, s.broker_url, s.model, s.wait_replicas, tenant,
            body, window_s, meta, s.upload_timeout_s, job_id, input_file_id)
    except Exception as e:
        raise state.cell_down(job_id, e) or e from e
    finally:
        state.uploading[tenant] -= 1
        if not state.uploading[tenant]:
            del state.uploading[tenant]
    if webhook_url is not None:
        await register(state.job_redis(job_id), scoped_id(tenant, job_id), webhook_url)
    return JSONResponse(created, status_code=201)


async def _create_params(body: bytes, tenant: str | None,
                         state: RouteState) -> tuple[bytes, float, dict[str, str], str, str | None] | JSONResponse:
    """OpenAI's batch-create body ({input_file_id, endpoint, completion_window, metadata}) as (the input
    file's content, window_s, metadata, input_file_id), or the 400 naming what is wrong."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        return error_response(400, "invalid_request", f"the body is not JSON: {str(e)[:200]}", hint=jsonl_hint(body))
    if not isinstance(obj, dict):
        return error_response(400, "invalid_request", "a batch-create body is a JSON object {input_file_id, endpoint, "
                              "completion_window}; to send the lines themselves, POST them as application/jsonl")
    problem = create_problem(obj)
    if problem is not None:
        return error_response(400, "invalid_request", problem[1], param=problem[0],
                              hint=form_hint(obj, "/v1/batches"))
    file_id = obj["input_file_id"]
    if id_problem(file_id):  # an id no file can have: none is there
        return error_response(404, "not_found", f"no file {file_id[:200]!r}", param="input_file_id")
    files = state.files(tenant, file_id)
    found = await files.info(file_id)
    if found is None:
        return error_response(404, "not_found", f"no file {file_id[:200]!r}: unknown, another tenant's, deleted or "
                              "expired (POST /v1/files first, purpose batch)", param="input_file_id")
    if found.purpose != "batch":
        return error_response(400, "invalid_request", f"file {file_id!r} has purpose {found.purpose!r}, not batch",
                              param="input_file_id")
    content = b"".join([piece async for piece in files.content(file_id)])
    return (content, parse_window(obj["completion_window"]), dict(obj.get("metadata") or {}), file_id,
            obj.get("webhook_url"))


def create_problem(obj: dict[str, Any]) -> tuple[str, str] | None:
    """(parameter, what is wrong) of a batch-create body, or None when it is valid."""
    if not isinstance(obj.get("input_file_id"), str) or not obj["input_file_id"]:
        return "input_file_id", "input_file_id is required: the id of a file uploaded with purpose batch"
    if obj.get("endpoint") not in ENDPOINTS:
        return "endpoint", f"endpoint must be one of {', '.join(ENDPOINTS)}; got {obj.get('endpoint')!r}"
    asked = obj.get("completion_window")
    try:
        window = parse_window(asked if isinstance(asked, str) else repr(asked))
    except ValueError as e:
        return "completion_window", str(e)
    if not 0 < window <= LIMITS.max_deadline_s:
        return "completion_window", (f"completion_window is {window:g} s; it must be > 0 and at most "
                                     f"{LIMITS.max_deadline_s:,.0f} s")
    meta = obj.get("metadata")
    if meta is not None and (not isinstance(meta, dict) or len(meta) > MAX_METADATA_PAIRS or not all(
            isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= MAX_METADATA_KEY_CHARS
            and len(v) <= MAX_METADATA_VALUE_CHARS for k, v in meta.items())):
        return "metadata", (f"metadata is at most {MAX_METADATA_PAIRS} string pairs, keys of 1-{MAX_METADATA_KEY_CHARS}"
                            f" characters, values of at most {MAX_METADATA_VALUE_CHARS}")
    if obj.get("webhook_url") is not None and not isinstance(obj["webhook_url"], str):
        return "webhook_url", "webhook_url must be a URL string"
    unknown = set(obj) - {"input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after",
                          "webhook_url"}
    if unknown:
        return sorted(unknown)[0], f"unknown parameter(s): {', '.join(sorted(unknown))}"
    return None


@router.get("/v1/batches", summary="The tenant's bulk jobs, newest first (OpenAI's list page)",
            response_model=BatchList, responses={k: v for k, v in JOB_RESPONSES.items() if k != 404})
async def list_batches(tenant: Tenant, state: Shared, limit: int = Query(20, ge=1, le=MAX_LIST),
                       after: str | None = Query(None, description="the last id of the previous page")) -> JSONResponse:
    infos = await asyncio.to_thread(jobs.list_jobs, state.jobs_client(tenant), LIST_SCAN)
    if after is not None:
        ids = [info.id for info in infos]
        infos = infos[ids.index(after) + 1:] if after in ids else []
    data = [info.to_dict() for info in infos[:limit]]
    return JSONResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None, "has_more": len(infos) > limit})


@router.get("/v1/batches/{job_id}", summary="A bulk job: status and exact counts", response_model=Batch,
            responses=JOB_RESPONSES)
async def get_batch(job_id: str, tenant: Tenant, state: Shared) -> JSONResponse:
    info = await _job_call(state, job_id, jobs.job_info, state.jobs_client(tenant), job_id)
    return JSONResponse(info.to_dict())


async def _job_call(state: RouteState, job_id: str, fn: Any, *args: Any) -> Any:
    """`fn(*args)` (producer.jobs, synchronous) in a worker thread; over cells, the job's cell down
    is 503 cell_unavailable naming the cell and the job."""
    try:
        return await asyncio.to_thread(fn, *args)
    except Exception as e:
        raise state.cell_down(job_id, e) or e from e


@router.post("/v1/batches/{job_id}/cancel", summary="Cancel a bulk job", response_model=Batch,
             responses=JOB_RESPONSES)
async def cancel_batch(job_id: str, tenant: Tenant, state: Shared) -> JSONResponse:
    info = await _job_call(state, job_id, jobs.cancel_job, state.jobs_client(tenant), job_id)
    return JSONResponse(info.to_dict())


@router.get(
    "/v1/batches/{job_id}/output",
    summary="A bulk job's output, one JSONL line per input line, in input order",
    responses={
        200: {"description": "streamed JSONL: the answers (OpenAI-batch lines for custom_id input lines)",
              "content": {"application/jsonl": {"schema": {"type": "string"}}}},
        409: declared("the job has not ended yet (job_running)"),
        **JOB_RESPONSES,
    },
)
async def batch_output(job_id: str, tenant: Tenant, state: Shared) -> Any:
    c = state.jobs_client(tenant)
    info = await _job_call(state, job_id, jobs.job_info, c, job_id)
    if not info.ended:
        return error_response(409, "job_running", f"job {job_id} is {info.status} ({info.answered:,} of "
                              f"{info.total:,} lines answered); its output is served once it has ended",
                              model=state.settings.model)

    def lines() -> Any:  # a sync iterator: Starlette runs it in a worker thread, page by page
        for line, _ in jobs.job_lines(c, job_id):
            yield json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"

    return StreamingResponse(lines(), media_type="application/jsonl")
