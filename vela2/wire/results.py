"""The stored result of one request: Celery's result meta plus our RowResult, written once.

Key `celery-task-meta-<id>` (vela2.wire.keys.result_key) holds JSON in the layout of Celery's Redis
result backend, so `AsyncResult(id).get()` and any plain Redis GET read it:

    {"status": "SUCCESS" | "FAILURE", "result": ..., "traceback": null, "children": [],
     "date_done": ISO, "task_id": id, "vela2": RowResult?, "vela2_answer": {...}?, "vela2_digest": ...?}

Nothing is stored twice:

- SUCCESS (ok, expired and cancelled results) of a plain row: `result` = the RowResult dict, no
  `vela2`.
- SUCCESS of a SystemOne request: `result` = the SystemOne answer, `vela2` = the RowResult. The rule
  a reader follows: **`vela2` beside a SUCCESS means `result` is the answer and `vela2` the row**;
  without `vela2`, `result` is both.
- FAILURE (error results): `result` = {"exc_type", "exc_message", "exc_module": "builtins"}, so
  `AsyncResult.get()` raises a readable exception without importing our code; `vela2` = the
  RowResult, and `vela2_answer` = the SystemOne answer of a SystemOne request.

`vela2_digest` is the request's content digest (CLAIM_SCRIPT). Results written before this layout
(by an older worker: `vela2` on every result, `vela2_answer` beside a SystemOne SUCCESS too; the rule
holds for them as well, a plain row's `result` being its row) read the same for as long as they
live: every reader takes the row and the answer through `meta_row` / `meta_answer` (in Lua:
META_ROW_LUA), which read both layouts. A bulk chunk's summary is a SUCCESS whose `result` is no
row (`chunk_meta`): neither returns anything for it.

Writing is SET NX (first answer wins, a duplicate delivery never changes it) plus a PUBLISH on the
key's channel, which Celery's result consumer listens on.

A result of a bulk job's line lives `ResultStore.ttl_s` (the worker's `result_expires_s`, a day: a
job's answers are read back when the job ends); any other (online, backfill, a chunk's summary)
`ResultStore.online_ttl_s` (`online_result_expires_s`, an hour: read by its waiter within seconds),
never longer than `ttl_s`.

The submitted marker (`vela2:submitted:<id>`, set by a tracking producer with the queue as value)
becomes "answered" when the result is written, and then lives `expired_marker_s` longer than the
result: a reader that finds no result but that marker knows the result expired (never an endless
wait), and a marker never says "pending" about a request whose answer has come and gone.

Results of a bulk job's requests are written by vela2.wire.jobs.STORE_JOB_SCRIPT instead: the same
write, plus the job's counter of the result's status, in the same call (`ResultStore.store(jobs=)`).

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
from typing import Any, Literal

import redis

from vela2 import errors
from vela2.api.schemas import RowResult, Status
from vela2.wire import scripts
from vela2.wire.jobs import ADMIT_SCRIPT, STORE_JOB_SCRIPT, job_keys, served_label
from vela2.wire.keys import cancel_key, job_key, result_key, stored_key, submitted_key
from vela2.wire.scripts import Script
from vela2.wire.usage import COUNT_LUA, count_args

log = logging.getLogger(__name__)


DEFAULT_RESULT_EXPIRES_S = 86_400  # one day, Celery's default result_expires: a bulk job's line results
DEFAULT_ONLINE_RESULT_EXPIRES_S = 3_600  # an online request's result (read within seconds, by its waiter)
DEFAULT_SUBMITTED_TTL_S = DEFAULT_RESULT_EXPIRES_S  # a pending marker: how long a request may wait unanswered
DEFAULT_EXPIRED_MARKER_S = 86_400  # an "answered" marker outlives its result by this long
ANSWERED = "answered"  # the submitted marker's value once the result is written
ROW_KEY = "vela2"  # the RowResult, where `result` is not it (a failure, a SystemOne answer): meta_row
ANSWER_KEY = "vela2_answer"  # a failed SystemOne request's answer (and an older worker's successes'): meta_answer

# Write once, many results of one tenant in one call: SET NX EX each, announce the value on the key's
# channel, turn the request's submitted marker (if any: SET XX) into the "answered" tombstone, and count
# the bytes written on the tenant (vela2.wire.usage), only when written.
# KEYS = the tenant's stored-bytes hash, then result key, marker key per result; ARGV = result TTL,
# marker TTL, bucket, the hash's TTL (usage.count_args), then one value per result. Returns 1 / 0 per
# result. While Redis is full its first SET is refused, and with it the whole call (Redis checks
# memory at a script's first write only): nothing is half written. (No shebang flags: fakeredis runs
# it too.)
STORE_MANY_SCRIPT = COUNT_LUA + """
local out, bytes = {}, 0
for i = 1, (#KEYS - 1) / 2 do
  local rk, mk, v = KEYS[2 * i], KEYS[2 * i + 1], ARGV[i + 4]
  if redis.call('SET', rk, v, 'NX', 'EX', ARGV[1]) then
    redis.call('PUBLISH', rk, v)
    redis.call('SET', mk, 'answered', 'XX', 'EX', ARGV[2])
    bytes = bytes + #rk + #v
    out[i] = 1
  else
    out[i] = 0
  end
end
count_stored(KEYS[1], ARGV[3], bytes, ARGV[4])
return out
"""

# 1 / 0 per key: whether it exists (EXISTS of several keys only counts them).
EXISTS_MANY_SCRIPT = """
local out = {}
for i, k in ipairs(KEYS) do out[i] = redis.call('EXISTS', k) end
return out
"""

STORE_MANY, EXISTS_MANY = Script(STORE_MANY_SCRIPT), Script(EXISTS_MANY_SCRIPT)
STORE_JOB, ADMIT = Script(STORE_JOB_SCRIPT), Script(ADMIT_SCRIPT)

_MANY_MAX = 512  # results per STORE_MANY / EXISTS_MANY call

# Redis refuses a write for now (retry it later): full under noeviction, loading, a read-only replica.
REFUSED_ERRORS: tuple[type[Exception], ...] = (redis.exceptions.OutOfMemoryError, redis.exceptions.BusyLoadingError,
                                               redis.exceptions.ReadOnlyError)


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


def row_meta(task_id: str, result: RowResult | dict[str, Any], answer: dict[str, Any] | None = None,
             digest: str | None = None) -> dict[str, Any]:
    """The stored meta of one request's result (a RowResult, or its `to_json_dict()` form, which a
    decode process sends: no pydantic object crosses the process boundary), in the layout of the
    module docstring (nothing stored twice).

    `answer`: the SystemOne answer dict of a SystemOne request (Celery's `result` when the request
    succeeded, the row beside it in `vela2`; `vela2_answer` beside a failure's exception). `digest`:
    the request's content digest (vela2.wire.messages.request_digest), so a later request under the
    same id with other content is refused as a conflict instead of getting this answer.
    """
    row = result if isinstance(result, dict) else result.to_json_dict()
    meta: dict[str, Any] = {
        "status": "SUCCESS",
        "result": answer if answer is not None else row,
        "traceback": None,
        "children": [],
        "date_done": _now_iso(),
        "task_id": task_id,
    }
    if row.get("status") == Status.error.value:
        err = row.get("error")
        code, message = (err["type"], err["message"]) if err else ("internal_error", "unknown error")
        meta["status"] = "FAILURE"
        meta["result"] = {"exc_type": exc_type_name(code), "exc_message": [message], "exc_module": "builtins"}
        meta[ROW_KEY] = row
        if answer is not None:
            meta[ANSWER_KEY] = answer
    elif answer is not None:
        meta[ROW_KEY] = row  # beside a SUCCESS: `result` is the answer
    if digest is not None:
        meta["vela2_digest"] = digest
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


def encode_meta(meta: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON of a meta dict; strings UTF-8 cannot encode (lone surrogates quoted in
    an error message) are escaped, so the value is always valid JSON that Redis can hold."""
    text = json.dumps(meta, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(meta, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def dead_letter_entry(reason: str, *, message_id: str | None, request_id: str | None = None,
                      request: Any = None, item: bytes | None = None, attempts: int | None = None) -> str:
    """The JSON entry (ASCII, so any content fits) of something moved to a dead-letter list: a
    poison request, a request whose id cannot be a key, or a queue item with no usable id (`item`:
    the raw item, cut at DEAD_ITEM_BYTES)."""
    entry: dict[str, Any] = {"id": request_id, "message_id": message_id, "reason": reason,
                             "at": datetime.now(UTC).isoformat()}
    if attempts is not None:
        entry["attempts"] = attempts
    if request is not None:
        entry["request"] = request
    if item is not None:
        entry["item"] = item[:DEAD_ITEM_BYTES].decode("utf-8", "backslashreplace")
        entry["item_bytes"] = len(item)
    return json.dumps(entry, ensure_ascii=True, default=str)


DEAD_ITEM_BYTES = 1 << 20  # a dead-lettered queue item keeps its first MiB


@dataclass
class ResultStore:
    """Writes results under their ids (write-once, with TTL) and checks which ids already have one.

    A result's TTL is its kind's (`ttl_of`): `ttl_s` for a bulk job's line (the worker's
    `result_expires_s`), `online_ttl_s` for any other (`online_result_expires_s`), never longer
    than `ttl_s`."""

    redis: Any  # a redis.Redis (or fakeredis) client
    ttl_s: int = DEFAULT_RESULT_EXPIRES_S
    expired_marker_s: int = DEFAULT_EXPIRED_MARKER_S
    online_ttl_s: int = DEFAULT_ONLINE_RESULT_EXPIRES_S

    def ttl_of(self, job: str | None) -> int:
        """The TTL of a result of `job` (a bulk job's line), or of an online request (None)."""
        return int(self.ttl_s) if job is not None else min(int(self.online_ttl_s), int(self.ttl_s))

    def _ttls(self, job: str | None) -> list[int]:
        """A store script's first ARGV for a result of `job` (or None): its TTL, its marker's (the
        result's plus expired_marker_s), then usage.count_args."""
        ttl = self.ttl_of(job)
        return [ttl, ttl + int(self.expired_marker_s), *count_args(ttl)]

    def _store_many(self, keys: list[Any], args: list[Any], client: Any) -> None:
        STORE_MANY.queue(client, keys, args)

    def _store_job(self, keys: list[Any], args: list[Any], client: Any) -> None:
        STORE_JOB.queue(client, keys, args)

    def existing(self, ids: Iterable[str]) -> set[str]:
        """The ids among `ids` that already have a stored result (one call per 512 ids)."""
        ids = list(ids)
        found: set[str] = set()
        for k in range(0, len(ids), _MANY_MAX):
            part = ids[k : k + _MANY_MAX]
            flags = EXISTS_MANY(self.redis, [result_key(rid) for rid in part], [])
            found.update(rid for rid, n in zip(part, flags, strict=True) if n)
        return found

    def admission(self, items: list[tuple[str, str | None]]) -> list[int]:
        """Per (id, job or None): ADMIT_ANSWERED (a result is stored: a duplicate), ADMIT_CANCELLED
        (its cancel marker is set, or its job's cancel was asked) or ADMIT_RUN (vela2.wire.jobs), in
        one pipelined round trip (one script call per 512 requests)."""
        pipe = self.redis.pipeline(transaction=False)
        for k in range(0, len(items), _MANY_MAX):
            part = items[k : k + _MANY_MAX]
            keys: list[str] = []
            for rid, job in part:
                keys += [result_key(rid), cancel_key(rid)] + ([job_key(job)] if job else [])
            ADMIT.queue(pipe, keys, ["1" if job else "0" for _, job in part])
        return [int(code) for reply in scripts.execute(pipe) for code in reply]

    def store(self, items: list[tuple[str, dict[str, Any]]], jobs: list[str | None] | None = None,
              now: float | None = None, tenants: list[str | None] | None = None) -> list[bool | Exception]:
        """Write (id, meta) pairs, write-once. Per item: True where this call wrote the value, False
        where a result was already there (left unchanged), or the exception that item alone met (an
        id that cannot be a key, a value Redis refuses): the other items are written all the same.
        `jobs`: per item, the (scoped) job it belongs to, or None: a written result of a job is
        counted on it by its status in the same script call (vela2.wire.jobs; `now` stamps a job
        that this ends) and lives `ttl_s`, any other `online_ttl_s` (`ttl_of`). `tenants`: per item,
        the tenant whose stored bytes it counts on (None or absent: keyless producers', tenant "";
        vela2.wire.usage). One pipelined round trip (a script
        call per 512 results of one job and tenant); should Redis refuse such a call for what one
        value is (too large), its items are written one by one in a pipeline, each meeting only its
        own error. Raises only when a round trip itself fails (Redis away)."""
        out: list[bool | Exception] = [False] * len(items)
        groups: dict[_Group, list[_Ready]] = {}
        for i, (rid, meta) in enumerate(items):
            try:
                keys = [result_key(rid).encode("utf-8"), submitted_key(rid).encode("utf-8")]
            except UnicodeEncodeError as e:
                out[i] = e
                continue
            row = meta_row(meta)
            status = str(row.get("status", "")) if row is not None else ""  # a chunk summary: not counted
            if jobs and jobs[i] and status == "ok" and row is not None:  # which model answered (vela2.wire.jobs)
                who = served_label(row.get("served_by"))
                status = f"{status}\t{who}" if who else status
            group = (jobs[i] if jobs else None, (tenants[i] if tenants else None) or "")
            groups.setdefault(group, []).append((i, keys, encode_meta(meta), status))
        stamp = str(datetime.now(UTC).timestamp() if now is None else now)
        parts = [(group, g[k : k + _MANY_MAX]) for group, g in groups.items() for k in range(0, len(g), _MANY_MAX)]
        if not parts:
            return out
        ttls = {job: self._ttls(job) for job, _ in groups}
        pipe = self.redis.pipeline(transaction=False)
        for group, part in parts:
            self._call(group, part, ttls[group[0]], stamp, pipe)
        for (group, part), reply in zip(parts, scripts.execute(pipe, raise_on_error=False), strict=True):
            if isinstance(reply, REFUSED_ERRORS):  # refused whole: every item waits
                for i, _, _, _ in part:
                    out[i] = reply
            elif isinstance(reply, redis.exceptions.ResponseError):  # one value refused: find which
                self._store_each(group, part, ttls[group[0]], stamp, out)
            elif isinstance(reply, Exception):
                raise reply
            else:
                for (i, _, _, _), flag in zip(part, reply, strict=True):
                    out[i] = bool(flag)
        return out

    def _call(self, group: _Group, part: list[_Ready], ttls: list[int], stamp: str, client: Any) -> Any:
        """One store script call for `part` (all of one job, or of none, and of one tenant) on
        `client` (a pipeline). `ttls`: the group's `_ttls`."""
        job, tenant = group
        if job is None:
            return self._store_many(keys=[stored_key(tenant), *(key for _, ks, _, _ in part for key in ks)],
                                    args=[*ttls, *(v for _, _, v, _ in part)], client=client)
        return self._store_job(keys=[*job_keys(job), stored_key(tenant), *(key for _, ks, _, _ in part for key in ks)],
                               args=[*ttls[:2], stamp, *ttls[2:], *(x for _, _, v, st in part for x in (st, v))],
                               client=client)

    def _store_each(self, group: _Group, part: list[_Ready], ttls: list[int], stamp: str,
                    out: list[bool | Exception]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for item in part:
            self._call(group, [item], ttls, stamp, pipe)
        for (i, _, _, _), reply in zip(part, scripts.execute(pipe, raise_on_error=False), strict=True):
            out[i] = reply if isinstance(reply, Exception) else bool(reply[0])


_Ready = tuple[int, list[bytes], bytes, str]  # (item index, [result key, marker key], value, status)
_Group = tuple[str | None, str]  # (job or None, tenant: "" for keyless producers)


# --- reading ---------------------------------------------------------------------------------


_ROW_STATUSES = frozenset(s.value for s in Status)


def _is_row(value: Any) -> bool:
    """Whether `value` is a RowResult dict (not a chunk's summary, not a SystemOne answer)."""
    return isinstance(value, dict) and isinstance(value.get("id"), str) and value.get("status") in _ROW_STATUSES


def meta_row(meta: Any) -> dict[str, Any] | None:
    """The RowResult dict of a decoded stored meta, in either layout (module docstring): `vela2`
    where it is there, else a SUCCESS's `result`; None when there is none (a chunk's summary, a
    result some other Celery task wrote, no dict at all)."""
    if not isinstance(meta, dict):
        return None
    row = meta.get(ROW_KEY)
    if isinstance(row, dict):
        return row
    result = meta.get("result")
    return result if meta.get("status") == "SUCCESS" and _is_row(result) else None


def meta_answer(meta: Any) -> dict[str, Any] | None:
    """The product answer of a decoded stored meta, in either layout: the SystemOne answer of a
    SystemOne request, else the RowResult dict; None when there is none."""
    if not isinstance(meta, dict):
        return None
    answer = meta.get(ANSWER_KEY)  # a failed SystemOne request's (an older worker's successes' too)
    if isinstance(answer, dict):
        return answer
    if meta.get("status") == "SUCCESS" and isinstance(meta.get(ROW_KEY), dict):  # `result` is the answer
        result = meta.get("result")
        return result if isinstance(result, dict) else None
    return meta_row(meta)


# meta_row in Lua, for scripts that read a stored meta (decoded with cjson): the RowResult table, or nil.
META_ROW_LUA = """
local function meta_row(meta)
  if type(meta) ~= 'table' then return nil end
  if type(meta['vela2']) == 'table' then return meta['vela2'] end
  local result = meta['result']
  if meta['status'] == 'SUCCESS' and type(result) == 'table' and type(result['id']) == 'string'
      and type(result['status']) == 'string' then
    return result
  end
  return nil
end
"""


def parse_meta(raw: bytes | str | None) -> RowResult | None:
    """The RowResult in a stored meta; None when there is none (missing key, a chunk summary)."""
    if raw is None:
        return None
    row = meta_row(json.loads(raw))
    return RowResult.model_validate(row) if row is not None else None


def parse_answer(raw: bytes | str | None) -> dict[str, Any] | None:
    """The product answer in a stored meta: the SystemOne answer of a SystemOne request, else the
    RowResult dict; None when there is none."""
    if raw is None:
        return None
    return meta_answer(json.loads(raw))


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


# Before a producer queues a request (KEYS[1] = its marker, KEYS[2] = its result; ARGV = its content
# digest, then "<queue> <digest>" and the marker TTL, or nothing for a producer that does not track):
# CLAIM_CONFLICT when the id already names other content (a stored answer whose meta carries another
# digest, or a pending marker naming another digest); CLAIM_ANSWERED when its answer is stored (same
# content, or stored without a digest): nothing to queue; CLAIM_MARKED when the marker was written
# now (a caller that gives up takes it back with DEL); else 0 (pending already, or not tracking).
# An answered id keeps its "answered" marker, so it reads as expired once the answer expires, never
# as pending forever; an expired one (the tombstone alone) is marked pending again, to be rescored.
CLAIM_CONFLICT, CLAIM_MARKED, CLAIM_ANSWERED = 1, 2, 3
CLAIM_LUA = """
local function claim(marker_key, result_key, A)
  local both = redis.call('MGET', result_key, marker_key)  -- one command for the two reads
  local raw, marker = both[1], both[2]
  if raw then
    local ok, meta = pcall(cjson.decode, raw)
    if ok and type(meta) == 'table' and type(meta['vela2_digest']) == 'string'
        and meta['vela2_digest'] ~= A[1] then
      return 1
    end
    return 3
  end
  if marker and marker ~= A[4] then
    local digest = string.match(marker, ' (%S+)$')
    if digest and digest ~= A[1] then
      return 1
    end
    return 0
  end
  if A[2] then
    redis.call('SET', marker_key, A[2], 'EX', A[3])
    return 2
  end
  return 0
end
"""  # the claim as a Lua function (A: claim_args), for CLAIM_SCRIPT and vela2.wire.taking.CLAIM_PUSH_SCRIPT
CLAIM_SCRIPT = CLAIM_LUA + "return claim(KEYS[1], KEYS[2], ARGV)\n"


CLAIM = Script(CLAIM_SCRIPT)


def claim_args(digest: str, queue: str | None, ttl_s: int | None) -> list[Any]:
    """CLAIM_SCRIPT's ARGV: the digest, and the marker to write (queue and TTL) when tracking."""
    return [digest] if queue is None or ttl_s is None else [digest, f"{queue} {digest}", ttl_s, ANSWERED]


def marker_says_answered(raw: bytes | str | None) -> bool:
    """True for a submitted marker that the worker turned into the "answered" tombstone."""
    return raw is not None and (raw.decode() if isinstance(raw, bytes) else raw) == ANSWERED


# --- the state of a request: its result key and its submitted marker, read together ---------

State = Literal["answered", "pending", "expired", "unknown"]
def state_keys(ids: list[str]) -> list[str]:
    """The keys one MGET reads for `ids`: every result key, then every submitted marker key."""
    return [result_key(rid) for rid in ids] + [submitted_key(rid) for rid in ids]


def split_state(ids: list[str], values: list[Any]) -> dict[str, tuple[Any, Any]]:
    """The reply of MGET(state_keys(ids)) as id -> (raw result, raw marker)."""
    n = len(ids)
    return {rid: (values[i], values[n + i]) for i, rid in enumerate(ids)}


def state_of(raw_result: Any, raw_marker: Any) -> State:
    """What a result key and a submitted marker say about a request: "answered" (a result is
    stored), "expired" (the marker says answered, the result is gone), "pending" (a marker naming
    its queue) or "unknown" (neither)."""
    if raw_result is not None:
        return "answered"
    if marker_says_answered(raw_marker):
        return "expired"
    return "pending" if raw_marker is not None else "unknown"
