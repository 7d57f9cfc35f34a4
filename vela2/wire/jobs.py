"""Bulk jobs in Redis: the record both sides share (producers create and read it, workers count on it).

A job is two keys (names in vela2.wire.keys) and an index entry:

- `vela2:job:<id>` (a hash): `id`, `model`, `tenant`, `created_at`, `deadline` (unix seconds),
  `window_s`, `metadata` (JSON), `input` (`reading` while the submitter streams the input file,
  then `done`), `beat` (the submitter's last push, unix seconds), `total` (lines registered so far),
  the counters `ok` / `error` / `expired` / `cancelled`, `cancel_at` once a cancel was asked, and
  `status` + `ended_at` once the job ended (written by the script that counted its last answer).
- `vela2:job:<id>:ids` (a list): one entry per input line, in input order: a one-character kind
  (`r`: a row or SystemOne request; `o`: an OpenAI-batch line) then the caller's id (the row's
  id, its content id, `line-<N>` for a line that is no JSON object, or the OpenAI `custom_id`).
  An invalid line (answered by the submitter) keeps its error answer in its entry instead of a
  stored result (`invalid_entry`: kinds R / O, or bare x / y past JOB_ERROR_BYTES) and is counted
  as an error when it is registered.
  Line n (0-based) travels and is stored under `<job>#<n>` (`request_wire_id`), so two lines with
  one id, or two jobs over one file, never meet; the caller's id is put back when results are read.
- `vela2:jobs:<model>` (a sorted set): job id -> created_at, for `vela2 jobs list` and the metrics.

Counting is exact and race-free: a result is counted by the Lua script that writes it (STORE_JOB_SCRIPT,
SET NX: a duplicate delivery writes nothing and counts nothing), and the same script ends the job when
the input is `done` and ok + error + expired + cancelled == total (FINISH: `cancelled` when a cancel was
asked, else `expired` when some request expired, else `completed`). The submitter's last step
(FINISH_INPUT_SCRIPT) runs the same check, so whichever comes last ends the job, once. An ended job's
keys then live as long as its results (the result TTL).

The status a reader sees is derived in one place, `job_status`: the stored terminal status; else
`cancelling` (cancel asked); else `validating` while the input streams in, or `failed` when the
submitter stopped beating before the input was done (killed mid-upload); else `in_progress`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from vela2.wire.keys import job_ids_key, job_key
from vela2.wire.usage import COUNT_LUA

JOB_ID_PREFIX = "batch_"  # job ids look like OpenAI's: batch_<32 hex>
LINE_SEP = "#"  # a job line's wire id: <job>#<line index>
KIND_ROW = "r"  # an ids-list entry of a row / SystemOne line
KIND_OPENAI = "o"  # an ids-list entry of an OpenAI-batch line (`custom_id` + `body`)
# An invalid line's entry carries its error answer itself (no result key, no marker: a bad line costs
# its entry, not a stored result of ~700 bytes kept a day): the kind in upper case, then JSON
# [caller's id, answer without its id]. Past JOB_ERROR_BYTES of those in one submission, an invalid
# line's entry is its bare kind (x / y) and caller's id, no bigger than a valid line's; its output
# line says its message was not kept.
INVALID_KINDS = {KIND_ROW: "R", KIND_OPENAI: "O"}
BARE_INVALID_KINDS = {KIND_ROW: "x", KIND_OPENAI: "y"}
JOB_ERROR_BYTES = 1_000_000  # bytes of error answers one submission keeps
ERROR_MESSAGE_CHARS = 300  # an invalid line's error message is cut to this
COUNTED = ("ok", "error", "expired", "cancelled")  # the terminal statuses a job counts
ENDED = ("completed", "cancelled", "expired", "failed")  # job statuses after which nothing changes
STATUSES = ("validating", "in_progress", "cancelling", *ENDED)
DEFAULT_WINDOW_S = 86_400  # a job's completion window: its requests expire unscored after it
SUBMIT_STALE_S = 60.0  # a submitter silent this long before its input is done is gone (status failed)
SUBMIT_BEAT_S = 10.0  # how often a live submitter beats while it reads its input, however slowly

# Ends the job when its input is done and every line is answered (a job hash KEYS[job], its ids list
# KEYS[ids], ARGV now / ttl). Shared by the store and finish-input scripts below.
_FINISH_LUA = """
local function finish(job, ids, now, ttl)
  local f = redis.call('HMGET', job, 'input', 'status', 'total', 'ok', 'error', 'expired', 'cancelled', 'cancel_at')
  if f[1] ~= 'done' or f[2] then return 0 end
  local expired = tonumber(f[6]) or 0
  local answered = (tonumber(f[4]) or 0) + (tonumber(f[5]) or 0) + expired + (tonumber(f[7]) or 0)
  if answered < (tonumber(f[3]) or 0) then return 0 end
  local status = 'completed'
  if f[8] then status = 'cancelled' elseif expired > 0 then status = 'expired' end
  redis.call('HSET', job, 'status', status, 'ended_at', now)
  redis.call('EXPIRE', job, ttl)
  redis.call('EXPIRE', ids, ttl)
  return 1
