"""Test your code against Vela 2 without a GPU worker: a fake worker for fakeredis (or any Redis).

    import fakeredis
    from producer import Client
    from producer.testing import FakeWorker, assert_ok

    redis = fakeredis.FakeRedis()                 # needs fakeredis[lua]: the testing extra
    client = Client(redis=redis, model="vela2-demo")
    worker = FakeWorker(redis, model="vela2-demo")          # answer="stub": deterministic answers
    rid = client.submit({"id": "r-1", "task": "choice:boolq", "text": "The sky is green.",
                         "questions": [{"question": "Is it?", "options": ["yes", "no"]}]})
    worker.drain()                                # answers what is queued, in this thread
    assert_ok(client.result(rid, timeout_s=1)).answers[0].decision   # "yes": the first option

`FakeWorker` takes messages from the model's queues (online first, then backfill, each with
kombu's priority sub-lists) and stores each answer exactly as the real worker does, with the same
code: the queue item is looked at by `vela2.wire.messages.triage` and decoded by
`decode_delivery` (ids, chunks, deadlines, the id rules), requests are validated by the real
validators (`parse_row`; SystemOne: `parse_request`, the model name check, `to_row`), and results
are written by `vela2.wire.results.ResultStore` (write-once `celery-task-meta-<id>` with the TTL
`online_result_expires_s`, a bulk job's lines' `result_expires_s`, the submitted marker turned into
"answered", a PUBLISH for waiters), with the same meta (`row_meta`: Celery's SUCCESS / FAILURE
fields, the RowResult, the SystemOne answer, the content digest, nothing stored twice). A bad
request gets the worker's error result; a request whose deadline passed gets `expired`; a
cancelled one (`Client.cancel`, or its bulk job's cancel: producer.jobs) gets `cancelled`,
and a bulk job's results are counted on its record as the worker counts them; a chunk gets its
summary under its own id; an id already answered is a duplicate (never
answered twice); a queue item with no usable id goes to the dead-letter list `vela2.<model>.dead`.
So `Client`, `AsyncClient`, the HTTP route, `vela2 backfill` and Celery's `AsyncResult(id)` read
its answers as they read the real worker's.

What it does not do: run a model (unless `answer="model"`), count words or tokens (the limits on
words per text and tokens per request need the tokenizer: the stub never refuses a request for
them; `answer="model"` does), batch, retry, or hold messages in Redis's `unacked` hash.

Answers (`answer=`):

- ``"stub"`` (default): deterministic, from the request alone. choice / score: uniform
  probabilities over the options, decision the first option, abstain_probability 0 (score adds
  `expected`, the mean of the options when all are numbers); set: 0.5 per option, decision the first
  option; span: probability 0 per label, no spans. Every field the worker's answer has for the same
  request is there, with the worker's types: `served_by` (`fake_digest`), `gate_fired` on PII span
  tasks, `units` when the row asks (the text's real word offsets), raw `logits` and `render` when it
  asks (`stub_answers`, `stub_render`); the probabilities are those logits calibrated by the
  worker's functions. Stored metas carry ``"vela2_fake": "stub"`` (a
  real worker's never carry ``vela2_fake``; with the other answers its value is ``"model"`` or the
  answer function's name): these are no model's answers.
- ``"model"``: the real model in this process (`vela2.predict` on `checkpoint=`, e.g. the demo
  checkpoint written by `vela2 init-demo DIR`; needs torch: the `model` extra), at
  `precision` (default as the worker: bf16 on CUDA, fp32 on a CPU).
- a callable ``answer(row) -> RowResult | list of answers``: `row` is the validated
  `vela2.api.schemas.Row` (a SystemOne request arrives as the row it becomes, one question per task in
  task order, each question's `task` ``"<type>:<task name>"``); return a RowResult, or one answer
  per question (an `vela2.api.schemas.Answer`, or a dict of its fields: `question` and `task` are filled
  in). Raising a `vela2.errors.Vela2Error` stores that error (e.g. ``ModelError`` for a failed
  request); any other exception stores a ``model_error`` naming it. Its answers are stored as
  returned; an ok result without `served_by` gets the fake's.

Two ways to run it: on demand (`drain()` answers what is queued, in the caller's thread) or in a
thread (`start()` / `stop()`, or ``with FakeWorker(...) as worker:``), which waits for messages as
the real worker does, so a test can submit and wait in one call (`client.answer(rid, timeout_s=5)`),
from asyncio or over HTTP too, and beats as a live worker does (every keys.HEARTBEAT_S between
messages, its beat removed by `stop()`: the route's /readyz, `vela2 status` and the clients'
NoWorker check count it; an on-demand FakeWorker is no running worker and beats none);
`run_until_empty()` waits until the thread has answered every queued message. Nothing here imports
torch (only ``answer="model"`` does, when asked).

The stub's answers are producer.testing.stub's; answer functions and the model in this process
producer.testing.answers'; this module holds the worker: taking queue items, answering and storing
them, on demand or in a thread.
"""

