"""The engine's intake: deliveries taken by the consumer are opened (decoded into requests, or
answered at once when they cannot run), checked in one round trip for ids already answered
(duplicate delivery: skipped) or cancelled (their marker, or their bulk job's cancel: answered
`cancelled`, never rendered or run), and sent to render ahead of the device; a rendered request's
sequences go to the scheduler's buckets. A flood is opened a slice at a time, so its first rows
render (and a batch launches) before its last are opened. Deliveries are opened in turn across
tenants (their `vela2_tenant` header), so one tenant's flood never stands between another's
request and the device."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any

from vela2.api.schemas import error_result
from vela2.errors import Vela2Error
from vela2.wire import keys, messages
from vela2.wire.jobs import ADMIT_ANSWERED, ADMIT_CANCELLED, ADMIT_RUN
from vela2.wire.results import ResultStore, dead_letter_entry
from worker.engine.cpu_work import CpuWork
from worker.engine.outbox import Outbox
from worker.engine.scheduler import Scheduler
from worker.engine.work import Delivery, Message, Request
from worker.settings import EngineSettings

log = logging.getLogger(__name__)

# requests one turn opens at most: the rest of its deliveries wait for the next turn (a batch may
# launch between). On the H200, 16-row messages flooding in as 512 events a turn (8,192 rows opened
# in one turn, ~0.4 s) held the second batch back while the device idled.
TURN_REQUESTS = 512
INTAKE_SLICE = 256  # requests opened before they are checked for duplicates and sent to render


class FairBacklog:
    """Deliveries not opened yet: a FIFO per tenant (its message header; keyless ones share ''), taken
    from in turn, one delivery each."""

    def __init__(self) -> None:
        self._lanes: dict[str, deque[Delivery]] = {}  # tenant -> its deliveries; in turn order
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Delivery]:
        return (d for lane in self._lanes.values() for d in lane)

    def append(self, d: Delivery) -> None:
        tenant = d.headers.get(keys.TENANT_HEADER)
        self._lanes.setdefault(tenant if isinstance(tenant, str) else "", deque()).append(d)
        self._n += 1

    def extend(self, ds: Iterable[Delivery]) -> None:
        for d in ds:
            self.append(d)

    def popleft(self) -> Delivery:
        """The oldest delivery of the tenant whose turn it is (that tenant goes to the back)."""
        tenant, lane = next(iter(self._lanes.items()))
        d = lane.popleft()
        del self._lanes[tenant]
        if lane:
            self._lanes[tenant] = lane  # to the back of the turn
        self._n -= 1
        return d

    def clear(self) -> None:
        self._lanes.clear()
        self._n = 0


class Intake:
    """Deliveries not opened yet (`backlog`), and the steps from a delivery to waiting sequences."""

    def __init__(self, settings: EngineSettings, store: ResultStore, outbox: Outbox, scheduler: Scheduler,
                 cpu_work: CpuWork, clock: Callable[[], float], tracing: Any = None):
        self.settings, self.store, self.outbox, self.scheduler = settings, store, outbox, scheduler
        self.cpu_work, self.clock, self.tracing = cpu_work, clock, tracing
        self.backlog = FairBacklog()  # taken deliveries not opened yet (TURN_REQUESTS a turn)

    def run(self) -> None:
        """Open waiting deliveries, at most TURN_REQUESTS requests a turn (each message whole), and
        start their requests INTAKE_SLICE at a time: a flood (thousands of rows after a pause)
        starts rendering after its first slice, not its last, and a batch launches between turns."""
        fresh: list[Request] = []
        opened = 0
        while self.backlog and opened < TURN_REQUESTS:
            d = self.backlog.popleft()
            try:
                got = self._open(d)
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

    def _admit(self, opened: list[Request]) -> None:
        """Duplicate and cancel check (one round trip), then render each new request (messages
        opened whole). Copies of one id opened together (a producer retry taken in the same turn)
        are checked once: the later ones wait on the first, as a duplicate in flight does."""
        firsts: dict[str, Request] = {}
        copies: list[Request] = []
        for r in opened:
            if self.outbox.follows(r):
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
        self._start(fresh, codes)
        for req in copies:
            req.closed = True
            if not self.outbox.follows(req):  # its first was answered already: a duplicate now
                self.outbox.duplicate(req.msg, req.rid)
        for msg in {r.msg for r in fresh + copies}:
            self.outbox.finalize(msg)

    def _start(self, fresh: list[Request], codes: list[int]) -> None:
        """Each admitted request: a duplicate, cancelled, expired, or sent to render."""
        now_wall = datetime.now(UTC)
        for req, code in zip(fresh, codes, strict=True):
            if code == ADMIT_ANSWERED:
                self.outbox.duplicate(req.msg, req.rid)
                req.closed = True
                continue
            self.outbox.working[req.rid] = req
            if code == ADMIT_CANCELLED:
                self.scheduler.cancel(req)
            elif req.expires is not None and now_wall >= req.expires:
                self.scheduler.expire(req)
            else:
                self.cpu_work.render(req)
        self.cpu_work.flush()

    def _open(self, d: Delivery) -> list[Request]:
        """Register a delivery; returns its requests still to answer. A message that cannot be run
        is answered here: an error under every id it can be answered under (its own id and the
        ids in its body, never a header's claims), or a copy on the dead-letter list when it has
        no usable id; a request whose id cannot be a key is dead-lettered too."""
        mid = messages.message_id(d.headers)
        msg = self.outbox.hold(d, mid or "(no id)")
        if mid is None or keys.id_problem(mid):
            reason = f"message id {keys.id_problem(mid) or 'is missing'}"
            log.error("queue item dead-lettered: %s", reason)
            self.outbox.dead(msg, dead_letter_entry(reason, message_id=None, item=d.body))
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
        msg.tenant = messages.message_tenant(d.headers, [rid for rid, _ in got.requests])
        if got.repeated:
            msg.counts["repeated"] += got.repeated  # the same id twice in one chunk: answered once
        for obj, why in got.unusable:
            log.error("request of message %s dead-lettered: %s", mid, why)
            self.outbox.dead(msg, dead_letter_entry(why, message_id=mid, request=obj))
        msg.pending.update(rid for rid, _ in got.requests)
        if self.tracing is not None:
            for rid, _ in got.requests:
                trace = self.tracing.request(d.headers, d.received)
                if trace is not None:
                    self.outbox.traces[rid] = trace
        return [Request(rid, obj, msg, d.received, got.expires) for rid, obj in got.requests]

    def _refuse(self, msg: Message, ids: list[str], e: Vela2Error, raw: bytes) -> None:
        """Answer a message that cannot run: its error under each usable id, else a dead letter. A
        bulk job's chunk refused whole (over max_message_bytes) counts its rows' errors on the job,
        else the job never ends: the job is its header's, checked against the ids its body names."""
        log.warning("message %s refused: %s", msg.id, e)
        rows = [rid for rid in ids if rid != msg.id] or ids  # a chunk's own id is no line of its job
        msg.job = messages.message_job(msg.delivery.headers, rows) if ids else None
        if not ids:
            self.outbox.dead(msg, dead_letter_entry(str(e), message_id=msg.id, item=raw))
        for rid in ids:
            msg.pending.add(rid)
            self.outbox.answer(msg, rid, error_result(rid, None, e))

    def rendered(self, req: Request, fut: Future) -> None:
        """A render is back: its sequences wait for a batch (or, it failed, its error is the answer)."""
        if req.closed:
            return
        try:
            prep, parsed, req.rendered_digest = fut.result()
        except Exception as e:
            if not isinstance(e, Vela2Error):
                log.error("rendering %s failed", req.rid, exc_info=e, extra={"request_id": req.rid})
            self.scheduler.fail(req, e)
            return
        req.system_one = parsed
        req.prep = prep
        trace = self.outbox.traces.get(req.rid)
        if trace is not None:
            trace.rendered, trace.render_ms = self.clock(), prep.render_ms
        self.scheduler.add(req)
