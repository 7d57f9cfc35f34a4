"""The stored result of one request: Celery's result meta plus our RowResult, written once.

Key `celery-task-meta-<id>` (vela2.wire.keys.result_key) holds JSON in the layout of Celery's Redis
result backend, so `AsyncResult(id).get()` and any plain Redis GET read it:

    {"status": "SUCCESS" | "FAILURE", "result": ..., "traceback": null, "children": [],
     "date_done": ISO, "task_id": id, "vela2": RowResult.to_json_dict(), "vela2_answer": {...}?}

SUCCESS holds ok and expired results (`result` = the RowResult dict, or the SystemOne answer for
a SystemOne request); FAILURE holds error results with `result` = {"exc_type", "exc_message",
"exc_module": "builtins"}, so `AsyncResult.get()` raises a readable exception without importing
our code. Writing is SET NX (first answer wins, a duplicate delivery never changes it) plus a
PUBLISH on the key's channel, which Celery's result consumer listens on.

The writer (`ResultStore`, `row_meta`, `chunk_meta`) is the worker's; the readers (`parse_meta`,
`parse_answer`, `read_results`, `read_answers`) are the producer's. Callers hand in their Redis
client (redis-py or fakeredis, sync).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from vela2 import errors
from vela2.schemas import RowResult, Status
from vela2.wire.keys import result_key

log = logging.getLogger(__name__)


DEFAULT_RESULT_EXPIRES_S = 86_400  # one day, Celery's default result_expires
DEFAULT_SUBMITTED_TTL_S = DEFAULT_RESULT_EXPIRES_S  # a submitted marker lives as long as a result

# Write once: SET NX EX, and announce the value on the key's channel only when it was written.
STORE_SCRIPT = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  redis.call('PUBLISH', KEYS[1], ARGV[1])
  return 1
end
return 0
"""


def _error_class_names() -> dict[str, str]:
    """error.type code -> exception class name ("invalid_request" -> "InvalidRequest")."""
    names: dict[str, str] = {}
    todo: list[type[errors.Vela2Error]] = [errors.Vela2Error]
    while todo:
        cls = todo.pop()
        names.setdefault(cls.code, cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


_EXC_NAMES = _error_class_names()


def exc_type_name(code: str) -> str:
    """The class-ish name Celery shows for an error code: ours by class, anything else CamelCased."""
    if code in _EXC_NAMES:
        return _EXC_NAMES[code]
    if code.isidentifier() and not code.islower():
        return code  # already a class name, e.g. "OutOfMemoryError"
    return "".join(part.capitalize() for part in code.split("_")) or "Error"


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def row_meta(task_id: str, result: RowResult, answer: dict[str, Any] | None = None) -> dict[str, Any]:
    """The stored meta of one request's result.

    `answer`: the SystemOne answer dict of a SystemOne request (stored beside the RowResult and used
    as Celery's `result` when the request succeeded).
    """
    row = result.to_json_dict()
    meta: dict[str, Any] = {
        "status": "SUCCESS",
        "result": answer if answer is not None else row,
        "traceback": None,
        "children": [],
        "date_done": _now_iso(),
        "task_id": task_id,
        "vela2": row,
    }
    if answer is not None:
        meta["vela2_answer"] = answer
    if result.status == Status.error:
        err = result.error
        code, message = (err.type, err.message) if err is not None else ("internal_error", "unknown error")
        meta["status"] = "FAILURE"
        meta["result"] = {"exc_type": exc_type_name(code), "exc_message": [message], "exc_module": "builtins"}
    return meta


def chunk_meta(chunk_id: str, counts: dict[str, int]) -> dict[str, Any]:
    """The small SUCCESS summary stored under a bulk chunk's own message id."""
    return {
        "status": "SUCCESS",
        "result": {"chunk": chunk_id, **counts},
        "traceback": None,
        "children": [],
        "date_done": _now_iso(),
        "task_id": chunk_id,
    }


def encode_meta(meta: dict[str, Any]) -> str:
    """Compact JSON of a meta dict."""
    return json.dumps(meta, ensure_ascii=False, separators=(",", ":"))


@dataclass
class ResultStore:
    """Writes results under their ids (write-once, with TTL) and checks which ids already have one."""

    redis: Any  # a redis.Redis (or fakeredis) client
    ttl_s: int = DEFAULT_RESULT_EXPIRES_S

    def __post_init__(self) -> None:
        self._script = self.redis.register_script(STORE_SCRIPT)

    def existing(self, ids: Iterable[str]) -> set[str]:
        """The ids among `ids` that already have a stored result (one pipelined round trip)."""
        ids = list(ids)
        if not ids:
            return set()
        pipe = self.redis.pipeline(transaction=False)
        for rid in ids:
            pipe.exists(result_key(rid))
        return {rid for rid, n in zip(ids, pipe.execute(), strict=True) if n}

    def store(self, items: list[tuple[str, dict[str, Any]]]) -> list[bool]:
        """Write (id, meta) pairs in one pipelined round trip; True where this call wrote the value,
        False where a result was already there (which is left unchanged)."""
        if not items:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for rid, meta in items:
            self._script(keys=[result_key(rid)], args=[encode_meta(meta), int(self.ttl_s)], client=pipe)
        return [bool(x) for x in pipe.execute()]


# --- reading ---------------------------------------------------------------------------------


def parse_meta(raw: bytes | str | None) -> RowResult | None:
    """The RowResult in a stored meta; None when there is none (missing key, a chunk summary)."""
    if raw is None:
        return None
    meta = json.loads(raw)
    row = meta.get("vela2") if isinstance(meta, dict) else None
    return RowResult.model_validate(row) if row is not None else None


def parse_answer(raw: bytes | str | None) -> dict[str, Any] | None:
    """The product answer in a stored meta: the SystemOne answer of a SystemOne request, else the
    RowResult dict; None when there is none."""
    if raw is None:
        return None
    meta = json.loads(raw)
    if not isinstance(meta, dict):
        return None
    return meta.get("vela2_answer") or meta.get("vela2")


def _mget(redis: Any, ids: list[str]) -> list[Any]:
    return redis.mget([result_key(rid) for rid in ids]) if ids else []


def read_results(redis: Any, ids: Iterable[str]) -> dict[str, RowResult | None]:
    """id -> stored RowResult (None while there is none), with ONE round trip (MGET)."""
    ids = list(ids)
    return {rid: parse_meta(raw) for rid, raw in zip(ids, _mget(redis, ids), strict=True)}


def read_answers(redis: Any, ids: Iterable[str]) -> dict[str, dict[str, Any] | None]:
    """id -> stored answer dict (see `parse_answer`; None while there is none), one round trip."""
    ids = list(ids)
    return {rid: parse_answer(raw) for rid, raw in zip(ids, _mget(redis, ids), strict=True)}
