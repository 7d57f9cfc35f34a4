"""The response models of the HTTP route: the bodies its OpenAPI document describes (their
docstrings are the schemas' descriptions there, so they are part of the contract)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from vela2.api.systemone import SYSTEM_ONE_VERSION


class Pending(BaseModel):
    """A request queued but not answered yet: poll `result_url`."""

    id: str
    status: Literal["pending"] = "pending"
    result_url: str


class ErrorDetail(BaseModel):
    """What went wrong, in OpenAI's shape: `type` names the error (its table in producer.http.app),
    `message` says what was wrong with which value, `param` the parameter or field at fault when one
    is, `code` the same as `type`; `hint` (only when there is one) what to do instead."""

    type: str
    message: str
    param: str | None = None
    code: str | None = None
    hint: str | None = None


class Error(BaseModel):
    """Every error answer of the route, whatever its status: OpenAI's error object (so the openai
    SDK reads it) in the SystemOne error answer (`model` and `id` of the request, or null when none
    was named; `status` error, or expired / cancelled for a request that ended so unscored)."""

    version: Literal["1"] = SYSTEM_ONE_VERSION
    model: str | None = None
    id: str | None = None
    status: Literal["error", "expired", "cancelled"] = "error"
    error: ErrorDetail


class CellHealth(BaseModel):
    """One Redis cell's liveness, as the route sees it (a route over cells)."""

    redis: str  # "ok", or the connection error
    queue_depth: dict[str, int] | None = None


class Health(BaseModel):
    """Liveness of the route and its Redis (over cells: ``degraded`` while some cells do not answer,
    each cell's in ``cells``; the queue depths are those of the cells that answered, summed)."""

    status: Literal["ok", "degraded", "unavailable"]
    model: str
    redis: str  # "ok", or the connection error (over cells: of the first cell that did not answer)
    queue_depth: dict[str, int] | None = None  # online / backfill messages waiting
    cells: dict[str, CellHealth] | None = None  # a route over cells: name -> its liveness


class CellReady(BaseModel):
    """One Redis cell's readiness (a route over cells)."""

    redis: str
    workers: int


class Ready(BaseModel):
    """Readiness: a live worker serves the model (its heartbeat within the last READY_STALE_S). Over
    cells: ``ready`` when every cell has one, ``degraded`` (still 200: another route replica would see
    the same cells) when some have, else 503; each cell's in ``cells``."""

    status: Literal["ready", "degraded", "no_worker", "unavailable"]
    model: str
    workers: int  # workers of the model with a fresh heartbeat (over cells: summed)
    redis: str
    cells: dict[str, CellReady] | None = None


class BatchCounts(BaseModel):
    """OpenAI's request counts: completed = ok; failed = error + expired + cancelled."""

    total: int
    completed: int
    failed: int


class BatchErrors(BaseModel):
    """OpenAI's `errors` of a batch: why it failed."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]


class Batch(BaseModel):
    """A bulk job (vela2.wire.jobs.JobInfo.to_dict): every field of OpenAI's Batch object plus exact
    counts by status (queued, ok, error, expired, cancelled), served_by, ended_at and input_done."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str
    status: Literal["validating", "in_progress", "cancelling", "completed", "cancelled", "expired", "failed"]
    input_file_id: str  # "" for a job made from a JSONL body (no file)
    output_file_id: str | None  # once ended with ok lines: a view of them (GET /v1/files/{id}/content)
    error_file_id: str | None  # once ended with lines not ok
    created_at: int
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    expires_at: int
    completion_window: str
    errors: BatchErrors | None
    request_counts: BatchCounts
    metadata: dict[str, Any]
    ended_at: int | None
    input_done: bool
    counts: dict[str, int]
    served_by: dict[str, int]  # "<model> <digest, 12 digits> <precision>" -> ok lines it answered
    failed_reason: str | None = None  # a failed job: why its input could not be all registered


class BatchList(BaseModel):
    """A page of batches (OpenAI's list shape: newest first; `after` = last_id for the next page)."""

    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileObject(BaseModel):
    """A file (OpenAI's FileObject)."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"]
    expires_at: int | None
    status_details: str | None = None


class FileList(BaseModel):
    """A page of files (OpenAI's list shape)."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    """What DELETE /v1/files/{id} answers."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool


