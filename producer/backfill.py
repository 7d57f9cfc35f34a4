"""`vela2 backfill IN.jsonl OUT.jsonl`: bulk scoring through the queue, bounded and resumable.

    run_backfill("in.jsonl", "out.jsonl", redis_url="redis://127.0.0.1:6379/0", model="vela2-demo",
                 window=1024, chunk_size=16)

- Streams IN line by line: each line a row or a SystemOne request (told apart by their keys).
- Deterministic ids: the request's own "id", else its content hash (`vela2.wire.messages.request_id`);
  a line with no id it can be answered under (not JSON, not an object, or an id that cannot name a
  request, such as one with a lone surrogate) is `line-<N>-<hash>` (1-based N, 12 hex digits of the
  line's bytes: `line_id`), never a caller's id.
- Resumable: OUT is read first and every id in it is skipped; a torn last line (no newline: the
  previous run was killed while writing it) is truncated before appending. `retry="timeouts"`
  (`--retry timeouts`) takes the lines this command wrote for rows that got no answer (error types
  "timeout" and "result_expired", e.g. while no worker ran) out of OUT and scores those rows again;
  `retry="errors"` does so for every line that is not ok (error of any type, expired, cancelled),
  and first deletes such a stored answer from Redis (`DROP_FAILED_SCRIPT`: only when it is not ok),
  since the write-once result store would otherwise hand the same failure back. OUT is rewritten
  without those lines (streamed to a temporary file, then renamed over it). Each result is
  appended as one whole line by one unbuffered write (fsync at exit), so killing the job at any
  moment and rerunning it ends with every id in OUT exactly once. Requests that were in flight when
  the job died are not lost: their results are read back from Redis (or they are queued again;
  the worker's write-once store answers a duplicate id once; a row whose earlier answer has
  expired from Redis meanwhile is queued again too, and counted in `rescored`).
- Backpressure: at most `window` rows are in flight (queued, being scored, or answered but not yet
  written); a chunk is queued only when it fits. `BackfillSummary.max_in_flight` records the peak.
- Bulk mode: rows travel `chunk_size` to a message on the model's backfill queue (lower priority
  than the online queue); results are polled with one pipelined MGET over the ids in flight every
  `poll_s` seconds.
- Nothing is silently missing: a bad line gets an error line at once (never queued); a row with
  no result after `timeout_s` gets an error line of type "timeout"; a row answered during this run
  whose answer expired from the result store before this run read it (`result_expires` shorter than
  the wait) gets an error line of type "result_expired" at the next poll (submissions are tracked:
  see producer.client); a later duplicate of an id within IN is not scored again (the first
  occurrence wins) and is counted in the summary.
- Redis outages: every Redis call (the recovery read, the push, the polls) is retried on
  redis ConnectionError / TimeoutError / BusyLoadingError (a restart, AOF loading) with backoff
  (0.05 s doubling to 2 s) for up to `redis_timeout_s` (default `timeout_s`) per outage; then the run
  resumes where it was (rows keep their submission times, so their `timeout_s` still bounds them).
  Pushes that failed mid-way are sent again whole: duplicates are answered once. An outage longer
  than that raises `RedisUnavailable`; `vela2 backfill` prints it as one line and exits 3 (what was
  written stays; rerun to resume).
- No worker? When nothing has been answered for `stall_warn_s` (default 60 s) while rows are in
  flight and the model's backfill queue has not shrunk meanwhile, a warning says so, with the
  number of live workers of the model (their heartbeats); once per stall.
- A progress bar (tqdm on stderr: rows/s, ETA over the line count of IN) when stderr is a
  terminal or `progress=True`; one summary line at the end.

Memory: the input is streamed and at most `window` requests are held; the sets of ids already in
OUT and already seen in IN (resume, duplicates) grow with the number of distinct ids (a few tens
of bytes each), never with the size of the rows. No torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis.exceptions

from producer.brokers import check_wait_replicas
from producer.client import (
    DEFAULT_MODEL,
    DEFAULT_REDIS_URL,
    Client,
    conflict_error,
    pack_messages,
    prepare_request,
    result_expired_error,
)
from vela2.api.schemas import Status, error_result, guess_id_task
from vela2.api.systemone import SYSTEM_ONE_VERSION, error_answer, is_system_one
from vela2.config import LIMITS
from vela2.errors import ConfigError, InvalidRequest, LimitExceeded, Vela2Error
from vela2.wire.keys import HEARTBEAT_S, id_problem, priority_lists, queue_name, result_key, workers_key
from vela2.wire.messages import build_message, deadline_to_expires, decode_json, request_id
from vela2.wire.urls import (
    BROKER_SCHEMES,
    ENV_BROKER_URL,
    RESULT_STORE_SCHEMES,
    add_url_arguments,
    check_url,
    url_from_args,
)

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 1024  # rows in flight
DEFAULT_CHUNK_SIZE = 16  # rows per queue message
DEFAULT_TIMEOUT_S = 3600.0  # per row, from its submission; then an error line of type "timeout"
DEFAULT_POLL_S = 0.05  # pause between result polls while waiting
_SIZE_CHECK_SLACK = 1024  # lines longer than max_message_bytes minus this get an exact size check
REDIS_RETRY_START_S = 0.05  # first pause after a failed Redis call; doubles up to REDIS_RETRY_MAX_S
REDIS_RETRY_MAX_S = 2.0
# What a Redis restart looks like to a client (BusyLoadingError, while it loads its AOF, is a
# ConnectionError subclass; listed for the reader).
TRANSIENT_REDIS_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
)
EXIT_REDIS_UNAVAILABLE = 3
DEFAULT_STALL_WARN_S = 60.0  # no answer for this long, the queue not shrinking: warn (no worker?)
RETRY_CHOICES = ("errors", "timeouts")
LOST_TYPES = ("timeout", "result_expired")  # error types of lines this command wrote for rows never answered
# Durations in seconds checked before anything is read: name -> whether 0 is allowed (a redis_timeout_s
# of 0 gives up at the first failed call; a 0 poll, timeout or stall warning makes no sense).
DURATIONS = {"timeout_s": False, "poll_s": False, "stall_warn_s": False, "redis_timeout_s": True}

# Delete a stored answer that is not ok (KEYS[1] = its result key), so `--retry errors` scores the row
# anew; an ok answer (or none) is left as it is. Returns 1 when it deleted one.
DROP_FAILED_SCRIPT = """
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local ok, meta = pcall(cjson.decode, raw)
if ok and type(meta) == 'table' and type(meta['vela2']) == 'table' and meta['vela2']['status'] == 'ok' then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
"""
ENV_MODEL = "VELA2_MODEL"


class RedisUnavailable(redis.exceptions.ConnectionError):
    """Redis stayed unreachable for longer than the run's `redis_timeout_s`."""


