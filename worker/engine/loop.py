"""The batching engine inside a worker process: messages in, stored results and acks out.

One thread owns all state (text-embeddings-inference queue.rs style). Each loop turn:

1. take what arrived (deliveries from the Celery consumer, rendered rows, decoded results);
2. intake: decode each message into requests; one round trip tells which ids already have a result
   (duplicate delivery: skipped) and which are cancelled (their marker, or their bulk job's cancel:
   answered `cancelled`, never rendered or run); answer expired / malformed ones at once, send the
   rest to CPU threads to render (vela2.scoring.pipeline.prepare), ahead of the device;
3. store new results in one pipelined round trip (a bulk job's results counted on its record in the
   same script call, vela2.wire.jobs), then ack every message whose requests all have a stored result
   (never earlier);
4. when the device is free, start the most urgent ready batch (worker.engine.batching: a full bucket, or
   one whose oldest request waited max_wait_ms) with vela2.scoring.pipeline.run_batch on worker.runtime.device's
   runner (a thread, or the device process); while it runs, the next batch goes behind it once it
   is full, and this thread goes on turning (intake, renders, stores). A batch that raises (CUDA
   OOM included) is split in halves and retried; a sequence that fails alone fails only its row
   (model_error). When every sequence of a row is done,
   vela2.scoring.pipeline.finish decodes it on a CPU thread (or in a render process, worker.runtime.cpu_procs).

Rows' windows may land in different batches. Timings per request: queue_ms (message received ->
its first batch starts), render_ms, model_ms (batches that carried it), decode_ms.

Warm stop: intake closes, everything held is finished (buffered rows are flushed without waiting
for company) within the timeout; whatever is left is rejected with requeue, back to its queue.

Poison requests (a request that kills the worker process itself): counted per delivery, run
alone when suspect, dead-lettered past max_attempts; see worker.engine.attempts.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from vela2.api import systemone
from vela2.api.schemas import RowResult, Status, cancelled_result, error_result, expired_result, guess_id_task
from vela2.config import default_precision
from vela2.errors import ModelError, PoisonRequest, StorageError, Vela2Error
from vela2.text.packing import pack
from vela2.wire import keys, messages
from vela2.wire.jobs import ADMIT_ANSWERED, ADMIT_CANCELLED, ADMIT_RUN, CANCELLED_MESSAGE, LINE_SEP
from vela2.wire.messages import request_digest
from vela2.wire.results import ResultStore, chunk_meta, dead_letter_entry, row_meta
from worker.engine.attempts import Attempts, Verdict
from worker.engine.batching import Buckets
from worker.obs.metrics import Metrics
from worker.runtime.device import Ran, ThreadDevice
from worker.settings import EngineSettings
from worker.transport import retry as retry_errors

log = logging.getLogger(__name__)

STATS_LOG_PREFIX = "vela2 engine stats: "  # then one JSON object (EngineStats.to_dict), logged at stop
_IDLE_WAIT_S = 0.5  # longest sleep with nothing waiting (new events wake the loop at once)
_STORE_RETRY_S = 1.0  # pause before retrying a failed result write (Redis away), or acks replicas did not allow
# settings.wait_replicas: how long one WAIT may hold the engine thread (it takes, batches and stores between
# tries: a replica that does not answer costs at most this per _STORE_RETRY_S, not a stalled worker)
WAIT_REPLICAS_TIMEOUT_MS = 200
RECENT_BATCHES = 256  # batches EngineStats.recent keeps
# events one turn takes: a flood of deliveries (2,048 one-row messages at once) is taken over several
# turns, so rendered rows launch a batch between them (on the H200 the first batch waited 0.8 s)
TURN_EVENTS = 512
# requests one turn opens at most: the rest of its deliveries wait for the next turn (a batch may
# launch between). On the H200, 16-row messages flooding in as 512 events a turn (8,192 rows opened
# in one turn, ~0.4 s) held the second batch back while the device idled.
TURN_REQUESTS = 512
INTAKE_SLICE = 256  # requests opened before they are checked for duplicates and sent to render
MAX_IN_FLIGHT = 2  # batches handed to the device at once: the running one and the next
RECENT_FIELDS = ("launched", "device_start", "device_end", "sequences", "tokens", "waiting", "rendering", "held")


@dataclass
class Delivery:
    """One queue message handed to the engine by the consumer (or by a test)."""

    headers: dict[str, Any]
    body: bytes
    ack: Callable[[], None]  # remove the message from the broker (called once, after its results are stored)
    reject: Callable[[bool], None]  # reject(requeue): give it back to its queue (True) or drop it
    content_type: str | None = "application/json"
    received: float = field(default_factory=time.monotonic)
    backfill: bool = False  # from the backfill queue: its batches yield to online ones
    tag: str | None = None  # the broker's delivery tag (its visibility lease is renewed while held)


@dataclass(eq=False)
class _Message:
    delivery: Delivery
    id: str
    chunk: bool
    pending: set[str] = field(default_factory=set)  # ids (and dead-letter tokens) not stored yet
    counts: Counter = field(default_factory=Counter)
    summarized: bool = False  # a chunk's summary is queued (it is stored after all its rows)
    finalized: bool = False
    job: str | None = None  # the bulk job its results are counted on (vela2.wire.jobs)


@dataclass(eq=False)
class _Request:
    rid: str  # the id its result is stored under
    obj: Any
    msg: _Message
    received: float
    expires: datetime | None
    system_one: Any = None  # the parsed SystemOne request, when it is one
    prep: Any = None  # pipeline.Prepared
    outputs: list[Any] = field(default_factory=list)  # per sequence; emptied once decoded
    remaining: int = 0  # sequences without output yet
    model_ms: float = 0.0
    started: float | None = None  # when its first batch started
    verdict: Verdict | None = None  # what the attempt counters said (None: not counted yet in this delivery)
    closed: bool = False  # a result exists (or is being decoded); nothing more to run
    key: int = 0  # its number in this engine (the key of its work in the CPU processes)
    decoding: bool = False  # its outputs went to a CPU process to be decoded
    rendered_digest: str | None = None  # its digest, computed where it was rendered (off this thread)

    @property
    def digest(self) -> str:
        """Its content digest, stored with its answer (an id reused for other content conflicts)."""
        return self.rendered_digest or request_digest(self.obj)


@dataclass(eq=False)
class _Seq:
    req: _Request
    index: int
    seq: Any  # rendering.Sequence

    @property
    def tokens(self) -> int:
        return int(self.seq.num_tokens)


@dataclass
class EngineStats:
    """Counts over an engine's life; `summary()` is the shutdown log line."""

    results: Counter = field(default_factory=Counter)  # by status: ok / error / expired / cancelled
    duplicates: int = 0
    messages_acked: int = 0
    messages_returned: int = 0
    acks_deferred: int = 0  # WAITs that came back short (settings.wait_replicas): the acks waited a retry
    batches: int = 0
    batches_raised: int = 0
    retried_alone: int = 0  # requests run alone because an earlier attempt died with its worker
    dead_lettered: int = 0
    # CPU seconds by stage (each thread's own clock: time.thread_time), and the whole process's
    # since the engine started; the process figure less the stages is the consumer thread (kombu,
    # Celery, triage), the leases and the metrics
    cpu_s: dict[str, float] = field(default_factory=dict)
    process_cpu_s: float = 0.0
    device_s: float = 0.0  # wall seconds the device spent running batches (its busy time)
    # the last batches, oldest first: (launched, device start, device end) on time.monotonic (shared
    # by every process of a host, so a benchmark can place them in its own timeline), sequences,
    # tokens, and at launch the sequences left waiting, the rows in render and the messages held
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))
    _cpu_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def charge(self, stage: str, seconds: float) -> None:
        """Add `seconds` of CPU to `stage` (any thread)."""
        with self._cpu_lock:
            self.cpu_s[stage] = self.cpu_s.get(stage, 0.0) + seconds

    def ran(self, record: list[float | int], start: float, end: float) -> None:
        """(the device runner's thread) the batch of `record` (see `recent`) ran from start to end."""
        with self._cpu_lock:
            self.device_s += end - start
            record[1:3] = [round(start, 4), round(end, 4)]
            self.recent.append(record)

    def to_dict(self) -> dict[str, Any]:
        """The counts as JSON-able data (the `vela2 engine stats` log line that tools read)."""
        return {
            "answered": sum(self.results.values()),
            "results": {k: self.results[k] for k in ("ok", "error", "expired", "cancelled")},
            "duplicates": self.duplicates,
            "messages_acked": self.messages_acked,
            "messages_returned": self.messages_returned,
            "acks_deferred": self.acks_deferred,
            "batches": self.batches,
            "batches_raised": self.batches_raised,
            "retried_alone": self.retried_alone,
            "dead_lettered": self.dead_lettered,
            "cpu_s": {k: round(v, 4) for k, v in sorted(self.cpu_s.items())},
            "process_cpu_s": round(self.process_cpu_s, 4),
            "device_s": round(self.device_s, 4),
            "recent_batches": {"fields": list(RECENT_FIELDS), "rows": [list(r) for r in self.recent]},
        }

    def summary(self) -> str:
        r = self.results
        return (
            f"answered {sum(r.values())} requests (ok {r['ok']}, error {r['error']}, expired "
            f"{r['expired']}, cancelled {r['cancelled']}), skipped {self.duplicates} duplicates; "
            f"acked {self.messages_acked} messages, returned {self.messages_returned} to the queue; "
            f"{self.batches} batches "
            f"({self.batches_raised} raised); {self.retried_alone} retried alone, {self.dead_lettered} dead-lettered"
        )