from __future__ import annotations

import functools
import json
import math
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis as redis_lib

from producer.client import DEFAULT_MODEL
from producer.testing.answers import MODEL, AnswerFn, as_result, model_answerer
from producer.testing.stub import FAKE_META_KEY, STUB, fake_digest, stub_answers, stub_render
from vela2.api import systemone
from vela2.api.schemas import (
    ModelInfo,
    Row,
    RowResult,
    Status,
    cancelled_result,
    error_result,
    expired_result,
    guess_id_task,
    parse_row,
)
from vela2.config import default_precision, install_hint
from vela2.errors import ModelError, Vela2Error
from vela2.model.calibration import Calibration
from vela2.wire import fleet, keys
from vela2.wire.connections import redis_client
from vela2.wire.jobs import ADMIT_ANSWERED, ADMIT_CANCELLED, CANCELLED_MESSAGE
from vela2.wire.messages import (
    Refused,
    answerable_ids,
    decode_delivery,
    decode_envelope,
    message_id,
    message_tenant,
    refused_ids,
    request_digest,
    triage,
)
from vela2.wire.results import (
    DEFAULT_ONLINE_RESULT_EXPIRES_S,
    DEFAULT_RESULT_EXPIRES_S,
    ResultStore,
    chunk_meta,
    dead_letter_entry,
    meta_row,
    row_meta,
)

TESTING_EXTRA = f"the 'testing' extra: {install_hint('testing')}"
_TAKE_WAIT_S = 0.05  # longest a thread waits between Redis calls when idle, so stop() and pause() act quickly
_IDLE_POLL_S = 0.02  # a thread's pause between two looks at empty queues


@dataclass(frozen=True)
class Drained:
    """What one `drain()` did: queue items taken, results stored (chunk summaries not counted),
    requests skipped as already answered, and queue items dead-lettered."""

    messages: int
    answered: int
    duplicates: int
    dead_lettered: int


@dataclass
class _Answered:
    """What one queue item yields: (id, meta) pairs to store, dead-letter entries, duplicates skipped."""

    writes: list[tuple[str, dict[str, Any]]]
    dead: list[str]
    duplicates: int = 0
    job: str | None = None  # the bulk job its results are counted on (vela2.wire.jobs)
    tenant: str | None = None  # the tenant its results' bytes are counted on (vela2.wire.usage)


def _answer_fn(answer: str | AnswerFn, checkpoint: str | Path | None, device: str,
               precision: str | None) -> tuple[str, AnswerFn]:
    """(kind, answer function) of FakeWorker's `answer=`."""
    if callable(answer):
        return getattr(answer, "__name__", "callable"), answer
    if answer == STUB:
        return STUB, stub_answers
    if answer == MODEL:
        if checkpoint is None:
            raise ValueError('answer="model" needs checkpoint=DIR (a checkpoint directory; '
                             "`vela2 init-demo DIR` writes the demo one)")
        return MODEL, model_answerer(checkpoint, device=device, precision=precision)
    raise ValueError(f"answer must be {STUB!r}, {MODEL!r} or a callable; got {answer!r}")


