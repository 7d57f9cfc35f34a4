"""The exception hierarchy of the whole project.

Every error a user can cause maps to one class here; its ``code`` is the ``error.type`` of the
failed result, and its message names the field, the limit and the value given.
"""

from __future__ import annotations


class Vela2Error(Exception):
    """Base class of every error raised on purpose by vela2, worker and producer."""

    code = "internal_error"


class InvalidRequest(Vela2Error, ValueError):
    """A request (row or SystemOne) that cannot be answered as sent."""

    code = "invalid_request"


class LimitExceeded(InvalidRequest):
    """A request over a documented limit (text length, options, labels, tasks, message size)."""

    code = "limit_exceeded"


class ModelMismatch(InvalidRequest):
    """A SystemOne request naming a model other than the loaded checkpoint."""

    code = "model_mismatch"


class CheckpointError(Vela2Error):
    """A checkpoint directory that is missing files or holds inconsistent tensors."""

    code = "checkpoint_error"


class PrecisionError(Vela2Error, ValueError):
    """A precision the loaded model cannot run (fp32 asked of a model held in bf16)."""

    code = "precision_error"


class ModelError(Vela2Error):
    """The model failed on a batch even after splitting it down to this request alone."""

    code = "model_error"


class Expired(Vela2Error):
    """The request's deadline passed before it was scored."""

    code = "expired"


class ConfigError(Vela2Error, ValueError):
    """A worker or producer setting that is inconsistent (e.g. visibility timeout too short)."""

    code = "config_error"


class ResultExpired(Vela2Error, LookupError):
    """A request was answered, but its stored result has expired (result_expires) before it was read."""

    code = "result_expired"


class StorageError(Vela2Error):
    """A result the result store would not take as it was (an error result stands in for it)."""

    code = "storage_error"


class UploadTimeout(Vela2Error):
    """A bulk job's input took longer than allowed to register (the HTTP route's --upload-timeout-s):
    the job ended `failed`; what it had queued is cancelled. HTTP 408."""

    code = "upload_timeout"


class StoreFull(Vela2Error):
    """Redis is up but refuses writes: it reached its maxmemory (OOM). Nothing of the refused
    submission was queued. Results expire (result_expires) or can be read and deleted; an operator can
    raise maxmemory. HTTP 507."""

    code = "store_full"


class QuotaExceeded(Vela2Error):
    """A tenant's quota refused a submission before anything of it was written: `quota` (its name),
    `limit` and `usage` (what it is, or would have been), `retry_after_s` (when trying again may
    pass). HTTP `status` ``quota_exceeded``: 429, or 507 for stored_bytes (storage)."""

    code = "quota_exceeded"

    def __init__(self, quota: str, limit: int, usage: int, retry_after_s: int = 1, status: int = 429):
        super().__init__(f"quota {quota} of this tenant is {limit:,}; this would make it {usage:,}"
                         if status == 429 else f"quota {quota} of this tenant is {limit:,}; it holds {usage:,}")
        self.quota, self.limit, self.usage, self.retry_after_s = quota, limit, usage, retry_after_s
        self.status = status


class PoisonRequest(ModelError):
    """A request that was running every time a worker process died, `max_attempts` times; it is
    answered with this error and moved to the model's dead-letter list."""

    code = "poison"


class IdConflict(Vela2Error, ValueError):
    """A request id already names a request with other content (answered or pending): its answer is
    not this request's. Send it under a new id (or the same content to get the stored answer)."""

    code = "id_conflict"

    def __init__(self, message: str, ids: list[str] | None = None):
        super().__init__(message)
        self.ids = ids or []


class JobNotFound(Vela2Error, LookupError):
    """No bulk job has this id (never created, another tenant's, or expired with its results)."""

    code = "job_not_found"


class CellUnavailable(Vela2Error, ConnectionError):
    """A cell (vela2.wire.cells) did not answer: the requests whose ids it holds were not queued or
    read (`ids`, as the caller named them); requests of the other cells were served (`done`: what was
    read from them, for a many-read). Retry those ids later: a submit is idempotent by id."""

    code = "cell_unavailable"

    def __init__(self, cell: str, ids: list[str], cause: BaseException, done: dict | None = None):
        shown = ", ".join(repr(i) for i in ids[:5]) + (f" and {len(ids) - 5:,} more" if len(ids) > 5 else "")
        super().__init__(f"cell {cell} is unavailable ({type(cause).__name__}: {cause}); "
                         f"{len(ids):,} request(s) of its slots were not served: {shown}")
        self.cell, self.ids, self.done = cell, ids, done or {}


class NoWorker(Vela2Error, TimeoutError):
    """No worker of the model has beaten (nor said it is starting) for the grace period: a wait for an
    answer ends with this at once instead of waiting out its timeout (a TimeoutError still, for code
    that handles a timeout). The request stays queued and is answered once a worker of the model runs.
    `model`, `idle_s` (how long none has beaten, as this client knows it), `grace_s`, `done` (a
    many-wait: the answers read, by id). HTTP 503 ``no_worker``."""

    code = "no_worker"

    def __init__(self, model: str, idle_s: float, grace_s: float, on_record: bool = True,
                 done: dict | None = None):
        seen = "" if on_record else " (none on record: the time since this client first looked)"
        super().__init__(f"no worker of model {model!r} has beaten in the last {idle_s:.0f} s{seen} "
                         f"(grace {grace_s:g} s), and none is starting: the request stays queued until one "
                         f"serves it: start one with `vela2 worker --checkpoint DIR --model {model}`")
        self.model, self.idle_s, self.grace_s, self.done = model, idle_s, grace_s, done or {}