class Engine:
    """Buffer -> render (CPU threads) -> length buckets -> device batches -> decode -> store -> ack."""

    def __init__(
        self,
        model: Any,
        store: ResultStore,
        settings: EngineSettings | None = None,
        *,
        pipeline: Any = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_stored: Callable[[list[tuple[str, str, dict[str, Any]]]], None] | None = None,
        leases: Any = None,
        release_held: Callable[[list[str]], None] | None = None,
        cpu: Any = None,
        device: Any = None,
        tracing: Any = None,
    ):
        if pipeline is None:
            import vela2.scoring.pipeline as pipeline  # the model stack; tests inject a fake
        self.model = model
        self.store = store
        settings = settings or EngineSettings()
        if settings.precision is None:
            settings = replace(settings, precision=default_precision(getattr(model, "device", "cpu")))
        self.settings = settings
        self.pipeline = pipeline
        self.metrics = metrics or Metrics()
        self.on_stored = on_stored  # called in the engine thread with (id, status, meta) of stored results
        self.tracing = tracing  # worker.obs.tracing.WorkerTracing while OpenTelemetry tracing is on, else None
        self._traces: dict[str, Any] = {}  # id -> RequestTrace of traced requests not stored yet
        self.leases = leases  # worker.runtime.leases.Leases (hold / release per delivery tag), or None
        # removes the broker's held records of many delivery tags in one round trip (worker.transport.redis),
        # so the acks of a turn cost one Redis call, not one each; None: each ack removes its own
        self.release_held = release_held
        self._to_ack: list[Delivery] = []
        self._ack_after = 0.0  # acks wait until then (settings.wait_replicas: the replicas did not have the results)
        self._unreplicated_since: float | None = None  # when WAIT last started coming back short
        self._wait_probe = keys.wait_probe_key(uuid.uuid4().hex)
        # worker.runtime.cpu_procs.CpuProcesses: render and decode in processes (None: in self._pool's threads)
        self.cpu = cpu
        self._in_cpu: dict[int, _Request] = {}  # key -> request with work (or a rendered row) in a process
        self._keys = itertools.count(1)
        if cpu is not None:
            cpu.on_done = self._cpu_done
        self.progress = clock()  # when the loop last turned or ran a batch (leases stop if it stalls)
        self.clock = clock
        self.stats = EngineStats()
        self._buckets: Buckets[_Seq] = Buckets(
            settings.max_batch_tokens, settings.max_wait_ms / 1e3, row_tokens=settings.row_tokens or None
        )
        self._attempts = Attempts(store.redis, max_attempts=settings.max_attempts, ttl_s=settings.attempts_ttl_s)
        self._quarantine: dict[_Request, list[_Seq]] = {}  # suspects waiting to run alone, oldest first
        self._dead_key = keys.dead_letter(getattr(model, "name", None) or "unknown")
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._backlog: deque[Delivery] = deque()  # taken deliveries not opened yet (TURN_REQUESTS)
        self._messages: set[_Message] = set()
        self._to_store: list[tuple[_Message, str, dict[str, Any], str]] = []  # (message, id, meta, status)
        self._to_dead: list[tuple[_Message, str, str]] = []  # (message, pending token, dead-letter entry)
        self._store_after = 0.0
        self._working: dict[str, _Request] = {}  # id -> the request of this engine answering it (until stored)
        self._followers: dict[str, list[_Message]] = {}  # id -> other messages waiting on that answer
        self._pool = ThreadPoolExecutor(max(1, settings.render_threads), thread_name_prefix="vela2-cpu")
        # run_batch runs on worker.runtime.device's runner (a thread here, or a process of its own), so this
        # thread keeps taking, rendering and storing while the device works
        self.device = device or ThreadDevice(pipeline, model, str(settings.precision), settings.row_tokens or None)
        # the batches handed to the device, oldest (running) first: at most MAX_IN_FLIGHT, the next
        # one only when full, so the device starts it the moment the running one ends
        self._in_flight: list[list[_Seq]] = []
        self._retry: list[list[_Seq]] = []  # halves of a batch that raised, run before any new batch
        self._lock = threading.Lock()  # guards _accepting and message finalization
        self._accepting = True
        self._stopping = False
        self._stop_deadline = float("inf")
        self._thread: threading.Thread | None = None
        self._process_cpu0 = time.process_time()

    # --- the outside: consumer thread and lifecycle ---------------------------------------------

    def start(self) -> None:
        """Start the engine thread."""
        self._process_cpu0 = time.process_time()
        self._thread = threading.Thread(target=self._run, name="vela2-engine", daemon=True)
        self._thread.start()

    @property
    def stopping(self) -> bool:
        """A warm shutdown has begun (stop() was called)."""
        return self._stopping

    @property
    def held(self) -> int:
        """Messages the engine holds now (buffered, rendering, running or storing)."""
        return len(self._messages)

    def submit(self, delivery: Delivery) -> None:
        """Hand over one message (thread-safe; never blocks). After stop() it goes back to its queue."""
        with self._lock:
            if self._accepting:
                self._events.put(("delivery", delivery))
                return
        delivery.reject(True)

    def stop(self, timeout_s: float) -> EngineStats:
        """Warm stop: close intake, finish everything held within `timeout_s`, return the rest to
        the queue (reject with requeue), log one summary line."""
        with self._lock:
            self._accepting = False
        self._stop_deadline = self.clock() + max(0.0, timeout_s)
        self._stopping = True
        self._events.put(("wake", None))
        if self._thread is not None:
            self._thread.join(max(0.0, timeout_s) + 5.0)
            if self._thread.is_alive():
                log.error("engine still busy after the shutdown timeout (%.0f s); returning what it holds", timeout_s)
                self._return_all()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.device.close()
        if self.cpu is not None:
            self.cpu.close()
        if self.leases is not None:
            self.leases.stop()
        self.stats.process_cpu_s = time.process_time() - self._process_cpu0
        log.info("vela2 engine stopped: %s", self.stats.summary())
        log.info("%s%s", STATS_LOG_PREFIX, json.dumps(self.stats.to_dict(), separators=(",", ":")))
        return self.stats

    # --- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        ran_batch = False
        while True:
            try:
                self.progress = self.clock()
                self._turn(0.0 if ran_batch else self._wait_s())
                if self._stopping and ((not self._messages and not self._backlog)
                                       or self.clock() >= self._stop_deadline):
                    if self._events.empty():
                        break
                    continue
                ran_batch = self._maybe_run_batch()
            except Exception:  # a bug must not kill the loop silently: log it and keep serving
                log.exception("engine loop error")
                ran_batch = False
                time.sleep(0.1)
        self._send_acks(force=True)
        self._return_all()

    def _wait_s(self) -> float:
        if self._backlog or (self._to_ack and self.clock() >= self._ack_after):
            return 0.0
        if self._to_ack:
            return max(0.0, min(_IDLE_WAIT_S, self._ack_after - self.clock()))
        if self._to_store:
            return max(0.0, min(_IDLE_WAIT_S, self._store_after - self.clock()))
        if self._in_flight:
            return _IDLE_WAIT_S  # its end is an event: it wakes the loop (and a full next batch: its renders)
        if self._retry:
            return 0.0
        if self._quarantine and self._attempts:
            return _IDLE_WAIT_S  # a suspect waits for results in flight: their events wake the loop
        if self._stopping:
            return 0.0 if len(self._buckets) else 0.05
        deadline = self._buckets.next_deadline()
        if deadline is None:
            return _IDLE_WAIT_S
        return max(0.0, min(_IDLE_WAIT_S, deadline - self.clock()))

    def _turn(self, timeout_s: float) -> None:
        """Take the events that arrived, at most TURN_EVENTS (waiting up to timeout_s for the first),
        act, store, ack."""
        events = []
        try:
            events.append(self._events.get(timeout=timeout_s) if timeout_s > 0 else self._events.get_nowait())
        except queue.Empty:
            pass
        while len(events) < TURN_EVENTS:  # the rest wait for the next turn: a batch may launch between
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                break
        c0 = time.thread_time()
        ran: set[_Request] = set()  # requests of batches that came back this turn
        for kind, *payload in events:
            if kind == "delivery":
                self._backlog.append(payload[0])
            elif kind == "prepared":
                self._on_prepared(*payload)
            elif kind == "finished":
                self._on_finished(*payload)
            elif kind == "cpu":
                self._on_cpu(*payload)
            elif kind == "ran":
                ran |= self._on_ran(*payload)
        self.stats.charge("events", time.thread_time() - c0)  # rendered rows, outputs, decoded results
        if ran:
            # The device has room: its next batch goes first, then this batch's rows to decoding
            # (shipping a long row's span logits to a decode process took ~0.1 s while the device
            # idled). Suspects wait for the loop: they run once everything counted is stored; the
            # halves of a batch that raised are counted rows, so they go now all the same.
            if not self._quarantine or self._retry:
                self._maybe_run_batch()
            c0 = time.thread_time()
            self._finish_done(ran)
            self.stats.charge("events", time.thread_time() - c0)
        if self._backlog:
            c0 = time.thread_time()
            self._intake()
            self.stats.charge("intake", time.thread_time() - c0)
        c0 = time.thread_time()
        self._flush_results()
        self._send_acks()
        if self.cpu is not None:
            self.cpu.flush()
        self.stats.charge("store_ack", time.thread_time() - c0)
        self.metrics.buffered.set(len(self._messages))
        self.metrics.waiting.set(len(self._buckets))

    # --- intake -------------------------------------------------------------------------------

    def _intake(self) -> None:
        """Open waiting deliveries, at most TURN_REQUESTS requests a turn (each message whole), and
        start their requests INTAKE_SLICE at a time: a flood (thousands of rows after a pause)
        starts rendering after its first slice, not its last, and a batch launches between turns."""
        fresh: list[_Request] = []
        opened = 0
        while self._backlog and opened < TURN_REQUESTS:
            d = self._backlog.popleft()
            try:
                got = self._open_message(d)
            except Exception:  # a bug must not strand this turn's other deliveries
                log.exception("opening a message failed; it stays unacked and comes back after the visibility timeout")
                got = []
            fresh.extend(got)
            opened += max(1, len(got))
            if len(fresh) >= INTAKE_SLICE:
                self._admit(fresh)
                fresh = []
        if fresh:
            self._admit(fresh)

    def _admit(self, opened: list[_Request]) -> None:
        """Duplicate and cancel check (one round trip), then render each new request (messages
        opened whole). Copies of one id opened together (a producer retry taken in the same turn)
        are checked once: the later ones wait on the first, as a duplicate in flight does."""
        firsts: dict[str, _Request] = {}
        copies: list[_Request] = []
        for r in opened:
            if self._follows(r):
                continue
            if r.rid in firsts:  # two requests counted under one id would make the second a suspect
                copies.append(r)
            else:
                firsts[r.rid] = r
        fresh = list(firsts.values())
        if not fresh:
            return
        try:
            codes = self.store.admission([(r.rid, r.msg.job) for r in fresh])
        except Exception as e:  # Redis away: score anyway, the write-once store keeps the first answer
            log.warning("duplicate and cancel check failed (%s); scoring without it", e)
            codes = [ADMIT_RUN] * len(fresh)
        now_wall = datetime.now(UTC)
        for req, code in zip(fresh, codes, strict=True):
            if code == ADMIT_ANSWERED:
                self._duplicate(req.msg, req.rid)
                req.closed = True
                continue
            self._working[req.rid] = req
            if code == ADMIT_CANCELLED:
                self._cancel(req)
            elif req.expires is not None and now_wall >= req.expires:
                self._expire(req)
            elif self.cpu is not None:
                req.key = next(self._keys)
                self._in_cpu[req.key] = req
                self.cpu.render(req.key, req.obj)
            else:
                fut = self._pool.submit(self._prepare, req)
                fut.add_done_callback(partial(self._post, "prepared", req))
        if self.cpu is not None:
            self.cpu.flush()
        for req in copies:
            req.closed = True
            if not self._follows(req):  # its first was answered already: a duplicate now
                self._duplicate(req.msg, req.rid)
        for msg in {r.msg for r in fresh + copies}:
            self._maybe_finalize(msg)

    def _follows(self, req: _Request) -> bool:
        """A request this engine is already answering under the same id (a duplicate delivery in
        flight) waits for that answer instead of running again."""
        if req.rid not in self._working:
            return False
        self._followers.setdefault(req.rid, []).append(req.msg)  # counted a duplicate once answered
        return True

    def _duplicate(self, msg: _Message, rid: str) -> None:
        """`rid` of `msg` already has a stored answer: nothing to do for it."""
        self.stats.duplicates += 1
        self.metrics.duplicates.inc()
        msg.pending.discard(rid)
        msg.counts["duplicate"] += 1

    def _open_message(self, d: Delivery) -> list[_Request]:
        """Register a delivery; returns its requests still to answer. A message that cannot be run
        is answered here: an error under every id it can be answered under (its own id and the
        ids in its body, never a header's claims), or a copy on the dead-letter list when it has
        no usable id; a request whose id cannot be a key is dead-lettered too."""
        mid = messages.message_id(d.headers)
        msg = _Message(d, mid or "(no id)", chunk=False)
        self._messages.add(msg)
        if self.leases is not None:
            self.leases.hold(d.tag)
        if mid is None or keys.id_problem(mid):
            reason = f"message id {keys.id_problem(mid) or 'is missing'}"
            log.error("queue item dead-lettered: %s", reason)
            self._dead(msg, dead_letter_entry(reason, message_id=None, item=d.body))
            return []
        try:
            got = messages.decode_delivery(
                mid, d.headers, d.body, d.content_type, max_message_bytes=self.settings.max_message_bytes
            )
        except messages.Refused as e:
            self._refuse(msg, messages.refused_ids(d.headers), e, raw=d.body)
            return []
        except Vela2Error as e:
            self._refuse(msg, messages.answerable_ids(mid, d.body), e, raw=d.body)
            return []
        msg.chunk = got.chunk
        msg.job = got.job
        if got.repeated:
            msg.counts["repeated"] += got.repeated  # the same id twice in one chunk: answered once
        for obj, why in got.unusable:
            log.error("request of message %s dead-lettered: %s", mid, why)
            self._dead(msg, dead_letter_entry(why, message_id=mid, request=obj))
        msg.pending.update(rid for rid, _ in got.requests)
        if self.tracing is not None:
            for rid, _ in got.requests:
                trace = self.tracing.request(d.headers, d.received)
                if trace is not None:
                    self._traces[rid] = trace
        return [_Request(rid, obj, msg, d.received, got.expires) for rid, obj in got.requests]

    def _refuse(self, msg: _Message, ids: list[str], e: Vela2Error, raw: bytes) -> None:
        """Answer a message that cannot run: its error under each usable id, else a dead letter. A
        bulk job's chunk refused whole (over max_message_bytes) counts its rows' errors on the job,
        else the job never ends: the job is its header's, checked against the ids its body names."""
        log.warning("message %s refused: %s", msg.id, e)
        rows = [rid for rid in ids if rid != msg.id] or ids  # a chunk's own id is no line of its job
        msg.job = messages.message_job(msg.delivery.headers, rows) if ids else None
        if not ids:
            self._dead(msg, dead_letter_entry(str(e), message_id=msg.id, item=raw))
        for rid in ids:
            msg.pending.add(rid)
            self._answer(msg, rid, error_result(rid, None, e))

    def _dead(self, msg: _Message, entry: str) -> None:
        """Queue a dead-letter entry; the message is acked only once it is pushed."""
        token = f"\x00dead-{len(self._to_dead)}-{id(entry)}"
        msg.pending.add(token)
        self._to_dead.append((msg, token, entry))
        self.stats.dead_lettered += 1

    def _prepare(self, req: _Request) -> tuple[Any, Any, str]:
        """(CPU thread) validate + render one request -> (Prepared, parsed SystemOne or None, its
        content digest: hashing its canonical JSON costs the engine thread nothing here)."""
        c0 = time.thread_time()
        try:
            parsed, obj = None, req.obj
            if systemone.is_system_one(obj):
                parsed = systemone.parse_request(obj)
                systemone.check_model(parsed, self.model.name)
                obj = systemone.to_row(parsed, self.model.calibration)
            return self.pipeline.prepare(self.model, obj), parsed, request_digest(req.obj)
        finally:
            self.stats.charge("render", time.thread_time() - c0)

    def _post(self, kind: str, req: _Request, fut: Future) -> None:
        """(CPU thread) hand a finished step back to the engine thread."""
        self._events.put((kind, req, fut))

    def _cpu_done(self, op: str, key: int, fut: Future, cpu_s: float) -> None:
        """(reader thread of the CPU processes) a render or decode is done."""
        self.stats.charge(f"{'render' if op == 'render' else 'decode'}_in_processes", cpu_s)
        self._events.put(("cpu", op, key, fut))

    def _on_cpu(self, op: str, key: int, fut: Future) -> None:
        req = self._in_cpu.get(key)
        if req is None:
            return
        if op == "render" and not fut.exception() and not req.closed:
            self._on_prepared(req, fut)
            return
        del self._in_cpu[key]
        if op == "render" and req.closed:  # answered while it rendered (expired): its row goes
            self.cpu.drop(key)
        elif op == "render":
            self._on_prepared(req, fut)  # the render failed: answers the error
        elif op == "lost" and req.decoding:
            self._on_finished(req, fut)  # an error result: the row's decode died with its process
        elif op == "lost" and not req.closed:
            self._fail(req, fut.exception() or ModelError("the render process died"))
        elif op == "decode":
            self._on_finished(req, fut)

    def _forget_render(self, req: _Request) -> None:
        """A request answered without its decode: its rendered row in a process goes."""
        if self.cpu is not None and self._in_cpu.pop(req.key, None) is not None:
            self.cpu.drop(req.key)

    def _on_prepared(self, req: _Request, fut: Future) -> None:
        if req.closed:
            return
        try:
            prep, parsed, req.rendered_digest = fut.result()
        except Exception as e:
            if not isinstance(e, Vela2Error):
                log.exception("rendering %s failed", req.rid, extra={"request_id": req.rid})
            self._fail(req, e)
            return
        req.system_one = parsed
        req.prep = prep
        trace = self._traces.get(req.rid)
        if trace is not None:
            trace.rendered, trace.render_ms = self.clock(), prep.render_ms
        n = len(prep.sequences)
        req.outputs = [None] * n
        req.remaining = n
        for i, seq in enumerate(prep.sequences):
            self._buckets.add(_Seq(req, i, seq), seq.num_tokens, req.received, int(req.msg.delivery.backfill))

    # --- batches ------------------------------------------------------------------------------

    def _maybe_run_batch(self) -> bool:
        """Hand the device its next batch when it has room (worker.runtime.device): a half of a batch that
        raised, else the most urgent ready batch. Suspects run alone, synchronously, once no half
        is left and nothing else runs (worker.engine.attempts)."""
        if len(self._in_flight) >= MAX_IN_FLIGHT or (self._in_flight and (self._quarantine or self._retry)):
            return False  # suspects and the halves of a batch that raised wait for a free device
        # The halves go before the suspects: their rows are counted, and a suspect waits until every
        # counted row is stored (`_run_quarantine`), so halves left waiting behind it wedged the worker.
        if self._quarantine and not self._retry:
            return self._run_quarantine()
        c0 = time.thread_time()
        if self._retry:
            live = self._live([it for it in self._retry.pop() if not it.req.closed])
        else:
            # behind a running batch only a full one: a partial one may still gain company meanwhile
            batch = self._buckets.pop_batch(self.clock(), flush=self._stopping, full_only=bool(self._in_flight))
            if batch is None:
                return False
            live = self._count_attempts(self._live(batch))
        if live:
            self._launch(live)
        self.stats.charge("batch", time.thread_time() - c0)
        return True

    def _start(self, items: list[_Seq]) -> float:
        """Mark a batch as started; returns its start time."""
        self.progress = t0 = self.clock()  # each batch is progress: leases keep renewing through long requests
        for it in items:
            if it.req.started is None:
                it.req.started = t0
        return t0

    def _launch(self, items: list[_Seq]) -> None:
        t0 = self._start(items)
        self._in_flight.append(items)
        record = self._record(items)
        fut = self.device.submit([it.seq for it in items])
        fut.add_done_callback(partial(self._post_ran, items, t0, record))

    def _record(self, items: list[_Seq]) -> list[float | int]:
        """A batch's entry of EngineStats.recent as it is handed to the device (RECENT_FIELDS)."""
        return [round(time.monotonic(), 4), 0.0, 0.0, len(items), sum(it.tokens for it in items),
                len(self._buckets), sum(1 for r in self._in_cpu.values() if r.prep is None), len(self._messages)]

    def _post_ran(self, items: list[_Seq], t0: float, record: list[float | int], fut: Future) -> None:
        if fut.cancelled():  # never ran (the engine stopped): its messages go back with the rest
            return
        if fut.exception() is None:
            self._charge_ran(record, fut.result())
        self._events.put(("ran", items, t0, fut))

    def _charge_ran(self, record: list[float | int], ran: Ran) -> None:
        self.stats.charge(self.device.stage, ran.cpu_s)
        self.stats.ran(record, ran.start, ran.end)

    def _on_ran(self, items: list[_Seq], t0: float, fut: Future) -> set[_Request]:
        """A batch is back from the device: its outputs, or (it raised) its halves to run next.
        Returns its requests (the caller sends those whose sequences all ran to decoding)."""
        self._in_flight = [b for b in self._in_flight if b is not items]
        self.progress = self.clock()
        try:
            ran = fut.result()
            outs = _checked(items, ran.outputs)
        except Exception as e:
            self._retry += self._raised(items, e)
            return set()
        self._apply(items, outs, (self.clock() - t0) * 1e3)
        self._trace_batch(items, ran)
        return {it.req for it in items}

    def _trace_batch(self, items: list[_Seq], ran: Ran) -> None:
        """A `vela2.batch` span linked to the traced requests that ran in it (worker.obs.tracing)."""
        if not self._traces:
            return
        traced = [t for t in (self._traces.get(r.rid) for r in {it.req: None for it in items}) if t is not None]
        if traced:
            self.tracing.batch(traced, ran.start, ran.end, len(items), sum(it.tokens for it in items))

    def _raised(self, items: list[_Seq], e: Exception) -> list[list[_Seq]]:
        """A batch raised: a sequence alone fails only its row; a larger batch gives its two halves
        to run next (as a stack: the first half last)."""
        self.stats.batches_raised += 1
        self.metrics.observe_batch([it.tokens for it in items], ok=False)
        live = [it for it in items if not it.req.closed]  # a row failed in an earlier half
        if len(live) == 1:
            req = live[0].req
            log.warning("request %s fails alone: %s: %s", req.rid, type(e).__name__, e, extra={"request_id": req.rid})
            self._fail(req, ModelError(f"the model failed on this request alone: {type(e).__name__}: {_clip(str(e))}"))
            return []
        if not live:
            return []
        log.warning("batch of %d sequences raised %s: %s; splitting", len(live), type(e).__name__, _clip(str(e)))
        mid = len(live) // 2
        return [live[mid:], live[:mid]]

    def _apply(self, items: list[_Seq], outs: list[Any], elapsed_ms: float) -> None:
        """Hand a batch's outputs to their requests."""
        self.stats.batches += 1
        self.metrics.observe_batch([it.tokens for it in items], ok=True)
        for it, out in zip(items, outs, strict=True):
            if it.req.closed:  # failed meanwhile (another of its windows failed alone)
                continue
            it.req.outputs[it.index] = out
            it.req.remaining -= 1
        for req in {it.req for it in items}:
            req.model_ms += elapsed_ms

    def _live(self, items: list[_Seq]) -> list[_Seq]:
        """The items still worth running: not closed; requests past their deadline are answered."""
        now_wall = datetime.now(UTC)
        live = []
        for item in items:
            req = item.req
            if req.closed:
                continue
            if req.expires is not None and now_wall >= req.expires:
                self._expire(req)
                continue
            live.append(item)
        return live

    def _finish_done(self, reqs: set[_Request]) -> None:
        """Send every request whose sequences all ran to a CPU thread (or process) for decoding."""
        for req in reqs:
            if not req.closed and req.remaining == 0:
                req.closed = True
                if self.cpu is not None and req.key in self._in_cpu:
                    self.cpu.decode(req.key, req.outputs, self._timings(req))
                    req.outputs, req.decoding = [], True
                    continue
                fut = self._pool.submit(self._finish, req)
                fut.add_done_callback(partial(self._post, "finished", req))
        if self.cpu is not None:
            self.cpu.flush()

    @staticmethod
    def _timings(req: _Request) -> dict[str, float]:
        return {"queue_ms": ((req.started or req.received) - req.received) * 1e3, "model_ms": req.model_ms}

    # --- attempts, suspects, the dead-letter list (see the module docstring) -------------------

    def _count_attempts(self, items: list[_Seq]) -> list[_Seq]:
        """Count an attempt for every request about to run its first batch in this delivery. A
        suspect goes to quarantine (all its sequences), a poison request to the dead-letter list.
        Returns the items still to run now."""
        fresh = list({it.req: None for it in items if it.req.verdict is None})
        if not fresh:
            return items
        set_aside: set[_Request] = set()
        for req, (verdict, died) in zip(fresh, self._attempts.first([r.rid for r in fresh]), strict=True):
            req.verdict = verdict
            if verdict is Verdict.POISON:
                self._dead_letter(req, died)
            elif verdict is Verdict.SUSPECT:
                self._suspect(req, [it for it in items if it.req is req], died)
            else:
                continue
            set_aside.add(req)
        return [it for it in items if it.req not in set_aside]

    def _suspect(self, req: _Request, items: list[_Seq], died: int) -> None:
        """Quarantine a request whose earlier attempt(s) died with their worker: all its sequences
        wait here and run alone, when nothing else counted is in flight."""
        items = items + self._buckets.remove(lambda s: s.req is not req)
        self._quarantine.setdefault(req, []).extend(items)
        self.stats.retried_alone += 1
        log.warning(
            "request %s: %d earlier attempt(s) died with their worker; it will run alone (attempt %d of %d)",
            req.rid,
            died,
            died + 1,
            self.settings.max_attempts,
        )

    def _run_quarantine(self) -> bool:
        """Run the next quarantined request alone once nothing else counted is in flight (so that
        if it kills the process, no innocent request is counted against or lost with it)."""
        counted = self._buckets.remove(lambda s: s.req.verdict is None)  # rows already running: finish
        if counted:
            lengths = [it.tokens for it in counted]
            for idx in pack(lengths, self.settings.max_batch_tokens, self.settings.row_tokens or None):
                live = self._live([counted[i] for i in idx])
                self._run_split(live)
                self._finish_done({it.req for it in live})
            return True
        if self._attempts:
            return False  # wait until those are decoded and stored
        req, items = next(iter(self._quarantine.items()))
        del self._quarantine[req]
        items = self._live(items)
        if not items:
            return True
        try:
            if self.store.existing([req.rid]):  # answered meanwhile (another delivery of it)
                req.closed = True
                self._working.pop(req.rid, None)
                self._duplicate(req.msg, req.rid)
                for other in self._followers.pop(req.rid, []):
                    self._duplicate(other, req.rid)
                    self._maybe_finalize(other)
                self._maybe_finalize(req.msg)
                return True
        except Exception as e:
            log.warning("duplicate check of %s failed (%s); running it", req.rid, e, extra={"request_id": req.rid})
        req.verdict, died = self._attempts.again(req.rid)
        if req.verdict is Verdict.POISON:
            self._dead_letter(req, died)
            return True
        for it in items:
            self._run_split([it])
        self._finish_done({req})
        return True

    def _dead_letter(self, req: _Request, died: int) -> None:
        """Move a poison request to the dead-letter list and answer it with a "poison" error."""
        reason = f"request crashed the worker {died} times; moved to {self._dead_key}"
        log.error("request %s is poison: %s", req.rid, reason, extra={"request_id": req.rid})
        self._dead(req.msg, dead_letter_entry(reason, message_id=req.msg.id, request_id=req.rid, request=req.obj,
                                              attempts=died))
        self._attempts.poisoned(req.rid)  # its counter goes once the error answer is stored, never earlier
        self._fail(req, PoisonRequest(reason))

    def _run_split(self, items: list[_Seq]) -> None:
        """Run one batch here, synchronously (suspects, alone); on an exception split it in halves and
        retry, down to single sequences."""
        todo = [items]
        while todo:
            items = [it for it in todo.pop() if not it.req.closed]  # a row failed in an earlier half
            if not items:
                continue
            t0 = self._start(items)
            record = self._record(items)
            try:
                ran = self.device.submit([it.seq for it in items]).result()
                self._charge_ran(record, ran)
                outs = _checked(items, ran.outputs)
            except Exception as e:
                todo += self._raised(items, e)
                continue
            self._apply(items, outs, (self.clock() - t0) * 1e3)
            self._trace_batch(items, ran)

    def _finish(self, req: _Request) -> tuple[RowResult, dict[str, Any] | None]:
        """(CPU thread) decode a row whose sequences all ran."""
        c0 = time.thread_time()
        res = self.pipeline.finish(self.model, req.prep, req.outputs, self._timings(req), str(self.settings.precision))
        answer = systemone.to_answer(req.system_one, res) if req.system_one is not None else None
        self.stats.charge("decode", time.thread_time() - c0)
        return res, answer

    def _on_finished(self, req: _Request, fut: Future) -> None:
        try:
            res, answer = fut.result()
        except Exception as e:
            log.exception("decoding %s failed", req.rid, extra={"request_id": req.rid})
            res, answer = error_result(req.rid, _task_of(req), e), None
        req.prep, req.outputs = None, []  # free the rendered row and its outputs now
        self._answer(req.msg, req.rid, res, answer, req.digest)

    # --- answers, storing, acks ---------------------------------------------------------------

    def _fail(self, req: _Request, exc: BaseException) -> None:
        req.closed = True
        self._forget_render(req)
        answer = systemone.error_answer(req.obj, exc) if systemone.is_system_one(req.obj) else None
        self._answer(req.msg, req.rid, error_result(req.rid, _task_of(req), exc), answer, req.digest)
        if req.remaining:
            self._buckets.remove(lambda s: s.req is not req)

    def _expire(self, req: _Request) -> None:
        req.closed = True
        if req.prep is not None:  # rendered already (else the render's reply drops it)
            self._forget_render(req)
        when = req.expires.isoformat() if req.expires else "?"
        res = expired_result(req.rid, _task_of(req), f"deadline {when} passed before the request was scored")
        answer = _system_one_answer(req, res) if systemone.is_system_one(req.obj) else None
        self._answer(req.msg, req.rid, res, answer, req.digest)
        if req.remaining:
            self._buckets.remove(lambda s: s.req is not req)

    def _cancel(self, req: _Request) -> None:
        """Answer a request cancelled before it started (never rendered, never on the device)."""
        req.closed = True
        res = cancelled_result(req.rid, _task_of(req), CANCELLED_MESSAGE)
        answer = _system_one_answer(req, res) if systemone.is_system_one(req.obj) else None
        self._answer(req.msg, req.rid, res, answer, req.digest)

    def _answer(self, msg: _Message, rid: str, res: RowResult | dict[str, Any],
                answer: dict[str, Any] | None = None, digest: str | None = None) -> None:
        """Queue one result for storing: a RowResult, or the JSON form a decode process sends, with
        the request's content digest (None for a queue item too broken to have one)."""
        meta = row_meta(rid, res, answer, digest)
        row = meta["vela2"]
        status = row["status"]
        self._to_store.append((msg, rid, meta, status))
        trace = self._traces.get(rid)
        if trace is not None and trace.answered is None:
            trace.answered = self.clock()
        reason = row["error"]["type"] if status == Status.error.value and row.get("error") else None
        self.metrics.observe_result(status, reason, row.get("timings"))

    def _flush_results(self) -> None:
        """Store pending results and dead letters (one round trip), then ack every message whose
        ids are all stored. Redis refusing writes (full, away) leaves them queued for a retry; a
        result that cannot be stored as it is becomes a storage_error result, else a dead letter."""
        if not (self._to_store or self._to_dead) or self.clock() < self._store_after:
            return
        items, self._to_store = self._to_store, []
        dead, self._to_dead = self._to_dead, []
        try:
            outcomes = (self.store.store([(rid, meta) for _, rid, meta, _ in items],
                                         jobs=[_job_of(msg, rid) for msg, rid, _, _ in items]) if items else [])
            if dead:
                self.store.redis.lpush(self._dead_key, *[entry for _, _, entry in dead])
        except Exception as e:
            self._retry_later(items, dead, e)
            return
        stored, retry, refusal = [], [], None
        for item, outcome in zip(items, outcomes, strict=True):
            if not isinstance(outcome, Exception):
                stored.append(item)
            elif isinstance(outcome, retry_errors.REFUSED_ERRORS):
                retry.append(item)
                refusal = outcome
            else:
                self._unstorable(item, outcome)
        if refusal is not None:
            self._retry_later(retry, [], refusal)
        elif retry_errors.BLOCKED.since is not None:
            retry_errors.BLOCKED.accepted()
        touched = [msg for msg, _, _ in dead]
        for msg, token, _ in dead:
            msg.pending.discard(token)
        self._attempts.forget([rid for _, rid, _, _ in stored])
        if self.on_stored is not None and stored:
            try:
                self.on_stored([(rid, status, meta) for _, rid, meta, status in stored])
            except Exception as e:  # monitoring must never hold up acks
                log.warning("on_stored hook failed: %s", e)
        if self._traces:
            now = self.clock()
            for _, rid, _, status in stored:
                trace = self._traces.pop(rid, None)
                if trace is not None:
                    self.tracing.stored(trace, rid, status, now)
        for msg, rid, _, status in stored:
            msg.pending.discard(rid)
            if status != "summary":
                msg.counts[status] += 1
                self.stats.results[status] += 1
            touched.append(msg)
            touched.extend(self._settled(rid, msg))
        for msg in dict.fromkeys(touched):
            self._maybe_finalize(msg)

    def _settled(self, rid: str, msg: _Message) -> list[_Message]:
        """`rid` of `msg` is stored (or dead-lettered): the messages that waited on it are done with it."""
        req = self._working.get(rid)
        if req is None or req.msg is not msg:
            return []
        del self._working[rid]
        followers = self._followers.pop(rid, [])
        for other in followers:
            self._duplicate(other, rid)
        return followers

    def _retry_later(self, items: list[Any], dead: list[Any], e: BaseException) -> None:
        """Keep what Redis did not take for the next try, in a second (Redis full or away)."""
        retry_errors.BLOCKED.refused(f"storing {len(items)} results and {len(dead)} dead letters", e)
        self._to_store = items + self._to_store
        self._to_dead = dead + self._to_dead
        self._store_after = self.clock() + _STORE_RETRY_S

    def _unstorable(self, item: tuple[_Message, str, dict[str, Any], str], e: Exception) -> None:
        """A result Redis will not take as it is: store a short storage_error result instead, or
        (that failing too, or an id that cannot be a key) dead-letter it."""
        msg, rid, meta, status = item
        log.error("the result of %s cannot be stored: %s: %s", rid, type(e).__name__, _clip(str(e)))
        if isinstance(e, UnicodeError) or meta.get("vela2_storage_error"):
            msg.pending.discard(rid)
            self._dead(msg, dead_letter_entry(f"result could not be stored: {type(e).__name__}: {_clip(str(e))}",
                                              message_id=msg.id, request_id=rid))
            for other in self._settled(rid, msg):
                self._maybe_finalize(other)
            return
        err = StorageError(f"the result could not be stored: {type(e).__name__}: {_clip(str(e))}")
        fallback = row_meta(rid, error_result(rid, None, err))
        fallback["vela2_storage_error"] = True
        self._to_store.append((msg, rid, fallback, "error" if status != "summary" else status))

    def _maybe_finalize(self, msg: _Message) -> None:
        """Ack a message once everything of it is stored (a chunk: its summary too, stored last)."""
        if msg.pending or msg.finalized:
            return
        if msg.chunk and not msg.summarized:
            msg.summarized = True
            msg.pending.add(msg.id)
            self._to_store.append((msg, msg.id, chunk_meta(msg.id, dict(msg.counts)), "summary"))
            return
        with self._lock:
            if msg.finalized:
                return
            msg.finalized = True
        self._messages.discard(msg)
        self.stats.messages_acked += 1
        if self.leases is not None:
            self.leases.release(msg.delivery.tag)
        self._to_ack.append(msg.delivery)

    def _send_acks(self, force: bool = False) -> None:
        """Ack every message finalized this turn: their held records go in one round trip, then
        each ack settles the consumer's bookkeeping (should that round trip fail, each ack removes
        its own record, as without release_held). With settings.wait_replicas, only once that many
        replicas hold what was stored (`_replicated`); else they wait (unacked) and try again in
        _STORE_RETRY_S (`force`: try now, at stop)."""
        if not self._to_ack or (not force and self.clock() < self._ack_after):
            return
        if self.settings.wait_replicas and not self._replicated():
            self._ack_after = self.clock() + _STORE_RETRY_S
            return
        acks, self._to_ack = self._to_ack, []
        if self.release_held is not None:
            try:
                self.release_held([d.tag for d in acks if d.tag])
            except Exception as e:
                log.warning("releasing %d acked messages in one call failed (%s); acking one by one", len(acks), e)
        for d in acks:
            d.ack()

    def _replicated(self) -> bool:
        """Whether settings.wait_replicas replicas of the result store hold every write so far: one round
        trip of a write of our own (WAIT waits for its connection's last write, and a replica that has a
        write has every earlier one) and WAIT, up to WAIT_REPLICAS_TIMEOUT_MS."""
        want = self.settings.wait_replicas
        pipe = self.store.redis.pipeline(transaction=False)
        pipe.set(self._wait_probe, 1, ex=60)
        pipe.execute_command("WAIT", want, WAIT_REPLICAS_TIMEOUT_MS)
        try:
            got = int(pipe.execute()[-1])
        except Exception as e:  # Redis away: the results' own retry says so; the acks wait
            got, why = 0, f"{type(e).__name__}: {e}"
        else:
            why = f"{got} of {want} replicas within {WAIT_REPLICAS_TIMEOUT_MS} ms"
        if got >= want:
            if self._unreplicated_since is not None:
                log.info("replicas hold the stored results again after %.1f s: acking",
                         self.clock() - self._unreplicated_since)
                self._unreplicated_since = None
            return True
        if self._unreplicated_since is None:
            self._unreplicated_since = self.clock()
            log.warning("stored results not yet on the replicas (%s, wait_replicas %d): %d messages stay unacked "
                        "and are acked once they are", why, want, len(self._to_ack))
        self.stats.acks_deferred += 1
        return False

    def _return_all(self) -> None:
        """Give every message not yet acked back to its queue (warm stop ran out of time), the
        deliveries never opened too. Their attempts are uncounted: a request handed back alive is
        no suspect."""
        while self._backlog:
            d = self._backlog.popleft()
            self.stats.messages_returned += 1
            try:
                d.reject(True)
            except Exception as e:
                log.error("returning a message failed: %s", e)
        returned = [rid for msg in self._messages if not msg.finalized for rid in msg.pending]
        self._attempts.give_back(returned)
        for msg in list(self._messages):
            with self._lock:
                if msg.finalized:
                    continue
                msg.finalized = True
            self._messages.discard(msg)
            self.stats.messages_returned += 1
            if self.leases is not None:
                self.leases.release(msg.delivery.tag)
            try:
                msg.delivery.reject(True)
            except Exception as e:
                log.error("returning message %s failed: %s", msg.id, e)


def _checked(items: list[_Seq], outs: list[Any]) -> list[Any]:
    """run_batch's outputs, one per sequence (else RuntimeError)."""
    if len(outs) != len(items):
        raise RuntimeError(f"run_batch returned {len(outs)} outputs for {len(items)} sequences")
    return outs


def _job_of(msg: _Message, rid: str) -> str | None:
    """The job the result `rid` of `msg` is counted on: the message's, for that job's lines only (a
    chunk refused whole is answered under its own id too, and that error is no line of the job)."""
    job = msg.job
    return job if job is not None and rid.startswith(job + LINE_SEP) else None


def _task_of(req: _Request) -> str | None:
    if req.prep is not None:
        return req.prep.task
    return guess_id_task(req.obj)[1]


def _system_one_answer(req: _Request, res: RowResult) -> dict[str, Any]:
    """The SystemOne answer carrying a non-ok RowResult (the request parsed or not)."""
    try:
        parsed = req.system_one or systemone.parse_request(req.obj)
        return systemone.to_answer(parsed, res)
    except Vela2Error as e:
        return systemone.error_answer(req.obj, e)


def _clip(text: str, n: int = 300) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