end
"""

# Write results of one job, write-once, and count each one written on the job (vela2.wire.results has
# the plain form) and its bytes on the tenant (vela2.wire.usage): KEYS = job hash, ids list, the
# tenant's stored-bytes hash, then result key, marker key per result; ARGV = result TTL, marker TTL,
# now, bucket, the hash's TTL, then status (one of COUNTED, or "" for a chunk summary: not counted) and
# value per result. A status may carry, after a tab, the identity of the model that answered (`served_label`):
# counted too, in the field SERVED_PREFIX + identity. Returns 1 / 0 per result. A job hash that is
# gone (expired) is not recreated.
STORE_JOB_SCRIPT = _FINISH_LUA + COUNT_LUA + """
local job, ids = KEYS[1], KEYS[2]
local live = redis.call('EXISTS', job) == 1
local out, bytes = {}, 0
for i = 1, (#KEYS - 3) / 2 do
  local rk, mk = KEYS[2 * i + 2], KEYS[2 * i + 3]
  local status, v = ARGV[2 * i + 4], ARGV[2 * i + 5]
  local who = ''
  local tab = string.find(status, '\t', 1, true)
  if tab then
    who = string.sub(status, tab + 1)
    status = string.sub(status, 1, tab - 1)
  end
  if redis.call('SET', rk, v, 'NX', 'EX', ARGV[1]) then
    redis.call('PUBLISH', rk, v)
    redis.call('SET', mk, 'answered', 'XX', 'EX', ARGV[2])
    if live and status ~= '' then
      redis.call('HINCRBY', job, status, 1)
      if who ~= '' then
        redis.call('HINCRBY', job, 'served:' .. who, 1)
      end
    end
    bytes = bytes + #rk + #v
    out[i] = 1
  else
    out[i] = 0
  end
end
count_stored(KEYS[3], ARGV[4], bytes, ARGV[5])
if live then
  finish(job, ids, ARGV[3], ARGV[1])
end
return out
"""

# The submitter's last step: the input is all registered (KEYS job, ids; ARGV now, result TTL). Returns
# 1 when that ended the job (every line answered already), else 0.
FINISH_INPUT_SCRIPT = _FINISH_LUA + """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
redis.call('HSET', KEYS[1], 'input', 'done', 'beat', ARGV[1])
return finish(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
"""

# A live submitter's beat (KEYS job; ARGV now), only while the record exists: HSET on an expired job
# would make a record with no TTL.
BEAT_SCRIPT = "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'beat', ARGV[1]) end"

# A submitter that could not register its whole input ends the job `failed` (KEYS job; ARGV now,
# reason), unless it ended already; the cancel makes workers skip the lines it queued.
FAIL_JOB_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], 'status') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'status', 'failed', 'ended_at', ARGV[1], 'failed_reason', ARGV[2])
redis.call('HSETNX', KEYS[1], 'cancel_at', ARGV[1])
return 1
"""

# Ask a job to cancel (KEYS job; ARGV now): -1 no such job; 0 it had ended already; 1 cancel asked now
# (or earlier). Workers answer its requests not yet started `cancelled`; the job ends `cancelled`. A
# `failed` job (its submitter gone) takes the cancel too, so that workers skip the lines it had
# queued, and reads `failed` all the same (job_status).
CANCEL_JOB_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('HEXISTS', KEYS[1], 'status') == 1 then return 0 end
redis.call('HSETNX', KEYS[1], 'cancel_at', ARGV[1])
return 1
"""

# A worker's intake check of requests (vela2.wire.results.ResultStore.admission): per request, its
# result key and cancel marker, then its job hash when ARGV[i] is "1". Returns per request 1 (answered
# already: a duplicate), 2 (cancelled: its marker, or its job's cancel) or 0 (run it). One EXISTS of
# both keys tells the common case (neither: run it); only when one is there is the result's asked.
ADMIT_SCRIPT = """
local out, k = {}, 1
for i = 1, #ARGV do
  local r = 0
  if redis.call('EXISTS', KEYS[k], KEYS[k + 1]) > 0 then
    if redis.call('EXISTS', KEYS[k]) == 1 then r = 1 else r = 2 end
  end
  k = k + 2
  if ARGV[i] == '1' then
    if r == 0 and redis.call('HEXISTS', KEYS[k], 'cancel_at') == 1 then r = 2 end
    k = k + 1
  end
  out[i] = r
end
return out
"""
ADMIT_RUN, ADMIT_ANSWERED, ADMIT_CANCELLED = 0, 1, 2
CANCELLED_MESSAGE = "cancelled (the request, or its bulk job) before a worker started it"


def new_job_id() -> str:
    """A fresh job id (`batch_<32 hex>`)."""
    return JOB_ID_PREFIX + uuid.uuid4().hex


_LINE_ID = re.compile(re.escape(JOB_ID_PREFIX) + r"[0-9a-f]{32}" + re.escape(LINE_SEP) + r"\d+")


def reserved_id(rid: str) -> bool:
    """Whether a caller's id has the form of a bulk job line's (`batch_<32 hex>#<line>`): such an id
    would take that line's place (its answer stored first, the line then skipped as a duplicate,
    the job never ending), so no single request may use it."""
    return _LINE_ID.fullmatch(rid) is not None


def request_wire_id(job: str, line: int) -> str:
    """The id line `line` (0-based) of job `job` (scoped) travels and is stored under."""
    return f"{job}{LINE_SEP}{line}"


def ids_entry(kind: str, caller_id: str) -> str:
    """One entry of a job's ids list: the line's kind and the caller's id."""
    return kind + caller_id


def invalid_entry(kind: str, caller_id: str, answer: dict[str, Any] | None) -> str:
    """The ids-list entry of an invalid line of `kind`: its error `answer` (without its id) kept in
    the entry, or (None: the submission's JOB_ERROR_BYTES spent) the bare invalid kind."""
    if answer is None:
        return BARE_INVALID_KINDS[kind] + caller_id
    kept = {k: v for k, v in answer.items() if k != "id"}
    return INVALID_KINDS[kind] + json.dumps([caller_id, kept], ensure_ascii=False, separators=(",", ":"))


def parse_ids_entry(raw: bytes | str) -> tuple[str, str, dict[str, Any] | None]:
    """An ids-list entry -> (kind, caller's id, the error answer of an invalid line ({} when its
    answer was not kept) or None)."""
    text = raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw
    head = text[:1]
    for kind, invalid in INVALID_KINDS.items():
        if head == invalid:
            caller, answer = json.loads(text[1:])
            return kind, caller, answer
        if head == BARE_INVALID_KINDS[kind]:
            return kind, text[1:], {}
    return head, text[1:], None


def _text(value: Any) -> str | None:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


def _num(value: Any) -> float | None:
    text = _text(value)
    return float(text) if text not in (None, "") else None


@dataclass
class JobInfo:
    """A job's record as read (`read_job`), with its derived status (`job_status`)."""

    id: str
    model: str
    status: str
    created_at: float
    deadline: float
    window_s: float
    total: int
    counts: dict[str, int]  # queued (registered, not answered yet), ok, error, expired, cancelled
    input_done: bool
    ended_at: float | None = None
    cancel_at: float | None = None
    beat: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)  # identity (served_label) -> ok answers it gave
    failed_reason: str | None = None  # why the submitter could not register its whole input (FAIL_JOB_SCRIPT)
    input_file_id: str | None = None  # the Files API file it was made from (POST /v1/batches), if any

    @property
    def answered(self) -> int:
        """Lines with a terminal answer."""
        return sum(self.counts[k] for k in COUNTED)

    @property
    def ended(self) -> bool:
        """True once nothing about the job changes any more."""
        return self.status in ENDED

    def to_dict(self) -> dict[str, Any]:
        """The job as JSON: every field of OpenAI's Batch object (the `openai` package's
        `openai.types.Batch`: times of each stage, the output and error files once it has ended,
        `errors` of a failed one) plus vela2's exact counts by status, `served_by`, `ended_at` and
        `input_done`."""
        ended_at = int(self.ended_at) if self.ended_at is not None else None
        if self.status == "failed" and ended_at is None:  # failed by its silent submitter: its last beat
            ended_at = int(self.beat or self.created_at)
        failed = self.counts["error"] + self.counts["expired"] + self.counts["cancelled"]
        at = {s: ended_at if self.status == s and self.ended else None
              for s in ("completed", "failed", "expired", "cancelled")}
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": "/v1/system_one",
            "model": self.model,
            "status": self.status,
            "input_file_id": self.input_file_id or "",
            "output_file_id": self.id + "-output" if self.ended and self.counts["ok"] else None,
            "error_file_id": self.id + "-errors" if self.ended and failed else None,
            "created_at": int(self.created_at),
            "in_progress_at": int(self.beat) if self.input_done and self.beat is not None else None,
            "finalizing_at": ended_at if self.ended and self.status != "failed" else None,
            "completed_at": at["completed"],
            "failed_at": at["failed"],
            "expired_at": at["expired"],
            "cancelling_at": int(self.cancel_at) if self.cancel_at is not None else None,
            "cancelled_at": at["cancelled"],
            "expires_at": int(self.deadline),
            "completion_window": window_text(self.window_s),
            "errors": {"object": "list", "data": [{"code": "job_failed", "message": self.failed_reason or
                                                   "its input was not all registered", "line": None, "param": None}]}
            if self.status == "failed" else None,
            "request_counts": {"total": self.total, "completed": self.counts["ok"], "failed": failed},
            "metadata": self.metadata,
            "ended_at": ended_at,
            "input_done": self.input_done,
            "counts": dict(self.counts),
            "served_by": dict(self.served),
            **({"failed_reason": self.failed_reason} if self.failed_reason else {}),
        }


