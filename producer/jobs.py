"""Bulk jobs that outlive their client: submit a JSONL file as a job, watch it, cancel it, read it back.

    client = Client("redis://127.0.0.1:6379/0", model="vela2-demo")
    with open("in.jsonl", "rb") as f:
        job = submit_job(client, f, window_s=86_400)          # a JobSubmitted: its id, lines, ...
    job_info(client, job.id).counts                           # queued / ok / error / expired / cancelled
    cancel_job(client, job.id)                                # workers answer what they did not start `cancelled`
    for line, ok in job_lines(client, job.id):                # in input order, one per input line
        ...

The record lives in Redis (vela2.wire.jobs), not in this process: once `submit_job` has returned
(or even while it runs: the job id is known at once, `on_created`), anyone may read its status,
cancel it or read its results, and the workers count every answer on it as they store it.

Input lines: a row, a SystemOne request, or an OpenAI-batch line `{"custom_id": ..., "body": <row or
SystemOne request>}` (`method` / `url` are accepted and ignored); blank lines are skipped. A line
that cannot be queued (not JSON, no object, an invalid request, a bad custom_id, over the message
size) is answered at once with its error result, stored and counted on the job like any other:
never dropped. Each line is its own request (`<job>#<line>`, vela2.wire.jobs), so two lines with the
same id are both answered; the output line carries the caller's id back.

Memory: `submit_job` streams its input (PUSH_LINES lines at a time) and `job_lines` its output
(READ_PAGE lines at a time): neither holds a job in memory, whatever its size.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis.exceptions

from producer import brokers
from producer.backfill import ENV_MODEL, check_seconds
from producer.client import DEFAULT_MODEL, DEFAULT_REDIS_URL, Client, http_status, pack_messages, prepare_request
from vela2.api.schemas import Status, cancelled_result, error_result, guess_id_task
from vela2.api.systemone import error_answer, is_system_one, parse_request, to_answer
from vela2.config import LIMITS
from vela2.errors import ConfigError, InvalidRequest, JobNotFound, Vela2Error
from vela2.wire.jobs import (
    BEAT_SCRIPT,
    CANCEL_JOB_SCRIPT,
    DEFAULT_WINDOW_S,
    FINISH_INPUT_SCRIPT,
    JOB_FIELDS,
    KIND_OPENAI,
    KIND_ROW,
    SUBMIT_BEAT_S,
    JobInfo,
    ids_entry,
    job_keys,
    new_job_id,
    parse_ids_entry,
    parse_job,
    request_wire_id,
    served_counts,
)
from vela2.wire.keys import id_problem, job_ids_key, job_key, jobs_key, queue_name, result_key, scoped_id
from vela2.wire.messages import build_message, decode_json, request_id
from vela2.wire.results import DEFAULT_RESULT_EXPIRES_S, ResultStore, parse_answer, row_meta
from vela2.wire.urls import add_url_arguments, url_from_args

log = logging.getLogger(__name__)

PUSH_LINES = 512  # input lines registered and queued per round trip
READ_PAGE = 1000  # output lines read per round trip
DEFAULT_CHUNK_SIZE = 16  # requests per queue message
DEFAULT_POLL_S = 0.2  # pause between reads while waiting for answers
MAX_METADATA_BYTES = 65_536  # a job's free-form metadata, as JSON (HTTP's 16 pairs of 64 + 512 characters fit)
_SIZE_CHECK_SLACK = 1024  # lines longer than max_message_bytes minus this get an exact size check


@dataclass
class JobSubmitted:
    """What `submit_job` did: the job id and its input lines by fate."""

    id: str
    lines: int = 0  # lines registered on the job (non-blank input lines)
    queued: int = 0  # sent to the workers
    invalid: int = 0  # answered at once with an error (bad lines)
    cancelled: int = 0  # answered `cancelled` at once: the job was cancelled while its input streamed in
    blank: int = 0  # empty lines, skipped


def _now() -> float:
    return time.time()


def _parse_line(raw: bytes, lineno: int, model: str) -> tuple[str, str, Any, Vela2Error | None]:
    """One input line -> (kind, caller's id, request (with its id) or the raw object, error or None)."""
    try:
        # refused by name: not JSON, not UTF-8, nested deeper than MAX_JSON_DEPTH (was a RecursionError)
        obj: Any = decode_json(raw, f"line {lineno}")
    except InvalidRequest as e:
        return KIND_ROW, f"line-{lineno}", None, e
    kind = KIND_ROW
    if isinstance(obj, dict) and "custom_id" in obj:
        kind, cid, body = KIND_OPENAI, obj["custom_id"], obj.get("body")
        problem = id_problem(cid)
        if problem:
            return kind, f"line-{lineno}", body, InvalidRequest(f"line {lineno}: custom_id {problem}")
        if not isinstance(body, dict):
            return kind, cid, body, InvalidRequest(
                f"line {lineno}: body must be a JSON object (a row or a SystemOne request); got {type(body).__name__}")
        obj = body
    if not isinstance(obj, dict):
        return kind, f"line-{lineno}", obj, InvalidRequest(
            f"line {lineno}: a request must be a JSON object; got {type(obj).__name__}")
    caller = cid if kind == KIND_OPENAI else request_id(obj)
    if id_problem(caller):  # an id the request is refused for (prepare_request says why), e.g. a lone
        # surrogate: kept as predict() keeps a refused request's (escaped, cut), so Redis and the
        # output (UTF-8) can hold it
        caller = guess_id_task(obj)[0]
    try:
        _, obj = prepare_request(obj, model)
        if len(raw) > LIMITS.max_message_bytes - _SIZE_CHECK_SLACK:
            build_message([obj], queue_name(model), chunk=True)  # exact check, only for huge lines
    except Vela2Error as e:
        return kind, caller, obj, type(e)(f"line {lineno}: {e}")
    return kind, caller, obj, None


def _error_meta(wire: str, obj: Any, exc: BaseException) -> dict[str, Any]:
    """The stored meta of a line answered at once with an error (the worker's shapes; the task as
    the worker gives a refused request's, `guess_id_task`: escaped where UTF-8 cannot encode it)."""
    answer = {**error_answer(obj, exc), "id": wire} if is_system_one(obj) else None
    return row_meta(wire, error_result(wire, guess_id_task(obj)[1], exc), answer)


def _cancelled_meta(wire: str, obj: Any) -> dict[str, Any]:
    """The stored meta of a line the submitter answers `cancelled` (the job was cancelled first)."""
    task = obj.get("task") if isinstance(obj, dict) and isinstance(obj.get("task"), str) else None
    res = cancelled_result(wire, task, "the job was cancelled before this line was queued")
    return row_meta(wire, res, to_answer(parse_request(obj), res) if is_system_one(obj) else None)


class _Submitter:
    """One submission's state: the job's keys, the lines waiting for the next push."""

    def __init__(self, client: Client, job: str, *, chunk_size: int, expires: float, ttl_s: int,
                 result_ttl_s: int):
        self.client = client
        self.job = job  # scoped
        self.keys = job_keys(job)
        self.queue = queue_name(client.model, backfill=True)
        self.chunk_size = chunk_size
        self.expires = expires
        self.ttl_s = ttl_s
        self.store = ResultStore(client.redis, ttl_s=result_ttl_s)
        self.entries: list[str] = []  # ids-list entries of the lines waiting
        self.good: list[tuple[str, Any]] = []  # (wire id, request) to queue
        self.answered: list[tuple[str, dict[str, Any]]] = []  # (wire id, meta) answered here
        self.cancelled = False  # the job's cancel was seen: the rest is answered here, not queued
        self.summary = JobSubmitted(client.scope.caller(job))

    def add(self, lineno: int, raw: bytes) -> None:
        """Register one input line (pushed with the next PUSH_LINES)."""
        if not raw.strip():
            self.summary.blank += 1
            return
        kind, caller, obj, err = _parse_line(raw, lineno, self.client.model)
        wire = request_wire_id(self.job, self.summary.lines)
        self.summary.lines += 1
        self.entries.append(ids_entry(kind, caller))
        if err is not None:
            self.summary.invalid += 1
            self.answered.append((wire, _error_meta(wire, obj, err)))
        elif self.cancelled:
            self.summary.cancelled += 1
            self.answered.append((wire, _cancelled_meta(wire, obj)))
        else:
            self.good.append((wire, {**obj, "id": wire}))
        if len(self.entries) >= PUSH_LINES:
            self.push()

    def push(self) -> None:
        """Register the waiting lines and queue their requests in one round trip (then store the
        lines answered here): the lines, the total and the beat first, so a worker never counts an
        answer the job does not know yet; the reply says whether the job was cancelled meanwhile."""
        if not self.entries:
            return
        messages = pack_messages(self.good, self.queue, chunk_size=self.chunk_size,
                                 expires=datetime.fromtimestamp(self.expires, UTC), job=self.job) if self.good else []
        pipe = self.client.redis.pipeline(transaction=False)
        pipe.rpush(self.keys[1], *self.entries)
        pipe.expire(self.keys[1], self.ttl_s)
        pipe.hincrby(self.keys[0], "total", len(self.entries))
        pipe.hset(self.keys[0], "beat", _now())
        same = self.client.broker is self.client.redis  # queues beside the job record: one round trip
        if same:
            brokers.queue_commands(pipe, messages)
        pipe.hget(self.keys[0], "cancel_at")
        wait = self.client.wait_replicas if same else 0
        brokers.wait_command(pipe, wait)
        replies = pipe.execute()
        if wait:
            brokers.check_replicated(replies, wait)
            replies = replies[:-1]
        if not same:  # another broker (Redis or RabbitMQ): queued once the lines are registered
            brokers.push(self.client.broker, messages, self.client.wait_replicas)
        self.summary.queued += len(self.good)
        if self.answered:
            failed = [o for o in self.store.store(self.answered, jobs=[self.job] * len(self.answered))
                      if isinstance(o, Exception)]
            if failed:
                raise failed[0]
        self.entries, self.good, self.answered = [], [], []
        self.cancelled = self.cancelled or replies[-1] is not None

    def finish(self) -> None:
        """The input is all registered: the job may end now (when every line is answered)."""
        self.push()
        self.client.redis.eval(FINISH_INPUT_SCRIPT, 2, *self.keys, _now(), self.store.ttl_s)


def submit_job(
    client: Client,
    lines: Iterable[bytes],
    *,
    window_s: float = DEFAULT_WINDOW_S,
    metadata: dict[str, Any] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    on_created: Callable[[str], None] | None = None,
    result_ttl_s: int = DEFAULT_RESULT_EXPIRES_S,
) -> JobSubmitted:
    """Create a job for `client`'s model (and tenant) from JSONL `lines` (bytes, as a file opened
    "rb" yields them) and queue its requests on the backfill queue, streaming. `window_s`: the
    completion window (0 < window_s <= LIMITS.max_deadline_s): requests not started by then are
    answered `expired`. `metadata`: free-form JSON (at most MAX_METADATA_BYTES). `on_created(job id)`
    is called as soon as the job exists, before the input is read. `result_ttl_s`: how long the
    job's record lives once it ended, and the TTL of the error results stored here (the workers'
    result_expires_s). Raises InvalidRequest / LimitExceeded for bad arguments (nothing created)."""
    if not 0 < window_s <= LIMITS.max_deadline_s:  # NaN fails this too
        raise InvalidRequest(f"window_s is {window_s!r}; it must be > 0 and at most {LIMITS.max_deadline_s:,.0f} s")
    if chunk_size < 1:
        raise InvalidRequest(f"chunk_size must be at least 1; got {chunk_size}")
    try:  # standard JSON that UTF-8 can write: every reader (HTTP included) can serve it back
        meta = json.dumps(metadata or {}, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        n_bytes = len(meta.encode("utf-8"))
    except (TypeError, ValueError) as e:  # NaN / Infinity, a lone surrogate, a value JSON cannot hold
        raise InvalidRequest(f"metadata is not standard JSON text: {e}") from None
    if n_bytes > MAX_METADATA_BYTES:
        raise InvalidRequest(f"metadata has {n_bytes:,} bytes of JSON; limit {MAX_METADATA_BYTES:,}")
    caller_id = new_job_id()
    job = client.scope.wire(caller_id)
    created = _now()
    # Until it ends, the record lives through its window plus a result lifetime (a job nobody runs
    # goes away); the script that ends it sets the result TTL from then on.
    ttl_s = int(window_s) + int(result_ttl_s)
    pipe = client.redis.pipeline(transaction=True)
    pipe.hset(job_key(job), mapping={
        "id": caller_id, "model": client.model, "tenant": client.scope.tenant or "", "created_at": created,
        "deadline": created + window_s, "window_s": window_s, "metadata": meta, "input": "reading",
        "beat": created, "total": 0, "ok": 0, "error": 0, "expired": 0, "cancelled": 0,
    })
    pipe.expire(job_key(job), ttl_s)
    pipe.zadd(jobs_key(client.model), {job: created})
    pipe.execute()
    try:
        prune_jobs_index(client.redis, client.model)
    except redis.exceptions.RedisError as e:  # housekeeping: the next job prunes again
        log.warning("could not prune the job index of %s: %s", client.model, e)
    if on_created is not None:
        on_created(caller_id)
    sub = _Submitter(client, job, chunk_size=chunk_size, expires=created + window_s, ttl_s=ttl_s,
                     result_ttl_s=result_ttl_s)
    with _beating(client, sub.keys[0]):  # alive while it reads, however slowly its input comes
        for lineno, raw in enumerate(lines, 1):
            sub.add(lineno, raw)
    sub.finish()
    return sub.summary


@contextlib.contextmanager
def _beating(client: Client, key: str) -> Iterator[None]:
    """Refresh the job's `beat` every SUBMIT_BEAT_S from a thread while the body runs: a job reads
    `failed` after SUBMIT_STALE_S without one, and a slow input (a generator, a pipe) may go that
    long between two pushes of PUSH_LINES lines. A beat that fails is left to the next one."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(SUBMIT_BEAT_S):
            try:
                # only while the record exists: HSET on an expired key would make one with no TTL
                client.redis.eval(BEAT_SCRIPT, 1, key, _now())
            except Exception as e:  # noqa: BLE001 - the submitter's own round trips raise what matters
                log.warning("job beat failed: %s", e)

    thread = threading.Thread(target=beat, name="vela2-job-beat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _job_key(client: Client, job_id: str) -> str:
    """The record key of the caller's job `job_id`; JobNotFound for an id no job can have."""
    try:
        return job_key(client.scope.wire(job_id))
    except InvalidRequest as e:
        raise JobNotFound(f"no job {job_id[:80]!r}: {e}") from None


def job_info(client: Client, job_id: str) -> JobInfo:
    """The job's record now, with the model identities that answered it (one round trip);
    JobNotFound when there is none (or it is another tenant's)."""
    pipe = client.redis.pipeline(transaction=False)
    key = _job_key(client, job_id)
    pipe.hmget(key, JOB_FIELDS)
    pipe.hgetall(key)
    values, fields = pipe.execute()
    info = parse_job(values, _now())
    if info is None:
        raise JobNotFound(f"no job {job_id!r} (never created, another tenant's, or expired with its results)")
    info.served = served_counts(fields)
    return info


def cancel_job(client: Client, job_id: str) -> JobInfo:
    """Ask a job to cancel: workers answer every request of it they have not started `cancelled`
    (without running it); those running finish and keep their answer; the job ends `cancelled`
    once all are answered. A job that has ended stays as it is. Returns the record after the call;
    JobNotFound when there is none."""
    code = client.redis.eval(CANCEL_JOB_SCRIPT, 1, _job_key(client, job_id), _now())
    if code == -1:
        raise JobNotFound(f"no job {job_id!r} (never created, another tenant's, or expired with its results)")
    return job_info(client, job_id)


PRUNE_OLDEST = 32  # index entries each new job checks, oldest first


def prune_jobs_index(redis: Any, model: str) -> int:
    """Drop the model's oldest PRUNE_OLDEST index entries whose job record has expired (every
    tenant's; two round trips). Called by each new job, so the index stays about as large as the
    jobs that exist, even for jobs that nobody lists (those made over HTTP, which has no list route).
    Returns how many entries went."""
    raw = redis.zrange(jobs_key(model), 0, PRUNE_OLDEST - 1)
    oldest = [j.decode() if isinstance(j, bytes) else str(j) for j in raw]
    if not oldest:
        return 0
    pipe = redis.pipeline(transaction=False)
    for j in oldest:
        pipe.exists(job_key(j))
    gone = [j for j, alive in zip(oldest, pipe.execute(), strict=True) if not alive]
    if gone:
        redis.zrem(jobs_key(model), *gone)
    return len(gone)


def list_jobs(client: Client, limit: int = 100) -> list[JobInfo]:
    """The newest `limit` jobs of the client's model (and tenant), newest first; index entries of
    jobs that expired are removed on the way."""
    if limit < 1:
        raise InvalidRequest(f"limit must be at least 1; got {limit}")
    prefix = scoped_id(client.scope.tenant, "")  # the tenant's prefix ("" is no id: not Scope.wire)
    out: list[JobInfo] = []
    start = 0
    while len(out) < limit:
        page = client.redis.zrevrange(jobs_key(client.model), start, start + limit - 1)
        if not page:
            break
        start += len(page)
        # a tenant reads only its own jobs; no tenant: only jobs of no tenant (scoped ids hold a "/")
        names: list[str] = [j.decode() if isinstance(j, bytes) else str(j) for j in page]
        jobs = [j for j in names if j.startswith(prefix) and "/" not in j[len(prefix):]]
        pipe = client.redis.pipeline(transaction=False)
        for j in jobs:
            pipe.hmget(job_key(j), JOB_FIELDS)
        gone = []
        for j, values in zip(jobs, pipe.execute(), strict=True):
            info = parse_job(values, _now())
            if info is None:
                gone.append(j)
            elif len(out) < limit:
                out.append(info)
        if gone:
            client.redis.zrem(jobs_key(client.model), *gone)
            start -= len(gone)
    return out


# --- results ------------------------------------------------------------------------------------


def output_line(kind: str, caller: str, wire: str, answer: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The output line of one input line and whether it is ok: the answer under the caller's id, or
    for an OpenAI-batch line OpenAI's output shape (`custom_id`, `response` {status_code, body},
    `error`; expired / cancelled lines: `response` null and error code batch_expired / batch_cancelled)."""
    body = {**answer, "id": caller}
    status = answer.get("status")
    ok = status == Status.ok.value
    if kind != KIND_OPENAI:
        return body, ok
    err = answer.get("error") or {}
    line: dict[str, Any] = {"id": wire, "custom_id": caller}
    if status in (Status.expired.value, Status.cancelled.value):
        line["response"] = None
        line["error"] = {"code": f"batch_{status}", "message": err.get("message", "")}
    else:
        line["response"] = {"status_code": http_status(answer), "body": body}
        line["error"] = None if ok else {"code": err.get("type", "error"), "message": err.get("message", "")}
    return line, ok


def _missing(wire: str, info: JobInfo) -> dict[str, Any]:
    """The stand-in answer of a line with no stored result once its job has ended: the answer expired
    from the result store, or (a failed job) was never given."""
    if info.status == "failed":
        message = "the job failed (its submitter stopped before its input was all registered); never answered"
        return {"id": wire, "status": Status.error.value, "error": {"type": "job_failed", "message": message}}
    message = "the answer expired from the result store (result_expires) before it was read"
    return {"id": wire, "status": Status.error.value, "error": {"type": "result_expired", "message": message}}


def job_lines(client: Client, job_id: str, *, timeout_s: float | None = None,
              poll_s: float = DEFAULT_POLL_S) -> Iterator[tuple[dict[str, Any], bool]]:
    """(output line, ok) for every input line of the job, in input order, as the answers come:
    READ_PAGE lines per round trip, waiting (polls every `poll_s`) where the next answer is not in
    yet. TimeoutError after `timeout_s` without the job's end (what was yielded stays yielded);
    JobNotFound when there is no such job."""
    info = job_info(client, job_id)  # JobNotFound first, for an id no job can have too
    job = client.scope.wire(job_id)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pos = 0
    while True:
        entries = client.redis.lrange(job_ids_key(job), pos, pos + READ_PAGE - 1)
        wires = [request_wire_id(job, pos + i) for i in range(len(entries))]
        raws = client.redis.mget([result_key(w) for w in wires]) if wires else []
        for raw, entry, wire in zip(raws, entries, wires, strict=True):
            answer = parse_answer(raw)
            if answer is None:
                if not info.ended:
                    break
                answer = _missing(wire, info)
            kind, caller = parse_ids_entry(entry)
            yield output_line(kind, caller, client.scope.caller(wire), answer)
            pos += 1
        else:
            if entries:
                continue  # the whole page was in: the next one at once
            if info.ended or (info.input_done and pos >= info.total):
                return
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"job {job_id} is {info.status} after {timeout_s:g} s: {pos:,} of "
                               f"{info.total:,} lines read")
        time.sleep(poll_s)
        info = job_info(client, job_id)


# --- `vela2 jobs` -------------------------------------------------------------------------------


def rate_and_eta(info: JobInfo, now: float) -> tuple[float, float | None]:
    """Answers per second over the job's life so far, and the seconds left at that rate (None
    while nothing is answered, 0 once the job has ended)."""
    elapsed = max(1e-9, (info.ended_at or now) - info.created_at)
    rate = info.answered / elapsed
    if info.ended:
        return rate, 0.0
    return rate, (info.counts["queued"] / rate if rate > 0 else None)


def status_line(info: JobInfo, now: float) -> str:
    """One line for a human: status, counts, rows/s and ETA."""
    rate, eta = rate_and_eta(info, now)
    c = info.counts
    eta_text = "-" if eta is None else f"{eta:,.0f} s"
    served = "".join(f"; ok by {who}: {n:,}" for who, n in sorted(info.served.items()))
    return (f"{info.id} {info.status}: {info.total:,} lines{'' if info.input_done else ' so far'}: queued "
            f"{c['queued']:,}, ok {c['ok']:,}, error {c['error']:,}, expired {c['expired']:,}, cancelled "
            f"{c['cancelled']:,}; {rate:,.1f} rows/s, ETA {eta_text}{served}")


class _Writer:
    """JSON lines to a file, one whole line per write."""

    def __init__(self, path: str):
        self.f = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())

    def write(self, obj: dict[str, Any]) -> None:
        self.f.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self.f.close()


def write_results(client: Client, job_id: str, out: str, errors: str | None = None, *,
                  timeout_s: float | None = None, poll_s: float = DEFAULT_POLL_S) -> tuple[int, int]:
    """Stream a job's output lines (job_lines) to `out`, in input order; with `errors`, the lines that
    are not ok go there instead. Returns (lines written to out, lines written to errors)."""
    w_out = _Writer(out)
    w_err = _Writer(errors) if errors else None
    n_out = n_err = 0
    try:
        for line, ok in job_lines(client, job_id, timeout_s=timeout_s, poll_s=poll_s):
            if ok or w_err is None:
                w_out.write(line)
                n_out += 1
            else:
                w_err.write(line)
                n_err += 1
    finally:
        w_out.close()
        if w_err is not None:
            w_err.close()
    return n_out, n_err


def build_parser() -> argparse.ArgumentParser:
    """The `vela2 jobs` arguments."""
    ap = argparse.ArgumentParser(prog="vela2 jobs", description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    add_url_arguments(common, DEFAULT_REDIS_URL)
    common.add_argument("--model", default=os.environ.get(ENV_MODEL, DEFAULT_MODEL), help="model name (its queues)")
    common.add_argument("--tenant", default=None, help="the jobs are this tenant's (as an API key's over HTTP)")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("submit", parents=[common], help="create a job from a JSONL file; prints its id at once")
    p.add_argument("input", metavar="IN.jsonl", help="rows, SystemOne requests or OpenAI-batch lines (custom_id, body)")
    p.add_argument("--window-s", type=float, default=DEFAULT_WINDOW_S,
                   help="completion window: requests not started by then are answered expired")
    p.add_argument("--metadata", default=None, help="free-form JSON object kept on the job")
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="requests per queue message")
    p.add_argument("--wait", action="store_true", help="then follow the job (a status line on stderr) until it ends")
    p = sub.add_parser("status", parents=[common], help="a job's status, counts, rows/s and ETA")
    p.add_argument("job")
    p.add_argument("--json", action="store_true", help="the record as JSON")
    p = sub.add_parser("results", parents=[common], help="stream a job's output, in input order")
    p.add_argument("job")
    p.add_argument("output", metavar="OUT.jsonl")
    p.add_argument("--errors", metavar="E.jsonl", default=None, help="lines that are not ok go here")
    p.add_argument("--timeout-s", type=float, default=None, help="give up waiting for answers after this")
    p = sub.add_parser("cancel", parents=[common], help="cancel a job (what no worker started is answered cancelled)")
    p.add_argument("job")
    p = sub.add_parser("list", parents=[common], help="the newest jobs of the model")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true", help="one JSON record per line")
    return ap


def _follow(client: Client, job_id: str, poll_s: float = 1.0) -> JobInfo:
    """Print a status line to stderr every `poll_s` until the job ends; returns its last record."""
    while True:
        info = job_info(client, job_id)
        print(status_line(info, _now()), file=sys.stderr, flush=True)
        if info.ended:
            return info
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    """bulk jobs that outlive their client: submit / status / results / cancel / list

    Exit codes: 0 done; 1 `results` timed out; 2 bad arguments or input; 3 Redis unreachable;
    4 no such job."""
    args = build_parser().parse_args(argv)
    try:
        url = url_from_args(args.redis, args.redis_url_file, sys.argv[1:] if argv is None else argv, log)
        with Client(url, model=args.model, tenant=args.tenant) as client:
            return _run(client, args)
    except JobNotFound as e:
        print(f"vela2 jobs: {e}", file=sys.stderr)
        return 4
    except (InvalidRequest, ConfigError) as e:
        print(f"vela2 jobs: {e}", file=sys.stderr)
        return 2
    except TimeoutError as e:
        print(f"vela2 jobs: {e}", file=sys.stderr)
        return 1
    except redis.exceptions.RedisError as e:
        print(f"vela2 jobs: redis: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
        return 3


def _run(client: Client, args: argparse.Namespace) -> int:
    if args.command == "submit":
        if not Path(args.input).is_file():
            raise InvalidRequest(f"{args.input}: no such file")
        try:
            metadata = json.loads(args.metadata) if args.metadata else None
        except ValueError as e:
            raise InvalidRequest(f"--metadata is not valid JSON: {e}") from None
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidRequest(f"--metadata must be a JSON object; got {type(metadata).__name__}")
        with open(args.input, "rb") as f:
            done = submit_job(client, f, window_s=args.window_s, metadata=metadata, chunk_size=args.chunk_size,
                              on_created=lambda job: print(job, flush=True))
        print(f"vela2 jobs: {done.id}: {done.lines:,} lines: queued {done.queued:,}, invalid {done.invalid:,}, "
              f"cancelled {done.cancelled:,}; blank {done.blank:,}", file=sys.stderr)
        if args.wait:
            _follow(client, done.id)
    elif args.command == "status":
        info = job_info(client, args.job)
        print(json.dumps(info.to_dict()) if args.json else status_line(info, _now()))
    elif args.command == "results":
        check_seconds("--timeout-s", args.timeout_s, zero_ok=True)  # NaN would wait for ever
        n_out, n_err = write_results(client, args.job, args.output, args.errors, timeout_s=args.timeout_s)
        print(f"vela2 jobs: {args.job}: wrote {n_out:,} lines to {args.output}"
              + (f" and {n_err:,} to {args.errors}" if args.errors else ""), file=sys.stderr)
    elif args.command == "cancel":
        print(status_line(cancel_job(client, args.job), _now()))
    elif args.command == "list":
        for info in list_jobs(client, args.limit):
            print(json.dumps(info.to_dict()) if args.json else status_line(info, _now()))
    return 0
