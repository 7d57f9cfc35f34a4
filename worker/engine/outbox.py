"""The engine's outbox: answers queued for storing, stored in one pipelined round trip a turn (a bulk
job's results counted on its record in the same script call, vela2.wire.jobs), dead letters pushed,
then every message whose requests all have a stored result acked (never earlier; with
wait_replicas, only once that many replicas hold them). It also knows which ids the engine is
answering, so that a second delivery of one waits for that answer instead of running again."""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from vela2.api.schemas import RowResult, Status, error_result
from vela2.errors import StorageError
from vela2.wire import keys, usage
from vela2.wire.results import ResultStore, chunk_meta, dead_letter_entry, meta_row, row_meta
from worker.engine.attempts import Attempts
from worker.engine.stats import EngineStats
from worker.engine.work import Delivery, Message, Request, clip, job_of
from worker.obs.metrics import Metrics
from worker.settings import EngineSettings
from worker.transport import retry as retry_errors

log = logging.getLogger(__name__)

STORE_RETRY_S = 1.0  # pause before retrying a failed result write (Redis away), or acks replicas did not allow
# settings.wait_replicas: how long one WAIT may hold the engine thread (it takes, batches and stores between
# tries: a replica that does not answer costs at most this per STORE_RETRY_S, not a stalled worker)
WAIT_REPLICAS_TIMEOUT_MS = 200

Stored = tuple[Message, str, dict[str, Any], str]  # (message, id, meta, status)