def window_text(window_s: float) -> str:
    """A completion window as OpenAI writes it: "24h" (whole hours), else "<n>m", else "<n>s"."""
    if window_s >= 3600 and window_s % 3600 == 0:
        return f"{int(window_s // 3600)}h"
    if window_s >= 60 and window_s % 60 == 0:
        return f"{int(window_s // 60)}m"
    return f"{window_s:g}s"


def parse_window(text: str) -> float:
    """A completion window "<n>h", "<n>m" or "<n>s" (OpenAI's "24h") in seconds; ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([hms])\s*", text or "")
    if m is None:
        raise ValueError(f'completion_window must be like "24h", "90m" or "600s"; got {text!r}')
    return float(m.group(1)) * {"h": 3600, "m": 60, "s": 1}[m.group(2)]


def job_status(fields: dict[str, Any], now: float) -> str:
    """THE derivation of a job's status from its hash fields (module docstring)."""
    stored = fields.get("status")
    if stored:
        return str(stored)
    if fields.get("input") != "done" and now - (_num(fields.get("beat")) or 0.0) > SUBMIT_STALE_S:
        return "failed"  # ended: its input will never be done, so a cancel cannot end it either
    if fields.get("cancel_at"):
        return "cancelling"
    return "validating" if fields.get("input") != "done" else "in_progress"