@dataclass
class BackfillSummary:
    """What one run did. `error` includes `invalid` (bad lines), `timeout`, `result_expired` and
    `id_conflict` rows."""

    rows: int = 0  # non-blank input lines read
    submitted: int = 0  # rows queued by this run
    written: int = 0  # lines appended to OUT by this run
    ok: int = 0
    error: int = 0
    expired: int = 0
    cancelled: int = 0  # rows answered `cancelled` (Client.cancel of their ids)
    invalid: int = 0  # lines answered at once with an error (bad JSON, invalid request)
    timeout: int = 0  # rows without a result after timeout_s (written as error type "timeout")
    result_expired: int = 0  # rows answered whose answer expired from Redis unread (error "result_expired")
    id_conflict: int = 0  # rows whose id already names other content in Redis (error "id_conflict")
    rescored: int = 0  # rows whose answer from an earlier run had expired from Redis: queued again
    redis_outages: int = 0  # times Redis became unreachable during the run (each retried until back)
    skipped: int = 0  # ids already in OUT (earlier runs)
    retried: int = 0  # lines of earlier runs taken out of OUT to be scored again (--retry)
    stall_warnings: int = 0  # times nothing was answered for stall_warn_s and the queue did not shrink
    duplicates: int = 0  # later lines repeating an id seen earlier in IN (the first wins)
    blank: int = 0  # empty lines, ignored
    recovered: int = 0  # results already in Redis when this run reached the row (not queued again)
    torn_bytes: int = 0  # bytes of a torn last line truncated from OUT before appending
    max_in_flight: int = 0  # peak rows in flight; never above `window`
    window: int = 0
    elapsed_s: float = 0.0
    duplicate_ids: list[str] = field(default_factory=list)  # the first few, for the report

    @property
    def rows_per_s(self) -> float:
        """Lines written per second of this run."""
        return self.written / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        """The one summary line printed at the end."""
        dups = f" {self.duplicate_ids[:5]}" if self.duplicate_ids else ""
        return (
            f"backfill: {self.rows:,} rows: ok {self.ok:,}, error {self.error:,} (invalid {self.invalid:,}, "
            f"timeout {self.timeout:,}, result_expired {self.result_expired:,}, id_conflict {self.id_conflict:,}), "
            f"expired {self.expired:,}, "
            + (f"cancelled {self.cancelled:,}, " if self.cancelled else "")
            + f"skipped {self.skipped:,} (already in OUT), "
            + (f"retried {self.retried:,}, " if self.retried else "")
            + f"duplicates {self.duplicates:,}{dups}; wrote {self.written:,} lines in {self.elapsed_s:.1f} s "
            f"({self.rows_per_s:,.1f} rows/s); max in flight {self.max_in_flight:,} (window {self.window:,})"
            + (f"; redis outages {self.redis_outages:,}" if self.redis_outages else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields plus rows_per_s."""
        return {**asdict(self), "rows_per_s": self.rows_per_s}


@dataclass
class _Pending:
    """A row in flight: what its timeout line needs, and when it was queued."""

    task: str | None
    system_one: bool
    submitted_at: float


def scan_out(path: str | Path) -> tuple[set[str], int]:
    """Ids already answered in OUT, and the byte count of a torn last line (truncated here).

    A line without its newline can only be the tail of a write cut short by a kill, so it is cut
    off and its id is done again. A complete line that is not JSON (edited by hand) is kept and
    logged; its id, if any, is done again.
    """
    done: set[str] = set()
    p = Path(path)
    if not p.exists():
        return done, 0
    torn = 0
    with open(p, "rb+") as f:
        good_end = 0
        for n, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                torn = len(line)
                break
            good_end += len(line)
            try:
                obj = json.loads(line)
                rid = obj["id"]
            except (ValueError, KeyError, TypeError):
                if line.strip():
                    log.warning("%s line %d is not a result line; its request will be answered again", p, n)
                continue
            if isinstance(rid, str):
                done.add(rid)
        if torn:
            log.warning("%s: truncating a torn last line (%d bytes, from an interrupted run)", p, torn)
            f.truncate(good_end)
    return done, torn


def is_retried(line: dict[str, Any], retry: str) -> bool:
    """Whether an OUT line is scored again under `--retry retry` (the module docstring)."""
    if retry == "errors":
        return line.get("status") != Status.ok.value
    err = line.get("error")
    return line.get("status") == Status.error.value and isinstance(err, dict) and err.get("type") in LOST_TYPES


def take_out_retries(path: str | Path, retry: str) -> set[str]:
    """Take the lines `retry` scores again out of OUT (streamed to a temporary file renamed over
    it); returns their ids. A torn last line is kept for `scan_out` to truncate."""
    if retry not in RETRY_CHOICES:
        raise InvalidRequest(f"retry must be one of {', '.join(RETRY_CHOICES)}; got {retry!r}")
    p = Path(path)
    if not p.exists():
        return set()
    ids: set[str] = set()
    tmp = p.with_name(p.name + ".retry-tmp")
    with open(p, "rb") as src, open(tmp, "wb") as dst:
        for line in src:
            try:
                obj = json.loads(line) if line.endswith(b"\n") else None
            except ValueError:
                obj = None
            if isinstance(obj, dict) and isinstance(obj.get("id"), str) and is_retried(obj, retry):
                ids.add(obj["id"])
                continue
            dst.write(line)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, p)
    return ids


def count_lines(path: str | Path, block: int = 1 << 20) -> int:
    """Lines of a file (a last line without newline counts), read in blocks: constant memory."""
    n = 0
    last = b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(block):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


class LineWriter:
    """Appends JSON lines to OUT: each line is one unbuffered write of the whole line (so a kill
    leaves at most a torn last line, which `scan_out` truncates); fsync when closed."""

    def __init__(self, path: str | Path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, obj: dict[str, Any]) -> None:
        """Append one JSON object as one line. A string UTF-8 cannot encode (a lone surrogate, e.g.
        quoted in a stored answer's message) is written as a JSON escape instead: a line is never lost
        to its encoding, and it reads back as the same string."""
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"
        try:
            encoded = text.encode("utf-8")
        except UnicodeEncodeError:
            encoded = (json.dumps(obj, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")
        data = memoryview(encoded)
        while data:
            data = data[os.write(self.fd, data) :]

    def close(self) -> None:
        """fsync and close."""
        try:
            os.fsync(self.fd)
        finally:
            os.close(self.fd)


def line_id(lineno: int, raw: bytes, obj: Any) -> str:
    """The id line `lineno` is answered, resumed and de-duplicated under: the request's own id (or
    its content id, `request_id`); for a line with no id it can be answered under (not JSON, not an
    object, or an id that cannot name a request: `id_problem`, e.g. a lone surrogate UTF-8 cannot
    write to OUT) `line-<N>-<12 hex digits of the hash of its bytes>`. The hash is what keeps it from
    being a caller's id: with a plain `line-<N>`, a real row called `line-1` after a bad line 1 was
    taken for a duplicate of it, and skipped by every rerun as already in OUT. It is stable from run
    to run of the same IN, so a rerun skips the bad line's own error line."""
    if isinstance(obj, dict):
        rid = request_id(obj)
        if id_problem(rid) is None:
            return rid
    return f"line-{lineno}-{hashlib.sha256(raw.strip()).hexdigest()[:12]}"


def _error_line(obj: Any, rid: str, exc: BaseException) -> dict[str, Any]:
    """The error line of a request: a SystemOne error answer, else an error RowResult (its task as
    predict() gives a refused request's, `guess_id_task`: escaped where UTF-8 cannot encode it)."""
    if is_system_one(obj):
        return {**error_answer(obj, exc), "id": rid}
    return error_result(rid, guess_id_task(obj)[1], exc).to_json_dict()


def _lost_line(rid: str, pending: _Pending, model: str, code: str, message: str) -> dict[str, Any]:
    """The error line of a row in flight that will get no answer (timeout, result_expired), in the
    shape of its request: a SystemOne error answer, else an error RowResult."""
    err = {"type": code, "message": message}
    if pending.system_one:
        return {"version": SYSTEM_ONE_VERSION, "model": model, "id": rid, "status": Status.error.value, "error": err}
    out: dict[str, Any] = {"id": rid, "task": pending.task, "status": Status.error.value, "error": err}
    return out if pending.task is not None else {k: v for k, v in out.items() if k != "task"}


class _Backfill:
    """One run's state: the in-flight table, the writer, the counters."""

    def __init__(
        self,
        client: Client,
        writer: LineWriter,
        *,
        window: int,
        chunk_size: int,
        timeout_s: float,
        deadline_s: float | None,
        poll_s: float,
        bar: Any,
        redis_timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        stall_warn_s: float = DEFAULT_STALL_WARN_S,
        drop_failed: set[str] | None = None,
    ):
        self.client = client
        self.writer = writer
        self.window = window
        self.chunk_size = max(1, min(chunk_size, window))
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self.poll_s = poll_s
        self.redis_timeout_s = timeout_s if redis_timeout_s is None else redis_timeout_s
        self.bar = bar
        self.clock = clock
        self.queue = queue_name(client.model, backfill=True)
        self.pending: dict[str, _Pending] = {}  # insertion order = submission order
        self.buffer: list[tuple[str, Any, _Pending]] = []
        self.summary = BackfillSummary(window=window)
        self._last_poll = 0.0
        self.stall_warn_s = stall_warn_s
        self._stall: tuple[float, int] | None = None  # (when, queue depth) sampled since the last answer
        self._quiet_since = clock()  # the last answer (or the start)
        self._warned = False  # the current stall was reported
        self.drop_failed = drop_failed or set()  # ids whose stored non-ok answer goes before they are queued

    # --- redis ---------------------------------------------------------------------------------

    def _redis(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), retried with backoff through a Redis outage of up to redis_timeout_s; raises
        RedisUnavailable after that. `what` names the call in the messages."""
        started = self.clock()
        pause = REDIS_RETRY_START_S
        failures = 0
        while True:
            try:
                out = fn(*args)
            except TRANSIENT_REDIS_ERRORS as e:
                failures += 1
                now = self.clock()
                if failures == 1:
                    self.summary.redis_outages += 1
                    log.info("redis unreachable while %s (%s); retrying for up to %g s", what, e, self.redis_timeout_s)
                    self.bar.set_postfix(redis="reconnecting", refresh=True)
                left = started + self.redis_timeout_s - now
                if left <= 0:
                    msg = " ".join(str(e).split()) or type(e).__name__
                    raise RedisUnavailable(
                        f"redis unreachable for {now - started:.1f} s (redis_timeout_s={self.redis_timeout_s:g}) "
                        f"while {what}: {msg}"
                    ) from e
                time.sleep(min(pause, left))
                pause = min(pause * 2, REDIS_RETRY_MAX_S)
                continue
            if failures:
                log.info(
                    "redis is back after %.1f s (%d failed calls while %s)", self.clock() - started, failures, what
                )
                self.bar.set_postfix(in_flight=len(self.pending), refresh=True)
            return out

    # --- output -------------------------------------------------------------------------------

    def _write(self, answer: dict[str, Any]) -> None:
        self.writer.write(answer)
        s = self.summary
        s.written += 1
        status = answer.get("status")
        if status == Status.ok:
            s.ok += 1
        elif status == Status.expired:
            s.expired += 1
        elif status == Status.cancelled:
            s.cancelled += 1
        else:
            s.error += 1
        self.bar.update(1)

    def _refuse(self, obj: Any, rid: str, exc: BaseException) -> None:
        self.summary.invalid += 1
        self._write(_error_line(obj, rid, exc))

    # --- input --------------------------------------------------------------------------------

    def feed(self, lineno: int, raw: bytes, seen: set[str], done: set[str]) -> None:
        """Handle one input line: answer it at once, skip it, or buffer it for the queue."""
        s = self.summary
        if not raw.strip():
            s.blank += 1
            self.bar.update(1)
            return
        s.rows += 1
        try:
            # refused by name: not JSON, not UTF-8, nested deeper than MAX_JSON_DEPTH (was a RecursionError)
            obj: Any = decode_json(raw, f"line {lineno}")
            parse_error: BaseException | None = None
        except InvalidRequest as e:
            obj, parse_error = None, e
        rid = line_id(lineno, raw, obj)
        if rid in seen:
            s.duplicates += 1
            if len(s.duplicate_ids) < 20:
                s.duplicate_ids.append(rid)
            self.bar.update(1)
            return
        seen.add(rid)
        if rid in done:
            s.skipped += 1
            self.bar.update(1)
            return
        if parse_error is not None or not isinstance(obj, dict):
            exc = parse_error or InvalidRequest(
                f"line {lineno}: a request must be a JSON object; got {type(obj).__name__}"
            )
            self._refuse(obj, rid, exc)
            return
        try:
            _, obj = prepare_request(obj, self.client.model)
            if len(raw) > LIMITS.max_message_bytes - _SIZE_CHECK_SLACK:
                build_message([obj], self.queue, chunk=True)  # exact check, only for huge lines
        except Vela2Error as e:
            self._refuse(obj, rid, type(e)(f"line {lineno}: {e}"))
            return
        task = obj.get("task") if isinstance(obj.get("task"), str) else None
        self.buffer.append((rid, obj, _Pending(task, is_system_one(obj), 0.0)))
        if len(self.buffer) >= self.chunk_size:
            self.send()
        elif self.pending and self.clock() - self._last_poll >= self.poll_s:
            self.poll()

    def send(self) -> None:
        """Queue the buffered rows as one chunk once they fit in the window."""
        if not self.buffer:
            return
        batch, self.buffer = self.buffer, []
        again = [rid for rid, _, _ in batch if rid in self.drop_failed]
        if again:  # --retry errors: their stored failures go, so that they are scored anew
            self._redis("dropping failed answers", self._drop, again)
        # Results already in Redis (rows in flight when an earlier run was killed) are written now.
        # A row whose earlier answer has expired from Redis since is queued again: no answer of it
        # was ever written to OUT, and scoring it anew is what a rerun is for.
        stored = self._redis("reading stored results", self.client.lookup_many, [rid for rid, _, _ in batch])
        # An id that already names other content (answered or pending) gets an id_conflict error line,
        # never that other request's answer; the others are marked submitted here.
        scope = self.client.scope
        claims = self._redis("checking ids", self.client.claim,
                             scope.wire_items([(rid, obj) for rid, obj, _ in batch]), self.queue)
        conflicts = {scope.caller(w) for w in claims.conflicts}
        todo = []
        for rid, obj, pend in batch:
            state, answer = stored[rid]
            if rid in conflicts:
                self.summary.id_conflict += 1
                self._write(_error_line(obj, rid, conflict_error([rid])))
            elif answer is not None:
                self.summary.recovered += 1
                self._write({**answer, "id": rid})
            else:
                self.summary.rescored += state == "expired" and rid not in again  # (retried: counted apart)
                todo.append((rid, obj, pend))
        if not todo:
            return
        while len(self.pending) + len(todo) > self.window:
            if not self.poll():
                time.sleep(self.poll_s)
        messages = pack_messages(
            scope.wire_items([(rid, obj) for rid, obj, _ in todo]),
            self.queue,
            chunk_size=self.chunk_size,
            expires=deadline_to_expires(self.deadline_s),
        )
        self._redis("queueing", self.client._push, messages)
        now = self.clock()
        for rid, _, pend in todo:
            pend.submitted_at = now
            self.pending[rid] = pend
        self.summary.submitted += len(todo)
        self.summary.max_in_flight = max(self.summary.max_in_flight, len(self.pending))
        self.bar.set_postfix(in_flight=len(self.pending), refresh=False)

    def _drop(self, ids: list[str]) -> None:
        pipe = self.client.redis.pipeline(transaction=False)
        for rid in ids:
            pipe.eval(DROP_FAILED_SCRIPT, 1, result_key(self.client.scope.wire(rid)))
        pipe.execute()
        self.drop_failed.difference_update(ids)

    # --- results ------------------------------------------------------------------------------

    def poll(self) -> int:
        """One MGET over the ids in flight (results + markers): write what arrived, an error line
        for what expired unread, time out the overdue; returns the number of rows that left the
        window."""
        self._last_poll = self.clock()
        if not self.pending:
            return 0
        ids = list(self.pending)
        got = self._redis("polling results", self.client.lookup_many, ids)
        freed = 0
        now = self.clock()
        model = self.client.model
        for rid in ids:
            state, answer = got[rid]
            if answer is not None:
                self._write({**answer, "id": rid})
            elif state == "expired":
                self.summary.result_expired += 1
                self._write(_lost_line(rid, self.pending[rid], model, "result_expired", str(result_expired_error(rid))))
            elif now - self.pending[rid].submitted_at > self.timeout_s:
                self.summary.timeout += 1
                message = f"no result within timeout_s={self.timeout_s:g} s of submission"
                self._write(_lost_line(rid, self.pending[rid], model, "timeout", message))
            else:
                continue
            del self.pending[rid]
            freed += 1
        if freed:
            self._quiet_since, self._stall, self._warned = now, None, False
        elif now - self._quiet_since >= self.stall_warn_s and not self._warned:
            self._check_stall(now)
        return freed

    def _queue_depth(self) -> tuple[int, int]:
        """(messages waiting on the model's backfill queue, live workers of the model): one round trip
        when the queues sit in the result store's Redis; on another Redis broker two; on RabbitMQ the
        depth is not read (-1: only the live workers tell)."""
        broker = self.client.broker
        pipe = self.client.redis.pipeline(transaction=False)
        same = broker is self.client.redis
        if same:
            for name in priority_lists(self.queue):
                pipe.llen(name)
        pipe.zcount(workers_key(self.client.model), time.time() - 3 * HEARTBEAT_S, "+inf")
        *depths, live = pipe.execute()
        if not same and hasattr(broker, "llen"):  # another Redis
            depths = [broker.llen(name) for name in priority_lists(self.queue)]
        elif not same:
            return -1, int(live)
        return sum(int(d) for d in depths), int(live)

    def _check_stall(self, now: float) -> None:
        """Nothing answered for stall_warn_s: sample the queue; when it has not shrunk over another
        stall_warn_s, warn once (no worker for this model?)."""
        depth, live = self._redis("reading the queue depth", self._queue_depth)
        if self._stall is None:
            self._stall = (now, depth)
            return
        since, before = self._stall
        if now - since < self.stall_warn_s:
            return
        if depth >= before and (depth >= 0 or live == 0):  # depth -1: RabbitMQ, warn when no worker is live
            self._warned = True
            self.summary.stall_warnings += 1
            log.warning("no answer for %.0f s and the queue %s is not shrinking (%d messages, %d then): is a "
                        "worker running for model %r? (%d live workers)", now - self._quiet_since, self.queue,
                        depth, before, self.client.model, live)
        self._stall = (now, depth)

    def drain(self) -> None:
        """Queue what is buffered and wait for every row in flight."""
        self.send()
        while self.pending:
            if not self.poll():
                time.sleep(self.poll_s)


def _progress_bar(enabled: bool, total: int | None) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit="row",
        file=sys.stderr,
        disable=not enabled,
        dynamic_ncols=True,
        smoothing=0.1,
        desc="backfill",
    )


def run_backfill(
    in_path: str | Path,
    out_path: str | Path,
    *,
    redis_url: str = DEFAULT_REDIS_URL,
    model: str = DEFAULT_MODEL,
    window: int = DEFAULT_WINDOW,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    deadline_s: float | None = None,
    progress: bool | None = None,
    poll_s: float = DEFAULT_POLL_S,
    redis: Any = None,
    redis_timeout_s: float | None = None,
    tenant: str | None = None,
    retry: str | None = None,
    stall_warn_s: float = DEFAULT_STALL_WARN_S,
    broker_url: str | None = None,
    wait_replicas: int = 0,
) -> BackfillSummary:
    """Score every request of IN through the queue into OUT (see the module docstring).

    `window`: most rows in flight; `chunk_size`: rows per message; `timeout_s`: per row, then an
    error line of type "timeout"; `deadline_s`: Celery `expires` per message (the worker answers
    `expired` after it); `progress`: None = a bar when stderr is a terminal. `redis` replaces the
    connection made from `redis_url` (tests). `redis_timeout_s`: the longest Redis outage the run
    rides out (default `timeout_s`), then RedisUnavailable. `tenant`: the ids are this tenant's
    (producer.client.Scope; OUT holds them as given). `retry`: "timeouts" or "errors", the lines of
    OUT scored again (module docstring). `stall_warn_s`: warn after this long without an answer
    while the queue does not shrink. `broker_url`: the workers' broker when it is not the Redis at
    `redis_url`. `wait_replicas`: each push returns only once this many replicas of the broker's Redis
    hold its messages (Client's `wait_replicas`; a push that reaches fewer is retried like a Redis
    timeout). Returns the summary (also logged). A URL of the wrong scheme raises ConfigError
    naming it (password masked) before anything is read.
    """
    if redis is None:
        check_url(redis_url, "result store", RESULT_STORE_SCHEMES)
    if broker_url:
        check_url(broker_url, "broker", BROKER_SCHEMES)
    if window < 1:
        raise InvalidRequest(f"window must be at least 1; got {window}")
    check_wait_replicas(wait_replicas, broker_url)
    if chunk_size < 1:
        raise InvalidRequest(f"chunk_size must be at least 1; got {chunk_size}")
    check_durations({"timeout_s": timeout_s, "poll_s": poll_s, "stall_warn_s": stall_warn_s,
                     "redis_timeout_s": redis_timeout_s})
    deadline_to_expires(deadline_s)  # a deadline out of bounds is refused before anything is queued
    t0 = time.monotonic()
    retried = take_out_retries(out_path, retry) if retry else set()
    done, torn = scan_out(out_path)
    enabled = sys.stderr.isatty() if progress is None else progress
    bar = _progress_bar(enabled, count_lines(in_path) if enabled else None)
    client = Client(redis_url, model=model, redis=redis, tenant=tenant, broker_url=broker_url,
                    wait_replicas=wait_replicas)
    writer = LineWriter(out_path)
    job = _Backfill(
        client, writer, window=window, chunk_size=chunk_size, timeout_s=timeout_s, deadline_s=deadline_s,
        poll_s=poll_s, bar=bar, redis_timeout_s=redis_timeout_s, stall_warn_s=stall_warn_s,
        drop_failed=retried if retry == "errors" else None,
    )  # fmt: skip
    job.summary.torn_bytes = torn
    job.summary.retried = len(retried)
    seen: set[str] = set()
    try:
        with open(in_path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                job.feed(lineno, raw, seen, done)
        job.drain()
    finally:
        writer.close()
        bar.close()
        if redis is None:
            client.close()
        job.summary.elapsed_s = time.monotonic() - t0
    log.info("%s", job.summary.line())
    return job.summary


def check_seconds(name: str, value: float | None, *, zero_ok: bool = False) -> None:
    """Refuse a duration that is not a finite number of seconds > 0 (>= 0 with `zero_ok`; None: unset)
    with InvalidRequest naming it and the value: NaN compares false with everything, so `--timeout-s
    nan` never timed out, and a negative `--poll-s` crashed in time.sleep mid-run."""
    if value is None or (math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
        return
    raise InvalidRequest(f"{name} must be a finite number of seconds {'>= 0' if zero_ok else '> 0'}; got {value:g}")


def check_durations(values: dict[str, float | None], *, as_flags: bool = False) -> None:
    """`check_seconds` over DURATIONS, each named as its parameter or (`as_flags`) its flag: `--poll-s`."""
    for name, value in values.items():
        check_seconds("--" + name.replace("_", "-") if as_flags else name, value, zero_ok=DURATIONS[name])


def build_parser() -> argparse.ArgumentParser:
    """The `vela2 backfill` arguments (shared with the CLI)."""
    ap = argparse.ArgumentParser(prog="vela2 backfill", description=__doc__.splitlines()[0])
    ap.add_argument("input", metavar="IN.jsonl", help="one row or SystemOne request per line")
    ap.add_argument("output", metavar="OUT.jsonl", help="results, one line per input id (appended; resumable)")
    add_url_arguments(ap, DEFAULT_REDIS_URL)
    ap.add_argument("--broker", default=os.environ.get(ENV_BROKER_URL) or None,
                    help=f"the workers' broker URL when it is not the Redis of --redis (default ${ENV_BROKER_URL})")
    ap.add_argument("--model", default=os.environ.get(ENV_MODEL, DEFAULT_MODEL), help="model name (its queues)")
    ap.add_argument("--wait-replicas", type=int, default=0, metavar="N",
                    help="each push returns once N replicas of the broker's Redis hold it (Redis WAIT; Sentinel)")
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="most rows in flight (backpressure)")
    ap.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="rows per queue message")
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="per row; then an error line")
    ap.add_argument("--deadline-s", type=float, default=None, help="the worker answers 'expired' after this")
    ap.add_argument("--retry", choices=RETRY_CHOICES, default=None,
                    help="on resume, score again the rows OUT holds as timeouts (no answer came: no worker?) or as "
                    "errors (any line not ok; their stored failures are dropped from Redis first)")
    ap.add_argument("--stall-warn-s", type=float, default=DEFAULT_STALL_WARN_S,
                    help="warn when nothing is answered for this long and the queue does not shrink")
    ap.add_argument("--tenant", default=None, help="the ids are this tenant's (as with an API key's tenant over HTTP)")
    ap.add_argument("--poll-s", type=float, default=DEFAULT_POLL_S, help="pause between result polls")
    ap.add_argument(
        "--redis-timeout-s", type=float, default=None, help="longest Redis outage ridden out (default --timeout-s)"
    )
    bar = ap.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None, help="always show the bar")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="never show the bar")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON instead of a line")
    return ap


def main(argv: list[str] | None = None) -> int:
    """bulk submit IN.jsonl -> OUT.jsonl: windowed, resumable (prints the summary line)

    Exit code 0 when every input id has its line in OUT (error lines included), 2 for bad
    arguments, 3 when Redis stayed unreachable past --redis-timeout-s (or refused a write), 130
    when interrupted (rerun to resume in both cases)."""
    args = build_parser().parse_args(argv)
    if not Path(args.input).is_file():
        print(f"vela2 backfill: {args.input}: no such file", file=sys.stderr)
        return 2
    try:
        check_durations({name: getattr(args, name) for name in DURATIONS}, as_flags=True)
        redis_url = url_from_args(args.redis, args.redis_url_file, sys.argv[1:] if argv is None else argv, log)
        summary = run_backfill(
            args.input,
            args.output,
            redis_url=redis_url,
            model=args.model,
            window=args.window,
            chunk_size=args.chunk_size,
            timeout_s=args.timeout_s,
            deadline_s=args.deadline_s,
            progress=args.progress,
            poll_s=args.poll_s,
            redis_timeout_s=args.redis_timeout_s,
            tenant=args.tenant,
            retry=args.retry,
            stall_warn_s=args.stall_warn_s,
            broker_url=args.broker,
            wait_replicas=args.wait_replicas,
        )
    except (InvalidRequest, LimitExceeded, ConfigError) as e:
        print(f"vela2 backfill: {e}", file=sys.stderr)
        return 2
    except redis.exceptions.RedisError as e:  # an outage past redis_timeout_s, or a refused write (OOM)
        msg = " ".join(str(e).split()) or type(e).__name__
        print(f"vela2 backfill: {msg}; rerun the same command to resume", file=sys.stderr)
        return EXIT_REDIS_UNAVAILABLE
    except KeyboardInterrupt:
        print("vela2 backfill: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    print(json.dumps(summary.to_dict()) if args.json else summary.line(), flush=True)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(main())
