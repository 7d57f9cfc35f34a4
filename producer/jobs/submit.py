"""`submit_job`: a JSONL input becomes a bulk job, streamed. The record is created first (its id is
known at once: `on_created`), then the input lines are registered on it and their requests queued
on the backfill queue PUSH_LINES lines per round trip (the lines, the total and the beat before the
messages, so a worker never counts an answer the job does not know yet); a line that cannot be
queued is answered at once with its error (producer.jobs.input_lines). While the input is read a
thread keeps the job's `beat` fresh, so a slow input does not make it read `failed`."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis.exceptions

from producer import brokers
from producer.cells import CellsClient, job_client
from producer.client import Client
from producer.jobs.input_lines import cancelled_meta, invalid_answer, parse_line
from producer.jobs.records import prune_jobs_index
from producer.prepare import pack_messages
from vela2.config import LIMITS
from vela2.errors import InvalidRequest, UploadTimeout
from vela2.wire import scripts
from vela2.wire.jobs import (
    BEAT_SCRIPT,
    DEFAULT_WINDOW_S,
    FAIL_JOB_SCRIPT,
    FINISH_INPUT_SCRIPT,
    JOB_ERROR_BYTES,
    SUBMIT_BEAT_S,
    ids_entry,
    invalid_entry,
    job_keys,
    new_job_id,
    request_wire_id,
)
from vela2.wire.keys import job_key, jobs_key, queue_name
from vela2.wire.results import DEFAULT_RESULT_EXPIRES_S, ResultStore

log = logging.getLogger(__name__)

PUSH_LINES = 512  # input lines registered and queued per round trip
DEFAULT_CHUNK_SIZE = 16  # requests per queue message
MAX_METADATA_BYTES = 65_536  # a job's free-form metadata, as JSON (HTTP's 16 pairs of 64 + 512 characters fit)


@dataclass
class JobSubmitted:
    """What `submit_job` did: the job id and its input lines by fate."""

    id: str
    lines: int = 0  # lines registered on the job (non-blank input lines)
    queued: int = 0  # sent to the workers
    invalid: int = 0  # answered at once with an error (bad lines)
    cancelled: int = 0  # answered `cancelled` at once: the job was cancelled while its input streamed in
    blank: int = 0  # empty lines, skipped


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
        self.answered: list[tuple[str, dict[str, Any]]] = []  # (wire id, meta) answered here (cancelled)
        self.invalid = 0  # invalid lines among the waiting ones (counted as errors with the push)
        self.error_bytes = 0  # bytes of invalid lines' entries so far (JOB_ERROR_BYTES keep messages)
        self.cancelled = False  # the job's cancel was seen: the rest is answered here, not queued
        self.summary = JobSubmitted(client.scope.caller(job))

    def add(self, lineno: int, raw: bytes) -> None:
        """Register one input line (pushed with the next PUSH_LINES)."""
        if not raw.strip():
            self.summary.blank += 1
            return
        kind, caller, obj, err = parse_line(raw, lineno, self.client.model)
        wire = request_wire_id(self.job, self.summary.lines)
        self.summary.lines += 1
        if err is not None:  # answered here, in its ids entry: counted on the job with the push
            self.summary.invalid += 1
            self.invalid += 1
            keep = self.error_bytes < JOB_ERROR_BYTES
            entry = invalid_entry(kind, caller, invalid_answer(wire, obj, err) if keep else None)
            self.error_bytes += len(entry)
            self.entries.append(entry)
            if len(self.entries) >= PUSH_LINES:
                self.push()
            return
        self.entries.append(ids_entry(kind, caller))
        if self.cancelled:
            self.summary.cancelled += 1
            self.answered.append((wire, cancelled_meta(wire, obj)))
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
                                 expires=datetime.fromtimestamp(self.expires, UTC), job=self.job,
                                 tenant=self.client.scope.tenant) if self.good else []
        pipe = self.client.redis.pipeline(transaction=False)
        pipe.rpush(self.keys[1], *self.entries)
        pipe.expire(self.keys[1], self.ttl_s)
        pipe.hincrby(self.keys[0], "total", len(self.entries))
        if self.invalid:  # answered in their entries: counted with the lines (the job may end on them)
            pipe.hincrby(self.keys[0], "error", self.invalid)
        pipe.hset(self.keys[0], "beat", time.time())
        same = self.client.broker is self.client.redis  # queues beside the job record: one round trip
        if same:
            brokers.queue_commands(pipe, messages)
        pipe.hget(self.keys[0], "cancel_at")
        wait = self.client.wait_replicas if same else 0
        brokers.wait_command(pipe, wait)
        replies = scripts.execute(pipe)
        if wait:
            brokers.check_replicated(replies, wait)
            replies = replies[:-1]
        if not same:  # another broker (Redis or RabbitMQ): queued once the lines are registered
            brokers.push(self.client.broker, messages, self.client.wait_replicas)
        self.summary.queued += len(self.good)
        if self.answered:
            n = len(self.answered)
            failed = [o for o in self.store.store(self.answered, jobs=[self.job] * n,
                                                  tenants=[self.client.scope.tenant] * n)
                      if isinstance(o, Exception)]
            if failed:
                raise failed[0]
        self.entries, self.good, self.answered, self.invalid = [], [], [], 0
        self.cancelled = self.cancelled or replies[-1] is not None

    def finish(self) -> None:
        """The input is all registered: the job may end now (when every line is answered)."""
        self.push()
        self.client.redis.eval(FINISH_INPUT_SCRIPT, 2, *self.keys, time.time(), self.store.ttl_s)


def submit_job(
    client: Client | CellsClient,
    lines: Iterable[bytes],
    *,
    window_s: float = DEFAULT_WINDOW_S,
    metadata: dict[str, Any] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    on_created: Callable[[str], None] | None = None,
    result_ttl_s: int = DEFAULT_RESULT_EXPIRES_S,
    max_seconds: float | None = None,
    job_id: str | None = None,
    input_file_id: str | None = None,
) -> JobSubmitted:
    """Create a job for `client`'s model (and tenant) from JSONL `lines` (bytes, as a file opened
    "rb" yields them) and queue its requests on the backfill queue, streaming. `window_s`: the
    completion window (0 < window_s <= LIMITS.max_deadline_s): requests not started by then are
    answered `expired`. `metadata`: free-form JSON (at most MAX_METADATA_BYTES). `on_created(job id)`
    is called as soon as the job exists, before the input is read. `result_ttl_s`: how long the
    job's record lives once it ended, and the TTL of the error results stored here (the workers'
    result_expires_s). `max_seconds`: the longest the input may take to read and queue (an HTTP
    upload's cap). `job_id`: the id to create it under (new_job_id's; the HTTP route reserves it
    against the tenant's live_jobs quota first); `input_file_id`: the Files API file the lines came
    from. InvalidRequest for bad arguments (nothing created). When
    the input cannot be all registered (its reading raised, Redis refused, `max_seconds` passed: then
    UploadTimeout), the job is ended `failed` at once, naming why, and what it queued is cancelled;
    the error is raised."""
    if not 0 < window_s <= LIMITS.max_deadline_s:  # NaN fails this too
        raise InvalidRequest(f"window_s is {window_s!r}; it must be > 0 and at most {LIMITS.max_deadline_s:,.0f} s")
    if chunk_size < 1:
        raise InvalidRequest(f"chunk_size must be at least 1; got {chunk_size}")
    meta = _metadata_json(metadata)
    client = job_client(client, caller_id := job_id or new_job_id())  # with cells: the cell that holds the job
    job = client.scope.wire(caller_id)
    created = time.time()
    # Until it ends, the record lives through its window plus a result lifetime (a job nobody runs
    # goes away); the script that ends it sets the result TTL from then on.
    ttl_s = int(window_s) + int(result_ttl_s)
    _create_record(client, caller_id, job, created, window_s, meta, ttl_s, input_file_id)
    if on_created is not None:
        on_created(caller_id)
    sub = _Submitter(client, job, chunk_size=chunk_size, expires=created + window_s, ttl_s=ttl_s,
                     result_ttl_s=result_ttl_s)
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    try:
        with _beating(client, sub.keys[0]):  # alive while it reads, however slowly its input comes
            for lineno, raw in enumerate(lines, 1):
                sub.add(lineno, raw)
                if deadline is not None and lineno % 1000 == 0 and time.monotonic() > deadline:
                    raise UploadTimeout(f"the input took longer than {max_seconds:g} s to register: "
                                        f"{sub.summary.lines:,} lines read, {sub.summary.lines - len(sub.entries):,} "
                                        f"registered; job {caller_id} failed")
        sub.finish()
    except BaseException as exc:
        _fail(client, sub.keys[0], f"{type(exc).__name__}: {exc}"[:500])
        raise
    return sub.summary


def _metadata_json(metadata: dict[str, Any] | None) -> str:
    """A job's metadata as the JSON its record keeps; InvalidRequest for what standard JSON cannot
    hold or past MAX_METADATA_BYTES."""
    try:  # standard JSON that UTF-8 can write: every reader (HTTP included) can serve it back
        meta = json.dumps(metadata or {}, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        n_bytes = len(meta.encode("utf-8"))
    except (TypeError, ValueError) as e:  # NaN / Infinity, a lone surrogate, a value JSON cannot hold
        raise InvalidRequest(f"metadata is not standard JSON text: {e}") from None
    if n_bytes > MAX_METADATA_BYTES:
        raise InvalidRequest(f"metadata has {n_bytes:,} bytes of JSON; limit {MAX_METADATA_BYTES:,}")
    return meta


def _create_record(client: Client, caller_id: str, job: str, created: float, window_s: float, meta: str,
                   ttl_s: int, input_file_id: str | None = None) -> None:
    """Write the job's record (input `reading`, counts 0, TTL `ttl_s`) and index it; prune the index."""
    pipe = client.redis.pipeline(transaction=True)
    pipe.hset(job_key(job), mapping={
        "id": caller_id, "model": client.model, "tenant": client.scope.tenant or "", "created_at": created,
        "deadline": created + window_s, "window_s": window_s, "metadata": meta, "input": "reading",
        "beat": created, "total": 0, "ok": 0, "error": 0, "expired": 0, "cancelled": 0,
        **({"input_file_id": input_file_id} if input_file_id else {}),
    })
    pipe.expire(job_key(job), ttl_s)
    pipe.zadd(jobs_key(client.model), {job: created})
    pipe.execute()
    try:
        prune_jobs_index(client.redis, client.model)
    except redis.exceptions.RedisError as e:  # housekeeping: the next job prunes again
        log.warning("could not prune the job index of %s: %s", client.model, e)


def _fail(client: Client, key: str, reason: str) -> None:
    """End a job whose input could not be all registered: `failed` with its reason, now (rather than
    after SUBMIT_STALE_S without a beat), and cancelled, so workers skip what it queued. Best effort:
    a Redis that refuses this too leaves the job to go `failed` when its beat goes stale."""
    try:
        client.redis.eval(FAIL_JOB_SCRIPT, 1, key, time.time(), reason)
    except redis.exceptions.RedisError as e:
        log.warning("could not mark job %s failed (%s): it reads failed once its beat is stale", key, e)


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
                client.redis.eval(BEAT_SCRIPT, 1, key, time.time())
            except Exception as e:  # noqa: BLE001 - the submitter's own round trips raise what matters
                log.warning("job beat failed: %s", e)

    thread = threading.Thread(target=beat, name="vela2-job-beat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
