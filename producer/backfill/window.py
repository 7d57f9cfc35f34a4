"""The windowed submit loop of one backfill run (`BackfillRun`): input lines are fed in one by one
(`feed`: answered at once, skipped, or buffered), queued a chunk at a time once the chunk fits in
the window of rows in flight (`send`), and their results polled with one MGET over the ids in
flight (`poll`) and appended to OUT; `drain` waits for the last ones. Every Redis call rides out an
outage of up to `redis_timeout_s` (retried with backoff; then RedisUnavailable), and a run with no
answer while the queue does not shrink warns once (no worker?).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.exceptions

from producer.answers import result_expired_error
from producer.backfill.lines import Pending, error_line, line_id, lost_line
from producer.backfill.output import LineWriter
from producer.backfill.summary import BackfillSummary
from producer.cells import CellsClient
from producer.client import Client
from producer.prepare import pack_messages, prepare_request
from producer.submitting import conflict_error
from vela2.api.schemas import Status
from vela2.api.systemone import is_system_one
from vela2.config import LIMITS
from vela2.errors import CellUnavailable, InvalidRequest, Vela2Error
from vela2.wire import scripts, taking
from vela2.wire.keys import HEARTBEAT_S, queue_name, result_key, workers_key
from vela2.wire.messages import build_message, deadline_to_expires, decode_json
from vela2.wire.results import META_ROW_LUA

log = logging.getLogger(__name__)

DEFAULT_STALL_WARN_S = 60.0  # no answer for this long, the queue not shrinking: warn (no worker?)
_SIZE_CHECK_SLACK = 1024  # lines longer than max_message_bytes minus this get an exact size check
REDIS_RETRY_START_S = 0.05  # first pause after a failed Redis call; doubles up to REDIS_RETRY_MAX_S
REDIS_RETRY_MAX_S = 2.0
# What a Redis restart looks like to a client (BusyLoadingError, while it loads its AOF, is a
# ConnectionError subclass; listed for the reader).
TRANSIENT_REDIS_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    CellUnavailable,  # over cells: a cell's outage is ridden out as one Redis's is
)
# Delete a stored answer that is not ok (KEYS[1] = its result key), so `--retry errors` scores the row
# anew; an ok answer (or none) is left as it is (its row read as vela2.wire.results.meta_row reads it,
# either layout). Returns 1 when it deleted one.
DROP_FAILED_SCRIPT = META_ROW_LUA + """
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local ok, meta = pcall(cjson.decode, raw)
local row = ok and meta_row(meta) or nil
if row and row['status'] == 'ok' then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
"""


class RedisUnavailable(redis.exceptions.ConnectionError):
    """Redis stayed unreachable for longer than the run's `redis_timeout_s`."""


class BackfillRun:
    """One run's state: the in-flight table, the writer, the counters."""

    def __init__(
        self,
        client: Client | CellsClient,
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
        self.pending: dict[str, Pending] = {}  # insertion order = submission order
        self.buffer: list[tuple[str, Any, Pending]] = []
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

    def _by_cell(self, items: list[Any]) -> list[tuple[Client, list[Any]]]:
        """(client, its items) for each Redis the items' ids (item[0], as the caller names them) go
        to: over cells each cell's client with its ids (vela2.wire.cells), else the one client."""
        client = self.client
        if not isinstance(client, CellsClient):
            return [(client, items)]
        groups: dict[int, list[Any]] = {}
        for item in items:
            groups.setdefault(client.map.cell_of(client.scope.wire(item[0])), []).append(item)
        return [(client.clients[i], g) for i, g in groups.items()]

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
        self._write(error_line(obj, rid, exc))

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
        self.buffer.append((rid, obj, Pending(task, is_system_one(obj), 0.0)))
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
        conflicts: set[str] = set()
        for client, part in self._by_cell(batch):
            claims = self._redis("checking ids", client.claim,
                                 scope.wire_items([(rid, obj) for rid, obj, _ in part]), self.queue)
            conflicts.update(scope.caller(w) for w in claims.conflicts)
        todo = []
        for rid, obj, pend in batch:
            state, answer = stored[rid]
            if rid in conflicts:
                self.summary.id_conflict += 1
                self._write(error_line(obj, rid, conflict_error([rid])))
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
        for client, part in self._by_cell(todo):
            messages = pack_messages(scope.wire_items([(rid, obj) for rid, obj, _ in part]), self.queue,
                                     chunk_size=self.chunk_size, expires=deadline_to_expires(self.deadline_s),
                                     tenant=scope.tenant)
            self._redis("queueing", client._push, messages)
        now = self.clock()
        for rid, _, pend in todo:
            pend.submitted_at = now
            self.pending[rid] = pend
        self.summary.submitted += len(todo)
        self.summary.max_in_flight = max(self.summary.max_in_flight, len(self.pending))
        self.bar.set_postfix(in_flight=len(self.pending), refresh=False)

    def _drop(self, ids: list[str]) -> None:
        for client, part in self._by_cell([(rid,) for rid in ids]):
            pipe = client.redis.pipeline(transaction=False)
            for (rid,) in part:
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
                self._write(lost_line(rid, self.pending[rid], model, "result_expired", str(result_expired_error(rid))))
            elif now - self.pending[rid].submitted_at > self.timeout_s:
                self.summary.timeout += 1
                message = f"no result within timeout_s={self.timeout_s:g} s of submission"
                self._write(lost_line(rid, self.pending[rid], model, "timeout", message))
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
        """(messages waiting on the model's backfill queue, live workers of the model), over cells
        summed (a depth -1 when any cell's is unknown)."""
        figures = [self._cell_depth(c) for c in (self.client.clients if isinstance(self.client, CellsClient)
                                                 else [self.client])]
        depth = -1 if any(d < 0 for d, _ in figures) else sum(d for d, _ in figures)
        return depth, sum(live for _, live in figures)

    def _cell_depth(self, client: Client) -> tuple[int, int]:
        """`_queue_depth` of one Redis: one round trip when the queues sit in the result store's Redis;
        on another Redis broker two; on RabbitMQ the depth is not read (-1: only the live workers tell)."""
        broker = client.broker
        pipe = client.redis.pipeline(transaction=False)
        same = broker is client.redis
        if same:
            taking.DEPTH.queue(pipe, *taking.depth_call([self.queue]))
        pipe.zcount(workers_key(client.model), time.time() - 3 * HEARTBEAT_S, "+inf")
        *depths, live = scripts.execute(pipe)
        if not same and hasattr(broker, "llen"):  # another Redis
            depths = [taking.DEPTH(broker, *taking.depth_call([self.queue]))]
        elif not same:
            return -1, int(live)
        return taking.read_depths([self.queue], depths[0])[self.queue][0], int(live)

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

    def run(self, in_path: str | Path, done: set[str]) -> None:
        """Feed every line of IN (ids in `done` are in OUT already: skipped), then wait for the rows
        still in flight."""
        seen: set[str] = set()  # ids met earlier in IN: a later line with one is a duplicate
        with open(in_path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                self.feed(lineno, raw, seen, done)
        self.drain()

    def drain(self) -> None:
        """Queue what is buffered and wait for every row in flight."""
        self.send()
        while self.pending:
            if not self.poll():
                time.sleep(self.poll_s)
