"""The response models of the HTTP route: the bodies its OpenAPI document describes (their
docstrings are the schemas' descriptions there, so they are part of the contract)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from vela2.api.schemas import ErrorInfo
from vela2.api.systemone import SYSTEM_ONE_VERSION


class Pending(BaseModel):
    """A request queued but not answered yet: poll `result_url`."""

    id: str
    status: Literal["pending"] = "pending"
    result_url: str


class ErrorAnswer(BaseModel):
    """A refused request (the SystemOne error answer; id / model null when the body had none)."""

    version: Literal["1"] = SYSTEM_ONE_VERSION
    model: str | None = None
    id: str | None = None
    status: Literal["error"] = "error"
    error: ErrorInfo


class Health(BaseModel):
    """Liveness of the route and its Redis."""

    status: Literal["ok", "unavailable"]
    model: str
    redis: str  # "ok", or the connection error
    queue_depth: dict[str, int] | None = None  # online / backfill messages waiting


class Ready(BaseModel):
    """Readiness: a live worker serves the model (its heartbeat within the last READY_STALE_S)."""

    status: Literal["ready", "no_worker", "unavailable"]
    model: str
    workers: int  # workers of the model with a fresh heartbeat
    redis: str


# A 404's body (no docstring: it would become the schema's description in the OpenAPI document).
class NotFound(BaseModel):
    detail: str


class BatchCounts(BaseModel):
    """OpenAI's request counts: completed = ok; failed = error + expired + cancelled."""

    total: int
    completed: int
    failed: int


class Batch(BaseModel):
    """A bulk job (vela2.wire.jobs.JobInfo.to_dict): OpenAI's batch fields plus exact counts by status
    (queued, ok, error, expired, cancelled)."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str
    status: Literal["validating", "in_progress", "cancelling", "completed", "cancelled", "expired", "failed"]
    created_at: int
    expires_at: int
    completion_window: str
    ended_at: int | None
    cancelling_at: int | None
    input_done: bool
    request_counts: BatchCounts
    counts: dict[str, int]
    served_by: dict[str, int]  # "<model> <digest, 12 digits> <precision>" -> ok lines it answered
    metadata: dict[str, Any]
    failed_reason: str | None = None  # a failed job: why its input could not be all registered
