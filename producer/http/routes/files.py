"""The Files API, as OpenAI's (producer.files keeps the files):
- POST /v1/files: a multipart upload (`file`, `purpose` = ``batch``) of at most ``max_batch_bytes``:
  200 with the FileObject;
- GET /v1/files?purpose=&limit=&order=&after=: the tenant's files, newest first (OpenAI's list page);
- GET /v1/files/{id}: one FileObject; GET /v1/files/{id}/content: its bytes, streamed;
- DELETE /v1/files/{id}: ``{"id", "object": "file", "deleted": true}``.
A batch's output and error files (`<batch id>-output`, `<batch id>-errors`) are views of its job's
answers: their content is streamed from the stored answers once the job has ended (the ok lines, or
the others in OpenAI's error-file shape). Errors are the route's one envelope (producer.http.responses),
which holds OpenAI's ``{"error": {"message", "type", "param", "code"}}``: 400 a body that is no
multipart upload of a batch file, 404 no such file (unknown, another tenant's, deleted or expired), 413
over the size limit; 507 the tenant's stored_bytes quota.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.formparsers import MultiPartException, MultiPartParser

from producer import jobs
from producer.files import PURPOSES, FileInfo, Files, job_view, new_file_id
from producer.http.body import receive_body
from producer.http.deps import Shared, Tenant
from producer.http.models import FileDeleted, FileList, FileObject
from producer.http.responses import ERROR, error_response
from producer.http.state import RouteState
from vela2.errors import JobNotFound
from vela2.wire.keys import id_problem

router = APIRouter()

MULTIPART_SLACK = 64 << 10  # bytes a multipart body may hold beyond its file (boundaries, headers, purpose)
MAX_LIST = 10_000  # the largest `limit` of GET /v1/files

async def _form(request: Request, body: bytes) -> tuple[Any, Any] | JSONResponse:
    """(the upload, purpose) of a multipart body, or the 400 saying what is missing."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        return error_response(400, "invalid_request", "POST /v1/files takes a multipart/form-data body with the "
                              f"fields file and purpose; got Content-Type {request.headers.get('content-type')!r}")

    async def stream() -> AsyncGenerator[bytes, None]:
        yield body

    try:
        form = await MultiPartParser(request.headers, stream(), max_files=1, max_fields=8).parse()
    except MultiPartException as e:
        return error_response(400, "invalid_request", f"the multipart body could not be read: {e.message}")
    unknown = sorted(set(form.keys()) - {"file", "purpose"})
    if unknown:
        return error_response(400, "invalid_request", f"unknown field(s) {', '.join(map(repr, unknown))[:300]}: "
                              "an upload has the fields file and purpose", unknown[0][:100])
    upload, purpose = form.get("file"), form.get("purpose")
    if upload is None or isinstance(upload, str):
        return error_response(400, "invalid_request", "the multipart body has no file field", "file")
    if purpose not in PURPOSES:
        return error_response(400, "invalid_request", f"purpose must be one of {', '.join(PURPOSES)}; "
                              f"got {purpose!r}", "purpose")
    return upload, purpose


@router.post("/v1/files", summary="Upload a file (purpose batch: a batch's JSONL input)", response_model=FileObject,
             responses={400: ERROR, 413: ERROR, 507: ERROR},
             # the body is read raw (its size bounded as it arrives), so its form is declared here
             openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
                 "type": "object", "required": ["file", "purpose"], "additionalProperties": False,
                 "properties": {"file": {"type": "string", "format": "binary", "minLength": 1},
                                "purpose": {"type": "string", "enum": list(PURPOSES)}}}}}}})
async def upload_file(request: Request, tenant: Tenant, state: Shared) -> JSONResponse:
    limit = state.settings.max_batch_bytes
    body = await receive_body(request, limit + MULTIPART_SLACK, state.settings.body_timeout_s)
    if isinstance(body, JSONResponse):
        return body
    form = await _form(request, body)
    if isinstance(form, JSONResponse):
        return form
    upload, purpose = form
    content = await upload.read()
    if len(content) > limit:
        return error_response(413, "limit_exceeded", f"the file has {len(content):,} bytes; limit {limit:,} "
                              "(--max-batch-bytes)", "file")
    if not content:
        return error_response(400, "invalid_request", "the file is empty: a batch file needs at least one line", "file")
    await state.usage.check([r for _, r in state.redises()], tenant or "", getattr(request.state, "quotas", None))
    file_id = new_file_id()
    info = await state.files(tenant, file_id).put(file_id, upload.filename or "upload.jsonl", purpose, content)
    return JSONResponse(info.to_dict())