class FakeWorker:
    """Answers the messages on a model's queues like the real worker (module docstring).

    `redis`: a Redis client (redis-py, or fakeredis with Lua: ``fakeredis[lua]``) or a URL.
    `model`: the model whose queues it drains and whose name SystemOne requests must give.
    `answer`: ``"stub"`` (default), ``"model"`` (with `checkpoint`, `device`, `precision`) or a
    callable (see the module docstring). `result_expires_s` / `online_result_expires_s`: the worker's
    settings (TTL of a bulk job's lines' results / any other's). `delay_s`: in thread mode, a pause
    per message before its results are written. `calibration`: the default question texts of the
    SystemOne open-label kinds (default: `answer="model"`'s checkpoint's, else calibration.json's).
    """

    def __init__(
        self,
        redis: Any,
        model: str = DEFAULT_MODEL,
        *,
        answer: str | AnswerFn = STUB,
        checkpoint: str | Path | None = None,
        device: str = "cpu",
        precision: str | None = None,
        result_expires_s: int = DEFAULT_RESULT_EXPIRES_S,
        online_result_expires_s: int = DEFAULT_ONLINE_RESULT_EXPIRES_S,
        delay_s: float = 0.0,
        calibration: Calibration | None = None,
    ):
        self.redis = redis_client(redis) if isinstance(redis, str) else redis
        self._owns_redis = isinstance(redis, str)
        self.model = model
        self.kind, self._answer = _answer_fn(answer, checkpoint, device, precision)
        self.calibration = calibration or getattr(self._answer, "calibration", None) or Calibration()
        if self._answer is stub_answers:  # calibrates its logits as the worker would with this calibration
            self._answer = functools.partial(stub_answers, calibration=self.calibration)
        # the name SystemOne requests must give: the loaded checkpoint's with answer="model" (as the worker's
        # check, whatever its queues are named), else `model`
        self.served = getattr(self._answer, "model_name", model)
        # what an ok answer's `served_by` names when the answer did not name it (the stub, a callable);
        # answer="model" answers carry the checkpoint's own (vela2.predict)
        self.served_by = ModelInfo(name=self.served, digest=fake_digest(self.kind, self.served),
                                   precision=precision or default_precision(device))
        self.store = ResultStore(self.redis, ttl_s=result_expires_s, online_ttl_s=online_result_expires_s)
        self.queues = [lst for q in keys.queues(model) for lst in keys.priority_lists(q)]  # taking order
        # The thread takes an item by moving it onto a list of its own (LMOVE), and removes it from there
        # once its results are stored: a Redis restart between the take and the store (a pop whose
        # reply never came back) leaves the item there, and the thread answers it when Redis is back.
        self._tag = uuid.uuid4().hex
        self._taking = {q: f"{q}:fake-taking:{self._tag}" for q in self.queues}
        # its beats' id in thread mode (no description: no digest for a real worker's start-up check)
        self.worker_id = f"fake-{self._tag[:12]}@{socket.gethostname()}"
        self._beat_at = -math.inf  # monotonic time of the thread's last beat
        self.delay_s = delay_s
        self.lock = threading.Lock()  # held while taking and while storing: queued + `held` is exact under it
        self.held = 0  # requests taken and not yet stored
        self.messages = 0  # queue items handled
        self.requests = 0  # results stored (chunk summaries not counted)
        self.max_chunk = 0  # most requests one message carried
        self.redis_errors = 0  # Redis calls that failed (a restart) and were retried, in thread mode
        self._go = threading.Event()
        self._go.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.crashed: BaseException | None = None  # what ended the thread, if anything but stop()
        self._check_lua()

    def _check_lua(self) -> None:
        """The result store runs Lua scripts: a fakeredis without Lua support fails here, by name."""
        try:
            self.redis.eval("return 1", 0)
        except redis_lib.exceptions.ResponseError as e:
            raise RuntimeError(f"this Redis cannot run Lua scripts ({e}); with fakeredis install its Lua "
                               f"support: {TESTING_EXTRA} (fakeredis[lua])") from e

    # --- on demand ------------------------------------------------------------------------------

    def drain(self, max_messages: int | None = None) -> Drained:
        """Answer every message queued now (and those queued meanwhile), in this thread, online
        before backfill; at most `max_messages` when given. Returns what it did (`Drained`).

        Items are taken as the thread takes them (onto a taking list, dropped once stored): a Redis
        error raises out of drain() and leaves the item it held there, and the next drain() (or the
        thread, once started) answers it first, so nothing taken is lost."""
        messages = answered = duplicates = dead = 0
        while max_messages is None or messages < max_messages:
            with self.lock:
                # an item an interrupted drain() left (not the running thread's own item in flight)
                taken = self._taken_before() if self._thread is None else None
                taken = taken or self._take()
                if taken is None:
                    break
                item = self._answer_item(*taken)
            got = self._store(item, retry=False)
            self._release(*taken, retry=False)
            messages += 1
            answered += got.answered
            duplicates += got.duplicates
            dead += got.dead_lettered
        return Drained(messages, answered, duplicates, dead)

    def queued(self) -> int:
        """Messages waiting on the model's queues (every priority, online and backfill)."""
        return sum(fleet.queue_depths(self.redis, keys.queues(self.model)).get(q, 0) for q in keys.queues(self.model))

    def _on_taking_lists(self) -> int:
        """Items the thread took and has not stored yet (an answer a Redis restart interrupted among them)."""
        return self._lengths(self._taking.values())

    def _lengths(self, lists: Iterable[str]) -> int:
        """The items on `lists`, in one pipelined round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for lst in lists:
            pipe.llen(lst)
        return sum(int(n) for n in pipe.execute())

    # --- in a thread ------------------------------------------------------------------------------

    def start(self) -> FakeWorker:
        """Answer messages from a background thread as they arrive (until `stop()`)."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"vela2-fake-worker-{self.model}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (it finishes the message it holds first) and close a Redis client this
        worker made from a URL."""
        self._stop.set()
        self._go.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise TimeoutError(f"the fake worker's thread did not stop within {timeout_s} s")
            self._thread = None
            try:  # stopped cleanly: its beat goes, as a real worker's does
                self.redis.zrem(keys.workers_key(self.model), self.worker_id)
            except redis_lib.exceptions.ConnectionError:
                pass  # Redis away: the beat goes stale on its own
        if self._owns_redis:
            self.redis.close()

    def __enter__(self) -> FakeWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pause(self) -> None:
        """Take nothing more until `resume()` (the queues fill up, as behind a busy worker); a
        message the thread took before the call is still answered."""
        self._go.clear()
        with self.lock:  # a take in progress ends first (and gives back what arrived after the call)
            pass

    def resume(self) -> None:
        """Take messages again after `pause()`."""
        self._go.set()

    def run_until_empty(self, timeout_s: float = 10.0) -> None:
        """Return once every queued message is answered: with the thread running, wait (polling,
        up to `timeout_s`, else TimeoutError naming what is left) until the queues are empty and
        nothing is held; without it, `drain()`."""
        if self._thread is None:
            self.drain()
            return
        deadline = time.monotonic() + timeout_s
        while True:
            if self.crashed is not None:
                raise RuntimeError(f"the fake worker's thread died: {self.crashed!r}") from self.crashed
            with self.lock:
                left, held, taken = self.queued(), self.held, self._on_taking_lists()
            if not left and not held and not taken:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{left} messages queued, {taken} taken and not stored, and {held} requests held "
                                   f"after {timeout_s} s (paused: {not self._go.is_set()})")
            time.sleep(0.01)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # kept for run_until_empty() to raise, then reported by threading
            self.crashed = e
            raise

    def _loop(self) -> None:
        # an item taken whose answering or storing a Redis restart interrupted is answered before
        # anything else is taken, never dropped (it stays on its taking list until stored)
        taken: tuple[str, Any] | None = None
        recover = False  # after a Redis error: look on the taking lists for an item taken in the dark
        while not self._stop.is_set():
            try:
                self._beat()  # paused too: a busy worker beats
                if not self._go.wait(_TAKE_WAIT_S):
                    continue
                with self.lock:
                    if taken is None and recover:
                        taken = self._taken_before()
                        recover = False
                    if taken is None:
                        taken = self._take()
                        if taken is not None and not self._go.is_set():  # paused as it took: put it back
                            self.redis.lmove(self._taking[taken[0]], taken[0], "LEFT", "RIGHT")
                            taken = None
                    answered = self._answer_item(*taken) if taken is not None else None
            except redis_lib.exceptions.ConnectionError:  # Redis restarting (BusyLoadingError included)
                self.redis_errors += 1
                recover = True
                self._stop.wait(_TAKE_WAIT_S)
                continue
            if taken is None or answered is None:
                self._stop.wait(_IDLE_POLL_S)
                continue
            if self.delay_s:
                self._stop.wait(self.delay_s)
            self._store(answered, retry=True)
            self._release(*taken)
            taken = None

    def _beat(self) -> None:
        """(thread) Beat into the model's heartbeats every keys.HEARTBEAT_S, as a live worker does."""
        if time.monotonic() - self._beat_at >= keys.HEARTBEAT_S:
            self.redis.zadd(keys.workers_key(self.model), {self.worker_id: time.time()})
            self._beat_at = time.monotonic()

    def _take(self) -> tuple[str, Any] | None:
        """Move the first waiting item (queues in taking order, a queue's tenants' lists after its own)
        onto its taking list; (list, item). No fair share here: a test double answers what it finds."""
        for q in self._lists():
            item = self.redis.lmove(q, self._taking_list(q), "RIGHT", "LEFT")
            if item is not None:
                return q, item
        return None

    def _lists(self) -> list[str]:
        """The lists to take from: each queue's priority lists, then its tenants' (those in its ring)."""
        out = []
        for queue in keys.queues(self.model):
            out += keys.priority_lists(queue)
            out += [keys.tenant_list(queue, t.decode() if isinstance(t, bytes) else t)
                    for t in self.redis.zrange(keys.fair_ring(queue), 0, -1) if t]
        return out

    def _taking_list(self, source: str) -> str:
        """This thread's taking list for items from `source`."""
        if source not in self._taking:
            self._taking[source] = f"{source}:fake-taking:{self._tag}"
        return self._taking[source]

    def _taken_before(self) -> tuple[str, Any] | None:
        """An item this thread moved onto a taking list and never stored (a Redis restart came between)."""
        for q, taking_list in list(self._taking.items()):
            item = self.redis.lindex(taking_list, -1)
            if item is not None:
                return q, item
        return None

    def _release(self, queue: str, item: Any, *, retry: bool = True) -> None:
        """Drop a stored item from its taking list (in thread mode a restart is waited out: the results
        are stored; answering it again would find them and write nothing)."""
        while True:
            try:
                self.redis.lrem(self._taking[queue], 1, item)
                return
            except redis_lib.exceptions.ConnectionError:
                if not retry:
                    raise
                if self._stop.is_set():
                    return
                self.redis_errors += 1
                self._stop.wait(_TAKE_WAIT_S)

    # --- one queue item -----------------------------------------------------------------------------

    def _store(self, answered: _Answered, *, retry: bool) -> Drained:
        """Write an item's results and dead letters; in thread mode a Redis restart is waited out."""
        while True:
            try:
                with self.lock:
                    self._write(answered)
                    self.held = 0
                break
            except redis_lib.exceptions.ConnectionError:
                if not retry or self._stop.is_set():
                    raise
                self.redis_errors += 1
                self._stop.wait(_TAKE_WAIT_S)
        n = sum(meta_row(meta) is not None for _, meta in answered.writes)  # a chunk's summary is no answer
        self.messages += 1
        self.requests += n
        return Drained(1, n, answered.duplicates, len(answered.dead))

    def _write(self, answered: _Answered) -> None:
        n = len(answered.writes)
        for outcome in self.store.store(answered.writes, jobs=[answered.job] * n, tenants=[answered.tenant] * n):
            if isinstance(outcome, Exception):
                raise outcome
        if answered.dead:
            self.redis.lpush(keys.dead_letter(self.model), *answered.dead)

    def _answer_item(self, queue: bytes | str, payload: bytes | str) -> _Answered:
        """What one queue item yields: (id, meta) pairs to store, dead-letter entries, duplicates.
        Sets `held` to the requests it carries (called under `lock`)."""
        queue = queue.decode() if isinstance(queue, bytes) else queue
        raw = payload.encode("utf-8", "surrogatepass") if isinstance(payload, str) else payload
        env = decode_envelope(json.dumps(triage(raw, queue, uuid.uuid4().hex).envelope))
        mid = message_id(env.headers)
        if mid is None or keys.id_problem(mid):
            why = f"message id {keys.id_problem(mid) or 'is missing'}"
            return self._marked(_Answered([], [dead_letter_entry(why, message_id=None, item=raw)]))
        try:
            got = decode_delivery(mid, env.headers, env.body, env.content_type)
        except Vela2Error as e:
            ids = refused_ids(env.headers) if isinstance(e, Refused) else answerable_ids(mid, env.body)
            if not ids:
                return self._marked(_Answered([], [dead_letter_entry(str(e), message_id=mid, item=raw)]))
            return self._marked(_Answered([(rid, row_meta(rid, error_result(rid, None, e))) for rid in ids], []))
        self.held = len(got.requests)
        self.max_chunk = max(self.max_chunk, len(got.requests))
        dead = [dead_letter_entry(why, message_id=mid, request=obj) for obj, why in got.unusable]
        codes = self.store.admission([(rid, got.job) for rid, _ in got.requests])
        counts: Counter[str] = Counter()
        if got.repeated:
            counts["repeated"] += got.repeated
        writes = []
        for (rid, obj), code in zip(got.requests, codes, strict=True):
            if code == ADMIT_ANSWERED:
                counts["duplicate"] += 1
                continue
            meta = self._cancelled(rid, obj) if code == ADMIT_CANCELLED else self._score(rid, obj, got.expires)
            counts[(meta_row(meta) or {})["status"]] += 1
            writes.append((rid, meta))
        if got.chunk:
            writes.append((mid, chunk_meta(mid, dict(counts))))
        tenant = message_tenant(env.headers, [rid for rid, _ in got.requests])
        return self._marked(_Answered(writes, dead, counts["duplicate"], got.job, tenant))

    def _marked(self, answered: _Answered) -> _Answered:
        for _, meta in answered.writes:
            meta[FAKE_META_KEY] = self.kind
        return answered

    @staticmethod
    def _cancelled(rid: str, obj: Any) -> dict[str, Any]:
        """The stored meta of a request cancelled before it was taken (its marker, or its job's cancel)."""
        res = cancelled_result(rid, guess_id_task(obj)[1], CANCELLED_MESSAGE)
        answer = None
        if systemone.is_system_one(obj):
            try:
                answer = systemone.to_answer(systemone.parse_request(obj), res)
            except Vela2Error as e:
                answer = systemone.error_answer(obj, e)
        return row_meta(rid, res, answer, request_digest(obj))

    def _score(self, rid: str, obj: Any, expires: datetime | None) -> dict[str, Any]:
        """The stored meta of one request: `expired` once its deadline passed (checked first, as
        the worker does), else its answer or its error."""
        s1 = systemone.is_system_one(obj)
        answer: dict[str, Any] | None = None
        if expires is not None and datetime.now(UTC) >= expires:
            res = expired_result(rid, guess_id_task(obj)[1],
                                 f"deadline {expires.isoformat()} passed before the request was scored")
            if s1:
                try:
                    answer = systemone.to_answer(systemone.parse_request(obj), res)
                except Vela2Error as e:
                    answer = systemone.error_answer(obj, e)
        else:
            parsed = None
            try:
                if s1:
                    parsed = systemone.parse_request(obj)
                    systemone.check_model(parsed, self.served)
                    res = self._run_answer(rid, systemone.to_row(parsed, self.calibration))
                    answer = systemone.to_answer(parsed, res)
                else:
                    res = self._run_answer(rid, parse_row(obj))
            except Vela2Error as e:
                res = error_result(rid, guess_id_task(obj)[1], e)
                answer = systemone.error_answer(parsed if parsed is not None else obj, e) if s1 else None
        return row_meta(rid, res, answer, request_digest(obj))

    def _run_answer(self, rid: str, row: Row) -> RowResult:
        t0 = time.perf_counter()
        try:
            got = self._answer(row)
        except Vela2Error:
            raise
        except Exception as e:  # a failing answer function: the request fails, as a model error would
            raise ModelError(f"the answer function raised {type(e).__name__}: {e}") from e
        ms = (time.perf_counter() - t0) * 1e3
        res = as_result(rid, row, got, {"queue_ms": 0.0, "render_ms": 0.0, "model_ms": ms, "decode_ms": 0.0})
        if res.status != Status.ok:
            return res
        update: dict[str, Any] = {}
        if res.served_by is None:  # every answer the worker's model makes names it
            update["served_by"] = self.served_by
        if self.kind == STUB and row.logits and res.render is None:
            update["render"] = stub_render(row)
        return res.model_copy(update=update) if update else res
