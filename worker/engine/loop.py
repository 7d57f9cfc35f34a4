"""The batching engine inside a worker process: messages in, stored results and acks out.

One thread owns all state (text-embeddings-inference queue.rs style); three parts hold it:
intake (worker.engine.intake), the scheduler (worker.engine.scheduler) and the outbox
(worker.engine.outbox); rendering and decoding run off this thread (worker.engine.cpu_work). Each
loop turn:

1. take what arrived (deliveries from the Celery consumer, rendered rows, batches back from the
   device, decoded results), at most TURN_EVENTS;
2. a batch back from the device: the next batch goes to the device first, then its rows whose
   sequences all ran go to decoding;
3. intake opens waiting deliveries and sends their requests to render, ahead of the device;
4. the outbox stores new results in one pipelined round trip, then acks every message whose
   requests all have a stored result (never earlier);
5. when the device is free, the scheduler starts the most urgent ready batch (online work at once
   unless more is on its way; see worker.engine.scheduler); while it runs, the next batch goes
   behind it just before it ends (or at once when full), and this thread goes on turning (intake,
   renders, stores).

Rows' windows may land in different batches. Timings per request: queue_ms (message received ->
its first batch starts), render_ms, model_ms (batches that carried it), decode_ms.

Warm stop: intake closes, everything held is finished (buffered rows are flushed without waiting
for company) within the timeout; whatever is left is rejected with requeue, back to its queue.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from vela2.config import default_precision
from vela2.wire import keys
from vela2.wire.results import ResultStore
from worker.engine.attempts import Attempts
from worker.engine.cost import BatchCost
from worker.engine.cpu_work import CpuWork, lost_error
from worker.engine.intake import Intake
from worker.engine.outbox import Outbox
from worker.engine.scheduler import Scheduler
from worker.engine.stats import STATS_LOG_PREFIX, EngineStats
from worker.engine.work import Delivery, Request
from worker.obs.metrics import Metrics
from worker.runtime.device import ThreadDevice
from worker.settings import EngineSettings

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.5  # longest sleep with nothing waiting (new events wake the loop at once)
FAIR_HELD_BATCHES = 4  # take_room: batches' worth of messages held while the fair share is contended
# events one turn takes: a flood of deliveries (2,048 one-row messages at once) is taken over several
# turns, so rendered rows launch a batch between them (on the H200 the first batch waited 0.8 s)
TURN_EVENTS = 512


class Engine:
    """Buffer -> render (CPU threads) -> length buckets -> device batches -> decode -> store -> ack.

    `cost_seed`: (padded tokens, device seconds) of batches measured before serving (the warm-up's
    worst batch), where the scheduler's cost model starts (worker.engine.cost)."""

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
        cost_seed: list[tuple[int, float]] | None = None,
    ):
        if pipeline is None:
            import vela2.scoring.pipeline as pipeline  # the model stack; tests inject a fake
        settings = settings or EngineSettings()
        if settings.precision is None:
            settings = replace(settings, precision=default_precision(getattr(model, "device", "cpu")))
        self.model, self.store, self.settings, self.clock = model, store, settings, clock
        self.metrics = metrics or Metrics()
        self.leases = leases  # worker.runtime.leases.Leases, stopped with the engine
        self.stats = EngineStats()
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _accepting and message finalization
        self._accepting = True
        self._stopping = False
        self._stop_deadline = float("inf")
        self._thread: threading.Thread | None = None
        self._process_cpu0 = time.process_time()
        self._turned = clock()  # when the loop last turned
        attempts = Attempts(store.redis, max_attempts=settings.max_attempts, ttl_s=settings.attempts_ttl_s)
        # run_batch runs on worker.runtime.device's runner (a thread here, or a process of its own), so
        # this thread keeps taking, rendering and storing while the device works
        self.device = device or ThreadDevice(pipeline, model, str(settings.precision), settings.row_tokens or None)
        self.cpu_work = CpuWork(model, pipeline, str(settings.precision), settings.render_threads, self.stats,
                                self._events.put, cpu)
        self.outbox = Outbox(store, settings, self.stats, self.metrics, attempts, clock, self._lock,
                             dead_key=keys.dead_letter(getattr(model, "name", None) or "unknown"), leases=leases,
                             release_held=release_held, on_stored=on_stored, tracing=tracing)
        self.scheduler = Scheduler(settings, store, attempts, self.device, self.outbox, self.cpu_work, self.stats,
                                   self.metrics, clock, self._events.put, tracing, self._company_coming,
                                   BatchCost(cost_seed or ()))
        self.intake = Intake(settings, store, self.outbox, self.scheduler, self.cpu_work, clock, tracing)

    def _company_coming(self) -> bool:
        """Requests on their way to the buckets: taken and not opened yet, or in render."""
        return bool(self.intake.backlog) or self.cpu_work.in_render > 0

    # --- the outside: consumer thread and lifecycle ---------------------------------------------

    def start(self) -> None:
        """Start the engine thread."""
        self._process_cpu0 = time.process_time()
        self._thread = threading.Thread(target=self._run, name="vela2-engine", daemon=True)
        self._thread.start()

    @property
    def progress(self) -> float:
        """When the loop last turned or a batch started or came back (leases stop if it stalls)."""
        return max(self._turned, self.scheduler.progress)

    @property
    def stopping(self) -> bool:
        """A warm shutdown has begun (stop() was called)."""
        return self._stopping

    @property
    def held(self) -> int:
        """Messages the engine holds now (buffered, rendering, running or storing)."""
        return len(self.outbox.messages)

    def take_room(self) -> int | None:
        """(any thread) How many more messages the consumer should take now: None (as many as its
        credit) unless one tenant's backlog shares the device with other tenants' requests; then
        what FAIR_HELD_BATCHES batches hold, less what is held, so that the backlog waits in the
        broker, where other tenants' messages are taken ahead of it."""
        if not self.scheduler.contended:
            return None
        return FAIR_HELD_BATCHES * max(1, self.scheduler.last_batch) - self.held - self._events.qsize()

    def submit(self, delivery: Delivery) -> None:
        """Hand over one message (thread-safe; never blocks). After stop() it goes back to its queue."""
        with self._lock:
            if self._accepting:
                self._events.put(("delivery", delivery))
                return
        delivery.reject(True)

    def close_intake(self) -> None:
        """Take no more messages (each offered from now on goes back to its queue); what the engine
        holds is still finished. stop() ends it."""
        with self._lock:
            self._accepting = False

    def stop(self, timeout_s: float) -> EngineStats:
        """Warm stop: close intake, finish everything held within `timeout_s`, return the rest to
        the queue (reject with requeue), log one summary line."""
        self.close_intake()
        self._stop_deadline = self.clock() + max(0.0, timeout_s)
        self._stopping = True
        self._events.put(("wake", None))
        if self._thread is not None:
            self._thread.join(max(0.0, timeout_s) + 5.0)
            if self._thread.is_alive():
                log.error("engine still busy after the shutdown timeout (%.0f s); returning what it holds", timeout_s)
                self._return_all()
        self.cpu_work.close()
        self.device.close()
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
                self._turned = self.clock()
                self._turn(0.0 if ran_batch else self._wait_s())
                if self._stopping and ((not self.outbox.messages and not self.intake.backlog)
                                       or self.clock() >= self._stop_deadline):
                    if self._events.empty():
                        break
                    continue
                ran_batch = self.scheduler.maybe_run_batch(self._stopping)
            except Exception:  # a bug must not kill the loop silently: log it and keep serving
                log.exception("engine loop error")
                ran_batch = False
                time.sleep(0.1)
        self.outbox.send_acks(force=True)
        self._return_all()

    def _wait_s(self) -> float:
        if self.intake.backlog or self.outbox.acks_due:
            return 0.0
        outbox = self.outbox.wait_s(self.clock(), _IDLE_WAIT_S)
        if outbox is not None:
            return outbox
        return self.scheduler.wait_s(self.clock(), _IDLE_WAIT_S, self._stopping)

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
        ran = self._dispatch(events)  # rendered rows, outputs, decoded results
        self.stats.charge("events", time.thread_time() - c0)
        if ran:
            # The device has room: its next batch goes first, then this batch's rows to decoding
            # (shipping a long row's span logits to a decode process took ~0.1 s while the device
            # idled). Suspects wait for the loop: they run once everything counted is stored; the
            # halves of a batch that raised are counted rows, so they go now all the same.
            if self.scheduler.device_free_for_suspects:
                self.scheduler.maybe_run_batch(self._stopping)
            c0 = time.thread_time()
            self.scheduler.decode_done(ran)
            self.stats.charge("events", time.thread_time() - c0)
        if self.intake.backlog:
            c0 = time.thread_time()
            self.intake.run()
            self.stats.charge("intake", time.thread_time() - c0)
        c0 = time.thread_time()
        self.outbox.flush()
        self.outbox.send_acks()
        self.outbox.report_tokens()
        self.cpu_work.flush()
        self.stats.charge("store_ack", time.thread_time() - c0)
        self.metrics.buffered.set(len(self.outbox.messages))
        self.metrics.waiting.set(len(self.scheduler.buckets))

    def _dispatch(self, events: list[tuple[Any, ...]]) -> set[Request]:
        """Act on a turn's events; returns the requests of batches that came back."""
        ran: set[Request] = set()
        for kind, *payload in events:
            if kind == "delivery":
                self.intake.backlog.append(payload[0])
            elif kind == "prepared":
                self.cpu_work.rendered()
                self.intake.rendered(*payload)
            elif kind == "finished":
                self._finished(*payload)
            elif kind == "cpu":
                self._from_process(*payload)
            elif kind == "ran":
                ran |= self.scheduler.on_ran(*payload)
        return ran

    def _from_process(self, op: str, key: int, fut: Future) -> None:
        """A reply of the CPU processes (worker.engine.cpu_work.CpuWork.on_cpu says what it means)."""
        got = self.cpu_work.on_cpu(op, key, fut)
        if got is None:
            return
        what, req, fut = got
        if what == "prepared":
            self.intake.rendered(req, fut)
        elif what == "finished":
            self._finished(req, fut)
        else:
            self.scheduler.fail(req, lost_error(fut))

    def _finished(self, req: Request, fut: Future) -> None:
        try:
            got: Any = fut.result()
        except Exception as e:
            got = e
        self.outbox.finished(req, got)

    def _return_all(self) -> None:
        backlog = list(self.intake.backlog)
        self.intake.backlog.clear()
        self.outbox.return_all(backlog)