@router.get("/v1/files", summary="The tenant's files, newest first", response_model=FileList)
async def list_files(tenant: Tenant, state: Shared, purpose: str | None = None,
                     limit: int = Query(10_000, ge=1, le=MAX_LIST), order: str = Query("desc", pattern="^(asc|desc)$"),
                     after: str | None = None) -> JSONResponse:
    got: list[FileInfo] = []
    for _, redis in state.redises():  # over cells: every cell's, merged by creation
        got += await Files(redis, tenant, state.client(tenant).scope.wire).all(purpose)
    got.sort(key=lambda f: (f.created_at, f.id), reverse=order == "desc")
    if after is not None:
        ids = [f.id for f in got]
        got = got[ids.index(after) + 1:] if after in ids else []
    page, more = got[:limit], len(got) > limit
    data = [f.to_dict() for f in page]
    return JSONResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None, "has_more": more})


async def _view_info(state: RouteState, tenant: str | None, file_id: str) -> tuple[Any, str] | None:
    """(job, "output" / "errors") of a batch's output or error file that exists: its job ended with such lines."""
    view = job_view(file_id)
    if view is None:
        return None
    job_id, kind = view
    try:
        info = await asyncio.to_thread(jobs.job_info, state.jobs_client(tenant), job_id)
    except JobNotFound:
        return None
    d = info.to_dict()
    return (info, kind) if d["output_file_id" if kind == "output" else "error_file_id"] == file_id else None


def _view_lines(state: RouteState, tenant: str | None, job_id: str, kind: str) -> Iterator[bytes]:
    """A job's output (ok lines) or error file (the others), as JSONL, from its stored answers."""
    for line, ok in jobs.job_lines(state.jobs_client(tenant), job_id):
        if ok == (kind == "output"):
            yield (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


async def _info(state: RouteState, tenant: str | None, file_id: str) -> dict[str, Any] | None:
    view = await _view_info(state, tenant, file_id)
    if view is not None:
        info, kind = view
        return {"id": file_id, "object": "file", "bytes": await asyncio.to_thread(  # counted as streamed
            lambda: sum(map(len, _view_lines(state, tenant, info.id, kind)))), "created_at": int(info.ended_at or 0),
            "filename": f"{info.id}_{kind}.jsonl", "purpose": "batch_output", "status": "processed",
            "expires_at": None, "status_details": None}
    found = await state.files(tenant, file_id).info(file_id)
    return None if found is None else found.to_dict()


def _no_file(file_id: str) -> JSONResponse:
    return error_response(404, "not_found", f"no file {file_id[:200]!r}: unknown, another tenant's, deleted or expired")


@router.get("/v1/files/{file_id}", summary="A file", response_model=FileObject, responses={404: ERROR})
async def get_file(file_id: str, tenant: Tenant, state: Shared) -> JSONResponse:
    if id_problem(file_id):  # an id no file can have (over the id limit, not encodable)
        return _no_file(file_id)
    found = await _info(state, tenant, file_id)
    return _no_file(file_id) if found is None else JSONResponse(found)


@router.get("/v1/files/{file_id}/content", summary="A file's content, streamed", responses={
    200: {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}, 404: ERROR})
async def file_content(file_id: str, tenant: Tenant, state: Shared) -> Any:
    if id_problem(file_id):
        return _no_file(file_id)
    view = await _view_info(state, tenant, file_id)
    if view is not None:
        info, kind = view
        return StreamingResponse(_view_lines(state, tenant, info.id, kind), media_type="application/jsonl")
    files = state.files(tenant, file_id)
    if await files.info(file_id) is None:
        return _no_file(file_id)
    return StreamingResponse(files.content(file_id), media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}", summary="Delete a file", response_model=FileDeleted,
               responses={400: ERROR, 404: ERROR})
async def delete_file(file_id: str, tenant: Tenant, state: Shared) -> JSONResponse:
    if id_problem(file_id):
        return _no_file(file_id)
    if job_view(file_id) is not None:
        return error_response(400, "invalid_request", f"{file_id!r} is a batch's output or error file: a view of "
                              "its answers, which go when the batch's results expire")
    if not await state.files(tenant, file_id).delete(file_id):
        return _no_file(file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})
