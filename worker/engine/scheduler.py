"""The engine's scheduler: rendered sequences wait in length buckets (worker.engine.batching) and go
to the device (worker.runtime.device: a thread, or the device process) in batches, at most
MAX_IN_FLIGHT at once: the running one and the next, staged behind it.

When a batch goes (latency first, throughput when there is work for it):
- the device is free: online work goes at once, unless requests are on their way to it (in render,
  or taken and not yet opened): those are waited for, at most max_wait_ms from the oldest arrival;
  backfill alone waits for a full batch or max_wait_ms, so bulk work still fills big batches;
- a batch is running: a full batch goes behind it at once; online work otherwise goes behind it
  just before it ends (`_stage_at`: its predicted end less the runner's launch time and the cost
  model's recent error, from worker.engine.cost), so the next batch is collated and launched while
  the device works, takes every request that arrived meanwhile, and starts the moment the device
  frees;
- settings.target_p99_ms caps every batch at the tokens the device runs in a third of it;
- fair share (worker.engine.batching): while one tenant's backlog shares the device with other
  tenants' requests (`Buckets.contended`), every batch is capped at settings.fair_batch_ms of
  device time (auto: FAIR_AUTO x a lone short batch, from the cost model) and goes behind the
  running one only just before it ends, so another tenant's request waits at most the rest of a
  short batch, then rides the next: its latency stays near what it is on an idle worker. The
  engine then takes few messages ahead (Engine.take_room), so the backlog waits in Redis, where
  the take serves the tenants in turn, rather than in this worker's buffer.

A batch that raises (CUDA OOM included) is split in halves and retried; a sequence that fails alone
fails only its row (model_error). When every sequence of a row has run, the row goes to decoding
(worker.engine.cpu_work).

Poison requests (a request that kills the worker process itself): before its first batch in a
delivery a request's attempt is counted (worker.engine.attempts); a suspect runs alone once nothing
counted is in flight, a poison one is dead-lettered, never run.

A request is closed here too when it can no longer run: failed, expired or cancelled."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import UTC, datetime
from functools import partial
from typing import Any

from vela2.api import systemone
from vela2.api.schemas import cancelled_result, error_result, expired_result
from vela2.errors import ModelError, PoisonRequest
from vela2.text.packing import pack
from vela2.wire.jobs import CANCELLED_MESSAGE
from vela2.wire.results import ResultStore, dead_letter_entry
from worker.engine.attempts import Attempts, Verdict
from worker.engine.batching import Buckets
from worker.engine.cost import BatchCost
from worker.engine.cpu_work import CpuWork
from worker.engine.outbox import Outbox
from worker.engine.stats import EngineStats
from worker.engine.work import Request, Seq, clip
from worker.obs.metrics import Metrics
from worker.runtime.device import Ran
from worker.settings import EngineSettings

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 2  # batches handed to the device at once: the running one and the next
# the next batch goes behind the running one this long before the runner must have it (the engine
# loop's own turn, a pipe's trip: what the launch time measured by the cost model does not hold)
STAGE_MARGIN_S = 0.003
P99_BATCHES = 3  # target_p99_ms: a request waits for at most a running batch, then rides one: a third each
FAIR_AUTO = 2.0  # fair_batch_ms auto: this many times the device seconds of a lone short batch
FAIR_SHORT_TOKENS = 64  # ... of this many tokens


class Scheduler:
    """Waiting sequences, the batches on the device, the halves of batches that raised, suspects."""

    def __init__(self, settings: EngineSettings, store: ResultStore, attempts: Attempts, device: Any,
                 outbox: Outbox, cpu_work: CpuWork, stats: EngineStats, metrics: Metrics,
                 clock: Callable[[], float], post: Callable[[tuple[Any, ...]], None], tracing: Any = None,
                 company: Callable[[], bool] = lambda: False, cost: BatchCost | None = None):
        self.settings, self.store, self.attempts, self.device = settings, store, attempts, device
        self.outbox, self.cpu_work, self.stats, self.metrics = outbox, cpu_work, stats, metrics
        self.clock, self._post, self.tracing = clock, post, tracing
        self.company = company  # whether requests are on their way to the buckets (in render, not yet opened)
        self.cost = cost or BatchCost()
        self.buckets: Buckets[Seq] = Buckets(
            settings.max_batch_tokens, settings.max_wait_ms / 1e3, row_tokens=settings.row_tokens or None
        )
        # the batches handed to the device, oldest (running) first: at most MAX_IN_FLIGHT, the next
        # staged behind the running one, so the device starts it the moment the running one ends
        self.in_flight: list[list[Seq]] = []
        self.ends: list[float] = []  # each in-flight batch's predicted end on the device (clock seconds)
        self.retry: list[list[Seq]] = []  # halves of a batch that raised, run before any new batch
        self.quarantine: dict[Request, list[Seq]] = {}  # suspects waiting to run alone, oldest first
        self.progress = clock()  # when a batch last started or came back
        self.contended = False  # one tenant's backlog shares the device with others' requests (fair share)
        self.last_batch = 0  # sequences in the batch launched last

    def add(self, req: Request) -> None:
        """A request is rendered: its sequences wait for a batch."""
        n = len(req.prep.sequences)
        req.outputs = [None] * n
        req.remaining = n
        for i, seq in enumerate(req.prep.sequences):
            self.buckets.add(Seq(req, i, seq), seq.num_tokens, req.received, int(req.msg.delivery.backfill),
                             req.msg.tenant or "")

    def wait_s(self, now: float, idle_s: float, stopping: bool) -> float:
        """How long the loop may wait before a batch could be due."""
        if len(self.in_flight) == 1 and self.buckets.online and not (self.quarantine or self.retry):
            return max(0.0, min(idle_s, self._stage_at() - now))  # online work goes behind it then
        if self.in_flight:
            return idle_s  # its end is an event: it wakes the loop (and a full next batch: its renders)
        if self.retry:
            return 0.0
        if self.quarantine and self.attempts:
            return idle_s  # a suspect waits for results in flight: their events wake the loop
        if stopping:
            return 0.0 if len(self.buckets) else 0.05
        deadline = self.buckets.next_deadline()
        if deadline is None:
            return idle_s
        return max(0.0, min(idle_s, deadline - now))

    @property
    def device_free_for_suspects(self) -> bool:
        """Whether a batch that came back may hand the device its next at once (suspects wait for the
        loop: they run once everything counted is stored; halves of a batch that raised go now)."""
        return not self.quarantine or bool(self.retry)

    # --- batches --------------------------------------------------------------------------------

    def maybe_run_batch(self, stopping: bool) -> bool:
        """Hand the device its next batch when it has room: a half of a batch that raised, else the
        most urgent ready batch. Suspects run alone, synchronously, once no half is left and nothing
        else runs. `stopping`: every waiting sequence counts as old (warm stop)."""
        if len(self.in_flight) >= MAX_IN_FLIGHT or (self.in_flight and (self.quarantine or self.retry)):
            return False  # suspects and the halves of a batch that raised wait for a free device
        # The halves go before the suspects: their rows are counted, and a suspect waits until every
        # counted row is stored (`_run_quarantine`), so halves left waiting behind it wedged the worker.
        if self.quarantine and not self.retry:
            return self._run_quarantine()
        c0 = time.thread_time()
        if self.retry:
            live = self._live([it for it in self.retry.pop() if not it.req.closed])
        else:
            batch = self._next_batch(stopping)
            if batch is None:
                return False
            live = self._count_attempts(self._live(batch))
        if live:
            self._launch(live)
        self.stats.charge("batch", time.thread_time() - c0)
        return True

    def _next_batch(self, stopping: bool) -> list[Seq] | None:
        """The batch that goes now, if one does (the rules of the module docstring)."""
        now = self.clock()
        contended = self.contended = self.settings.fair_batch_ms != 0 and self.buckets.contended(now)
        budget = self._budget(contended)
        if not self.in_flight:  # a free device: online work at once, unless company is on its way
            return self.buckets.pop_batch(now, flush=stopping, online_now=stopping or not self.company(),
                                          budget=budget)
        due = now >= self._stage_at()
        if contended and not due:
            return None  # the next batch is chosen as late as it can be: other tenants' arrivals ride it
        # behind a running batch: a full one now; online work once the running one is about to end
        return self.buckets.pop_batch(now, full_only=True, online_now=due, budget=budget)

    def _stage_at(self) -> float:
        """When the next batch must go to the runner to start the moment the running one ends."""
        if not self.ends:
            return self.clock()
        return self.ends[-1] - self.cost.lead_s - STAGE_MARGIN_S - self.cost.error_s

    def _budget(self, contended: bool = False) -> int | None:
        """The padded tokens of a batch under settings.target_p99_ms and, when `contended`, the fair
        share's cap (None: max_batch_tokens)."""
        caps = []
        if self.settings.target_p99_ms:
            caps.append(self.cost.tokens_within(self.settings.target_p99_ms / 1e3 / P99_BATCHES))
        if contended:
            ms = self.settings.fair_batch_ms
            seconds = ms / 1e3 if ms > 0 else FAIR_AUTO * self.cost.seconds(FAIR_SHORT_TOKENS)
            caps.append(self.cost.tokens_within(seconds))
        fits = [c for c in caps if c is not None]
        return max(min(fits), self.settings.row_tokens or 1) if fits else None

    def _start(self, items: list[Seq]) -> float:
        """Mark a batch as started; returns its start time."""
        self.progress = t0 = self.clock()  # each batch is progress: leases keep renewing through long requests
        for it in items:
            if it.req.started is None:
                it.req.started = t0
        return t0

    def _launch(self, items: list[Seq]) -> None:
        t0 = self._start(items)
        self.last_batch = len(items)
        self.in_flight.append(items)
        begins = max(t0, self.ends[-1]) if self.ends else t0  # a batch's seconds include its launch when alone
        self.ends.append(begins + self.cost.seconds(sum(it.tokens for it in items)))
        record = self._record(items)
        fut = self.device.submit([it.seq for it in items])
        fut.add_done_callback(partial(self._device_done, items, t0, record))

    def _record(self, items: list[Seq]) -> list[float | int | None]:
        """A batch's entry of EngineStats.recent as it is handed to the device (RECENT_FIELDS)."""
        return [round(time.monotonic(), 4), 0.0, 0.0, len(items), sum(it.tokens for it in items),
                len(self.buckets), self.cpu_work.in_render, len(self.outbox.messages)]

    def _device_done(self, items: list[Seq], t0: float, record: list[float | int | None], fut: Future) -> None:
        """(the device runner's thread) a batch is back: hand it to the engine thread."""
        if fut.cancelled():  # never ran (the engine stopped): its messages go back with the rest
            return
        if fut.exception() is None:
            self._charge_ran(record, fut.result())
        self._post(("ran", items, t0, fut))

    def _charge_ran(self, record: list[float | int | None], ran: Ran) -> None:
        self.stats.charge(self.device.stage, ran.cpu_s)
        self.stats.ran(record, ran.start, ran.end, ran.launch_s)

    def on_ran(self, items: list[Seq], t0: float, fut: Future) -> set[Request]:
        """A batch is back from the device: its outputs, or (it raised) its halves to run next.
        Returns its requests (the caller sends those whose sequences all ran to decoding)."""
        i = next(k for k, b in enumerate(self.in_flight) if b is items)
        del self.in_flight[i], self.ends[i]
        self.progress = self.clock()
        try:
            ran = fut.result()
            outs = _checked(items, ran.outputs)
        except Exception as e:
            self._next_runs(self.clock())
            self.retry += self._raised(items, e)
            return set()
        self.cost.observe(sum(it.tokens for it in items), ran.end - ran.start, ran.launch_s)
        self._next_runs(ran.end)
        self._apply(items, outs, (self.clock() - t0) * 1e3)
        self._trace_batch(items, ran)
        return {it.req for it in items}

    def _next_runs(self, since: float) -> None:
        """A batch came back at `since`: the one staged behind it (if any) runs from then."""
        if self.ends:
            self.ends[0] = since + self.cost.seconds(sum(it.tokens for it in self.in_flight[0]))

    def _trace_batch(self, items: list[Seq], ran: Ran) -> None:
        """A `vela2.batch` span linked to the traced requests that ran in it (worker.obs.tracing)."""
        traces = self.outbox.traces
        if not traces:
            return
        traced = [t for t in (traces.get(r.rid) for r in {it.req: None for it in items}) if t is not None]
        if traced:
            self.tracing.batch(traced, ran.start, ran.end, len(items), sum(it.tokens for it in items))

    def _raised(self, items: list[Seq], e: Exception) -> list[list[Seq]]:
        """A batch raised: a sequence alone fails only its row; a larger batch gives its two halves
        to run next (as a stack: the first half last)."""
        self.stats.batches_raised += 1
        self.metrics.observe_batch([it.tokens for it in items], ok=False)
        live = [it for it in items if not it.req.closed]  # a row failed in an earlier half
        if len(live) == 1:
            req = live[0].req
            log.warning("request %s fails alone: %s: %s", req.rid, type(e).__name__, e, extra={"request_id": req.rid})
            self.fail(req, ModelError(f"the model failed on this request alone: {type(e).__name__}: {clip(str(e))}"))
            return []
        if not live:
            return []
        log.warning("batch of %d sequences raised %s: %s; splitting", len(live), type(e).__name__, clip(str(e)))
        mid = len(live) // 2
        return [live[mid:], live[:mid]]

    def _apply(self, items: list[Seq], outs: list[Any], elapsed_ms: float) -> None:
        """Hand a batch's outputs to their requests."""
        self.stats.batches += 1
        self.metrics.observe_batch([it.tokens for it in items], ok=True)
        for it in items:  # the tokens each tenant was served (its tokens_per_s quota: vela2.wire.usage)
            self.outbox.served(it.req.msg.tenant, it.tokens)
        for it, out in zip(items, outs, strict=True):
            if it.req.closed:  # failed meanwhile (another of its windows failed alone)
                continue
            it.req.outputs[it.index] = out
            it.req.remaining -= 1
        for req in {it.req for it in items}:
            req.model_ms += elapsed_ms

    def _live(self, items: list[Seq]) -> list[Seq]:
        """The items still worth running: not closed; requests past their deadline are answered."""
        now_wall = datetime.now(UTC)
        live = []
        for item in items:
            req = item.req
            if req.closed:
                continue
            if req.expires is not None and now_wall >= req.expires:
                self.expire(req)
                continue
            live.append(item)
        return live

    def decode_done(self, reqs: set[Request]) -> None:
        """Send every request whose sequences all ran to decoding."""
        for req in reqs:
            if not req.closed and req.remaining == 0:
                req.closed = True
                self.cpu_work.decode(req)
        self.cpu_work.flush()

    # --- attempts, suspects, the dead-letter list (see the module docstring) -------------------

    def _count_attempts(self, items: list[Seq]) -> list[Seq]:
        """Count an attempt for every request about to run its first batch in this delivery. A
        suspect goes to quarantine (all its sequences), a poison request to the dead-letter list.
        Returns the items still to run now."""
        fresh = list({it.req: None for it in items if it.req.verdict is None})
        if not fresh:
            return items
        set_aside: set[Request] = set()
        for req, (verdict, died) in zip(fresh, self.attempts.first([r.rid for r in fresh]), strict=True):
            req.verdict = verdict
            if verdict is Verdict.POISON:
                self._dead_letter(req, died)
            elif verdict is Verdict.SUSPECT:
                self._suspect(req, [it for it in items if it.req is req], died)
            else:
                continue
            set_aside.add(req)
        return [it for it in items if it.req not in set_aside]

    def _suspect(self, req: Request, items: list[Seq], died: int) -> None:
        """Quarantine a request whose earlier attempt(s) died with their worker: all its sequences
        wait here and run alone, when nothing else counted is in flight."""
        items = items + self.buckets.remove(lambda s: s.req is not req)
        self.quarantine.setdefault(req, []).extend(items)
        self.stats.retried_alone += 1
        log.warning("request %s: %d earlier attempt(s) died with their worker; it will run alone (attempt %d of %d)",
                    req.rid, died, died + 1, self.settings.max_attempts)

    def _run_quarantine(self) -> bool:
        """Run the next quarantined request alone once nothing else counted is in flight (so that
        if it kills the process, no innocent request is counted against or lost with it)."""
        counted = self.buckets.remove(lambda s: s.req.verdict is None)  # rows already running: finish
        if counted:
            lengths = [it.tokens for it in counted]
            for idx in pack(lengths, self.settings.max_batch_tokens, self.settings.row_tokens or None):
                live = self._live([counted[i] for i in idx])
                self._run_split(live)
                self.decode_done({it.req for it in live})
            return True
        if self.attempts:
            return False  # wait until those are decoded and stored
        req, items = next(iter(self.quarantine.items()))
        del self.quarantine[req]
        items = self._live(items)
        if not items:
            return True
        try:
            if self.store.existing([req.rid]):  # answered meanwhile (another delivery of it)
                self.outbox.answered_elsewhere(req)
                return True
        except Exception as e:
            log.warning("duplicate check of %s failed (%s); running it", req.rid, e, extra={"request_id": req.rid})
        req.verdict, died = self.attempts.again(req.rid)
        if req.verdict is Verdict.POISON:
            self._dead_letter(req, died)
            return True
        for it in items:
            self._run_split([it])
        self.decode_done({req})
        return True

    def _dead_letter(self, req: Request, died: int) -> None:
        """Move a poison request to the dead-letter list and answer it with a "poison" error."""
        reason = f"request crashed the worker {died} times; moved to {self.outbox.dead_key}"
        log.error("request %s is poison: %s", req.rid, reason, extra={"request_id": req.rid})
        self.outbox.dead(req.msg, dead_letter_entry(reason, message_id=req.msg.id, request_id=req.rid,
                                                    request=req.obj, attempts=died))
        self.attempts.poisoned(req.rid)  # its counter goes once the error answer is stored, never earlier
        self.fail(req, PoisonRequest(reason))

    def _run_split(self, items: list[Seq]) -> None:
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

    # --- closing a request that can no longer run -----------------------------------------------

    def fail(self, req: Request, exc: BaseException) -> None:
        """Answer `req` with the error `exc`."""
        req.closed = True
        self.cpu_work.forget(req)
        answer = systemone.error_answer(req.obj, exc) if systemone.is_system_one(req.obj) else None
        self.outbox.answer(req.msg, req.rid, error_result(req.rid, req.task, exc), answer, req.digest)
        if req.remaining:
            self.buckets.remove(lambda s: s.req is not req)

    def expire(self, req: Request) -> None:
        """Answer `req` expired: its deadline passed before it was scored."""
        req.closed = True
        if req.prep is not None:  # rendered already (else the render's reply drops it)
            self.cpu_work.forget(req)
        when = req.expires.isoformat() if req.expires else "?"
        res = expired_result(req.rid, req.task, f"deadline {when} passed before the request was scored")
        answer = req.system_one_answer(res) if systemone.is_system_one(req.obj) else None
        self.outbox.answer(req.msg, req.rid, res, answer, req.digest)
        if req.remaining:
            self.buckets.remove(lambda s: s.req is not req)

    def cancel(self, req: Request) -> None:
        """Answer a request cancelled before it started (never rendered, never on the device)."""
        req.closed = True
        res = cancelled_result(req.rid, req.task, CANCELLED_MESSAGE)
        answer = req.system_one_answer(res) if systemone.is_system_one(req.obj) else None
        self.outbox.answer(req.msg, req.rid, res, answer, req.digest)


def _checked(items: list[Seq], outs: list[Any]) -> list[Any]:
    """run_batch's outputs, one per sequence (else RuntimeError)."""
    if len(outs) != len(items):
        raise RuntimeError(f"run_batch returned {len(outs)} outputs for {len(items)} sequences")
    return outs