class Outbox:
    """Held messages, the answers and dead letters to store, the acks to send (engine thread only,
    but for `return_all` at a stop that ran out of time, under `lock`)."""

    def __init__(self, store: ResultStore, settings: EngineSettings, stats: EngineStats, metrics: Metrics,
                 attempts: Attempts, clock: Callable[[], float], lock: threading.Lock, *, dead_key: str,
                 leases: Any = None, release_held: Callable[[list[str]], None] | None = None,
                 on_stored: Callable[[list[tuple[str, str, dict[str, Any]]]], None] | None = None,
                 tracing: Any = None):
        self.store, self.settings, self.stats, self.metrics = store, settings, stats, metrics
        self.attempts, self.clock, self.lock = attempts, clock, lock
        self.dead_key = dead_key  # the model's dead-letter list
        self.leases = leases  # worker.runtime.leases.Leases (hold / release per delivery tag), or None
        # removes the broker's held records of many delivery tags in one round trip (worker.transport.redis),
        # so the acks of a turn cost one Redis call, not one each; None: each ack removes its own
        self.release_held = release_held
        self.on_stored = on_stored  # called in the engine thread with (id, status, meta) of stored results
        self.tracing = tracing  # worker.obs.tracing.WorkerTracing while OpenTelemetry tracing is on, else None
        self.traces: dict[str, Any] = {}  # id -> RequestTrace of traced requests not stored yet
        self.messages: set[Message] = set()  # held: not acked, not returned
        self.working: dict[str, Request] = {}  # id -> the request of this engine answering it (until stored)
        self.followers: dict[str, list[Message]] = {}  # id -> other messages waiting on that answer
        self._to_store: list[Stored] = []
        self._to_dead: list[tuple[Message, str, str]] = []  # (message, pending token, dead-letter entry)
        self._store_after = 0.0
        self._to_ack: list[Delivery] = []
        self._ack_after = 0.0  # acks wait until then (wait_replicas: the replicas did not have the results)
        self._unreplicated_since: float | None = None  # when WAIT last started coming back short
        self._wait_probe = keys.wait_probe_key(uuid.uuid4().hex)
        self.tokens: Counter[str] = Counter()  # tenant ("" keyless) -> tokens run, not reported yet
        self._tokens_after = 0.0

    def hold(self, delivery: Delivery, mid: str) -> Message:
        """Start holding a delivery (its visibility lease renewed until it is acked)."""
        msg = Message(delivery, mid, chunk=False)
        self.messages.add(msg)
        if self.leases is not None:
            self.leases.hold(delivery.tag)
        return msg

    def wait_s(self, now: float, idle_s: float) -> float | None:
        """How long the loop may wait before this has work (None: nothing waiting here)."""
        if self._to_ack:
            return max(0.0, min(idle_s, self._ack_after - now))
        if self._to_store:
            return max(0.0, min(idle_s, self._store_after - now))
        if self.tokens:
            return max(0.0, min(idle_s, self._tokens_after - now))
        return None

    # --- tokens served --------------------------------------------------------------------------

    def served(self, tenant: str | None, tokens: int) -> None:
        """Count `tokens` run for `tenant` (None: keyless producers), for the next report."""
        self.tokens[tenant or ""] += tokens

    def report_tokens(self) -> None:
        """Add the tokens run since the last report to the tenants' counters of this second (the
        route's tokens_per_s quota reads them: vela2.wire.usage), at most once a TOKENS_REPORT_S,
        in one round trip. Redis refusing or away: kept for the next report (answers never wait
        for this)."""
        now = self.clock()
        if not self.tokens or now < self._tokens_after:
            return
        self._tokens_after = now + usage.TOKENS_REPORT_S
        try:
            usage.report_tokens(self.store.redis, dict(self.tokens))
        except Exception as e:  # noqa: BLE001 - metering never holds answers up
            log.warning("could not report the tenants' tokens (%s): kept for the next report", e)
            return
        self.tokens.clear()

    # --- answers --------------------------------------------------------------------------------

    def answer(self, msg: Message, rid: str, res: RowResult | dict[str, Any],
               answer: dict[str, Any] | None = None, digest: str | None = None) -> None:
        """Queue one result for storing: a RowResult, or the JSON form a decode process sends, with
        the request's content digest (None for a queue item too broken to have one)."""
        meta = row_meta(rid, res, answer, digest)
        row = meta_row(meta) or {}
        status = row["status"]
        self._to_store.append((msg, rid, meta, status))
        trace = self.traces.get(rid)
        if trace is not None and trace.answered is None:
            trace.answered = self.clock()
        reason = row["error"]["type"] if status == Status.error.value and row.get("error") else None
        self.metrics.observe_result(status, reason, row.get("timings"))

    def finished(self, req: Request, got: tuple[RowResult, dict[str, Any] | None] | BaseException) -> None:
        """A decode is done: its answer (or, it raised, an error result) goes to the store."""
        if isinstance(got, BaseException):
            log.error("decoding %s failed", req.rid, exc_info=got, extra={"request_id": req.rid})
            res, answer = error_result(req.rid, req.task, got), None
        else:
            res, answer = got
        req.prep, req.outputs = None, []  # free the rendered row and its outputs now
        self.answer(req.msg, req.rid, res, answer, req.digest)

    def dead(self, msg: Message, entry: str) -> None:
        """Queue a dead-letter entry; the message is acked only once it is pushed."""
        token = f"\x00dead-{len(self._to_dead)}-{id(entry)}"
        msg.pending.add(token)
        self._to_dead.append((msg, token, entry))
        self.stats.dead_lettered += 1

    def duplicate(self, msg: Message, rid: str) -> None:
        """`rid` of `msg` already has a stored answer: nothing to do for it."""
        self.stats.duplicates += 1
        self.metrics.duplicates.inc()
        msg.pending.discard(rid)
        msg.counts["duplicate"] += 1

    def follows(self, req: Request) -> bool:
        """A request this engine is already answering under the same id (a duplicate delivery in
        flight) waits for that answer instead of running again."""
        if req.rid not in self.working:
            return False
        self.followers.setdefault(req.rid, []).append(req.msg)  # counted a duplicate once answered
        return True

    def answered_elsewhere(self, req: Request) -> None:
        """`req` was answered meanwhile by another delivery of it: it and its followers are duplicates."""
        req.closed = True
        self.working.pop(req.rid, None)
        self.duplicate(req.msg, req.rid)
        for other in self.followers.pop(req.rid, []):
            self.duplicate(other, req.rid)
            self.finalize(other)
        self.finalize(req.msg)

    # --- storing --------------------------------------------------------------------------------

    def flush(self) -> None:
        """Store pending results and dead letters (one round trip), then settle every message whose
        ids are all stored. Redis refusing writes (full, away) leaves them queued for a retry; a
        result that cannot be stored as it is becomes a storage_error result, else a dead letter."""
        if not (self._to_store or self._to_dead) or self.clock() < self._store_after:
            return
        items, self._to_store = self._to_store, []
        dead, self._to_dead = self._to_dead, []
        try:
            outcomes = (self.store.store([(rid, meta) for _, rid, meta, _ in items],
                                         jobs=[job_of(msg, rid) for msg, rid, _, _ in items],
                                         tenants=[msg.tenant for msg, _, _, _ in items]) if items else [])
            if dead:
                self.store.redis.lpush(self.dead_key, *[entry for _, _, entry in dead])
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
        for msg, token, _ in dead:
            msg.pending.discard(token)
        self._settle_stored(stored, touched=[msg for msg, _, _ in dead])

    def _settle_stored(self, stored: list[Stored], touched: list[Message]) -> None:
        """Results are stored: forget their attempts, tell the hooks, close their traces, and
        finalize the messages they complete."""
        self.attempts.forget([rid for _, rid, _, _ in stored])
        if self.on_stored is not None and stored:
            try:
                self.on_stored([(rid, status, meta) for _, rid, meta, status in stored])
            except Exception as e:  # monitoring must never hold up acks
                log.warning("on_stored hook failed: %s", e)
        if self.traces:
            now = self.clock()
            for _, rid, _, status in stored:
                trace = self.traces.pop(rid, None)
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
            self.finalize(msg)

    def _settled(self, rid: str, msg: Message) -> list[Message]:
        """`rid` of `msg` is stored (or dead-lettered): the messages that waited on it are done with it."""
        req = self.working.get(rid)
        if req is None or req.msg is not msg:
            return []
        del self.working[rid]
        followers = self.followers.pop(rid, [])
        for other in followers:
            self.duplicate(other, rid)
        return followers

    def _retry_later(self, items: list[Stored], dead: list[Any], e: BaseException) -> None:
        """Keep what Redis did not take for the next try, in a second (Redis full or away)."""
        retry_errors.BLOCKED.refused(f"storing {len(items)} results and {len(dead)} dead letters", e)
        self._to_store = items + self._to_store
        self._to_dead = dead + self._to_dead
        self._store_after = self.clock() + STORE_RETRY_S

    def _unstorable(self, item: Stored, e: Exception) -> None:
        """A result Redis will not take as it is: store a short storage_error result instead, or
        (that failing too, or an id that cannot be a key) dead-letter it."""
        msg, rid, meta, status = item
        log.error("the result of %s cannot be stored: %s: %s", rid, type(e).__name__, clip(str(e)))
        if isinstance(e, UnicodeError) or meta.get("vela2_storage_error"):
            msg.pending.discard(rid)
            self.dead(msg, dead_letter_entry(f"result could not be stored: {type(e).__name__}: {clip(str(e))}",
                                             message_id=msg.id, request_id=rid))
            for other in self._settled(rid, msg):
                self.finalize(other)
            return
        err = StorageError(f"the result could not be stored: {type(e).__name__}: {clip(str(e))}")
        fallback = row_meta(rid, error_result(rid, None, err))
        fallback["vela2_storage_error"] = True
        self._to_store.append((msg, rid, fallback, "error" if status != "summary" else status))

    # --- acks -----------------------------------------------------------------------------------

    def finalize(self, msg: Message) -> None:
        """Queue the ack of a message once everything of it is stored (a chunk: its summary too,
        stored last)."""
        if msg.pending or msg.finalized:
            return
        if msg.chunk and not msg.summarized:
            msg.summarized = True
            msg.pending.add(msg.id)
            self._to_store.append((msg, msg.id, chunk_meta(msg.id, dict(msg.counts)), "summary"))
            return
        with self.lock:
            if msg.finalized:
                return
            msg.finalized = True
        self.messages.discard(msg)
        self.stats.messages_acked += 1
        if self.leases is not None:
            self.leases.release(msg.delivery.tag)
        self._to_ack.append(msg.delivery)

    def send_acks(self, force: bool = False) -> None:
        """Ack every message finalized this turn: their held records go in one round trip, then
        each ack settles the consumer's bookkeeping (should that round trip fail, each ack removes
        its own record, as without release_held). With settings.wait_replicas, only once that many
        replicas hold what was stored (`_replicated`); else they wait (unacked) and try again in
        STORE_RETRY_S (`force`: try now, at stop)."""
        if not self._to_ack or (not force and self.clock() < self._ack_after):
            return
        if self.settings.wait_replicas and not self._replicated():
            self._ack_after = self.clock() + STORE_RETRY_S
            return
        acks, self._to_ack = self._to_ack, []
        if self.release_held is not None:
            try:
                self.release_held([d.tag for d in acks if d.tag])
            except Exception as e:
                log.warning("releasing %d acked messages in one call failed (%s); acking one by one", len(acks), e)
        for d in acks:
            d.ack()

    @property
    def acks_due(self) -> bool:
        """Acks are waiting and may go now."""
        return bool(self._to_ack) and self.clock() >= self._ack_after

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

    def return_all(self, backlog: list[Delivery]) -> None:
        """Give every message not yet acked back to its queue (warm stop ran out of time), the
        deliveries never opened (`backlog`) too. Their attempts are uncounted: a request handed
        back alive is no suspect."""
        for d in backlog:
            self.stats.messages_returned += 1
            try:
                d.reject(True)
            except Exception as e:
                log.error("returning a message failed: %s", e)
        returned = [rid for msg in self.messages if not msg.finalized for rid in msg.pending]
        self.attempts.give_back(returned)
        for msg in list(self.messages):
            with self.lock:
                if msg.finalized:
                    continue
                msg.finalized = True
            self.messages.discard(msg)
            self.stats.messages_returned += 1
            if self.leases is not None:
                self.leases.release(msg.delivery.tag)
            try:
                msg.delivery.reject(True)
            except Exception as e:
                log.error("returning message %s failed: %s", msg.id, e)