JOB_FIELDS = ("id", "model", "created_at", "deadline", "window_s", "metadata", "input", "beat", "total",
              *COUNTED, "cancel_at", "status", "ended_at", "failed_reason", "input_file_id")


def parse_job(values: list[Any], now: float) -> JobInfo | None:
    """HMGET(job_key, *JOB_FIELDS) -> JobInfo (None when the job does not exist)."""
    f = dict(zip(JOB_FIELDS, (_text(v) for v in values), strict=True))
    if f["id"] is None:
        return None
    counts = {k: int(f[k] or 0) for k in COUNTED}
    total = int(f["total"] or 0)
    meta = json.loads(f["metadata"]) if f["metadata"] else {}
    return JobInfo(
        id=str(f["id"]), model=str(f["model"]), status=job_status(f, now), created_at=float(f["created_at"] or 0),
        deadline=float(f["deadline"] or 0), window_s=float(f["window_s"] or 0), total=total,
        counts={"queued": max(0, total - sum(counts.values())), **counts}, input_done=f["input"] == "done",
        ended_at=_num(f["ended_at"]), cancel_at=_num(f["cancel_at"]), beat=_num(f["beat"]), metadata=meta,
        failed_reason=f["failed_reason"], input_file_id=f["input_file_id"],
    )


def read_job(redis: Any, job: str, now: float) -> JobInfo | None:
    """The record of job `job` (scoped id), one HMGET; None when there is none."""
    return parse_job(redis.hmget(job_key(job), JOB_FIELDS), now)


SERVED_PREFIX = "served:"  # job hash fields counting the ok answers of each model identity


def served_label(served_by: Any) -> str:
    """The identity a job counts an answer under: "<name> <digest, 12 digits> <precision>" of a
    result's `served_by` (" batch-invariant" after it for an answer of that mode), or "" when it has none."""
    if not isinstance(served_by, dict) or not served_by.get("name"):
        return ""
    mode = " batch-invariant" if served_by.get("batch_invariant") else ""
    return f"{served_by['name']} {str(served_by.get('digest') or '-')[:12]} {served_by.get('precision', '?')}{mode}"


def served_counts(fields: dict[Any, Any]) -> dict[str, int]:
    """{identity: ok answers} from a job hash's fields (HGETALL)."""
    out = {}
    for k, v in fields.items():
        key = k.decode() if isinstance(k, bytes) else str(k)
        if key.startswith(SERVED_PREFIX):
            out[key[len(SERVED_PREFIX):]] = int(v)
    return out


def job_keys(job: str) -> list[str]:
    """The keys of a job's record: its hash and its ids list (the scripts' first two KEYS)."""
    return [job_key(job), job_ids_key(job)]

