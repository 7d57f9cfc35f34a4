"""The synchronous client: validate requests at the caller, queue them, read their results.

    client = Client("redis://127.0.0.1:6379/0", model="vela2-demo")
    rid = client.submit({"id": "r-1", "task": "choice:boolq", "text": "...", "questions": [...]})
    result = client.result(rid, timeout_s=30)          # a vela2.api.schemas.RowResult
    answer = client.answer(rid, timeout_s=30)          # the product answer dict (SystemOne or row)

A client serves one model: `model` names its queues (`vela2.<model>` online, drained first, and
`vela2.<model>.backfill` with `backfill=True`). Every request is validated before it is queued
(rows with `vela2.api.schemas.parse_row`, SystemOne requests with `vela2.api.systemone.parse_request`), so a
bad request fails here with the same clear message the worker would give: InvalidRequest,
LimitExceeded (a message over `LIMITS.max_message_bytes` included) or ModelMismatch (a SystemOne
request naming another model). `deadline_s` sets Celery's `expires` header: after it the worker
answers `expired` instead of scoring.

Submissions are tracked (`track_submitted=True`, the default): the push also sets the
`vela2:submitted:<id>` marker in the same round trip, and the worker turns it into "answered" when
it stores the result. So every read tells four states apart (`status(id)` tells a fifth):

- "answered": the result is stored;
- "pending": submitted, no result yet;
- "expired": answered, but the result has since expired from the result store (`result_expires`);
  `result` / `answer` raise `vela2.errors.ResultExpired` at once (never an endless wait), and
  `results_many` / `answers_many` map the id to an error result of type "result_expired";
- "unknown": never submitted by a tracking client (or so long ago that its marker is gone too);
  waits wait, as for any id a worker may still answer;
- "no_worker" (`status` only, instead of "pending"): submitted, not answered, and no worker of the
  model has beaten for `no_worker_grace_s` (producer.liveness): it stays queued, and is answered once
  a worker of the model runs.

A wait (`result`, `answer`, `results_many`, `answers_many`) that finds no answer ends with
`vela2.errors.NoWorker` (a TimeoutError) as soon as no worker of the model has beaten, nor said it
is starting, for `no_worker_grace_s` (default 30 s; None: off), instead of waiting out its timeout;
a busy worker beats, so a long queue never raises it, and an answer stored already is returned
first. While a worker beats this costs no round trip (producer.liveness). A wait with a timeout of
0 is one look and never raises it.

Reads are pipelined: each poll is ONE MGET over the result keys and the marker keys of the ids
still missing (MGET is atomic, so the worker's result-and-marker write is never seen half done).
No celery, no torch.

What both clients (this one and producer.aio's) share lives beside them: producer.prepare
(validation at the caller, messages), producer.submitting (claims, cancels, failed pushes),
producer.answers (an expired answer's stand-ins, the HTTP status of an answer), producer.scope
(tenants' ids); the waits of this client are producer.waiting's.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

import redis.exceptions

from producer import brokers
from producer.answers import RESULT_EXPIRED, expired_answer, expired_row, result_expired_error
from producer.liveness import DEFAULT_GRACE_S, Liveness
from producer.prepare import check_words, pack_messages, prepare_many, prepare_request
from producer.scope import Scope
from producer.submitting import (
    Claims,
    cancel_commands,
    check_claim_push,
    check_ttl,
    claim_commands,
    claim_push_command,
    conflict_error,
    nothing_sent,
    one_call,
    plan_submit,
    read_claims,
    refused_whole,
    release_quietly,
    store_full,
    unanswered,
)
from producer.waiting import Subscriptions, check_timeout, wait_many, wait_one
from vela2.api.schemas import RowResult
from vela2.errors import NoWorker
from vela2.wire import scripts, tracing
from vela2.wire.connections import redis_client
from vela2.wire.keys import queue_name, submitted_key
from vela2.wire.messages import Message, deadline_to_expires
from vela2.wire.results import (
    DEFAULT_SUBMITTED_TTL_S,
    State,
    parse_answer,
    parse_meta,
    split_state,
    state_keys,
    state_of,
)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_MODEL = "vela2-demo"
# what `status` says: the stored state, or "no_worker" for a pending request no worker would answer now
RequestStatus = State | Literal["no_worker"]


class Client:
    """Submit requests and read results over one Redis connection pool.

    `redis_url`: the Redis that the workers of `model` use as result store, and as broker unless
    `broker_url` names another broker (the workers' `--broker`: another Redis, or RabbitMQ at an
    amqp:// URL, see producer.brokers; `broker` replaces the connection made from it, as `redis` does
    for the result store). `model`: the model served; it names the queues
    (`vela2.<model>` online, `vela2.<model>.backfill`) and SystemOne requests must name it (else
    ModelMismatch). `redis`: a ready client to use instead of one made from the URL: a `redis.Redis`
    (your own pool, TLS, a Sentinel master) or, in tests, a `fakeredis.FakeRedis` (with Lua: ``pip install
    "vela2[testing]"``; see producer.testing). `track_submitted`: write the `vela2:submitted:<id>`
    marker at submit time (default on) so that `status` tells "pending" from "unknown" and an
    expired answer raises ResultExpired instead of a wait to the timeout; `submitted_ttl_s`: how
    long a pending marker lives (default a day). `tenant`: scope every id to this tenant (see producer.scope.Scope).
    `wait_replicas`: a submit returns only once this many replicas of the broker's Redis have its
    messages (Redis WAIT, up to producer.brokers.WAIT_REPLICAS_TIMEOUT_MS, then NotReplicated, a
    redis TimeoutError: submit again); so a Sentinel failover cannot lose an accepted submission.
    Default 0: the master's reply is enough (a failover may lose the last accepted ones).
    `no_worker_grace_s`: a wait ends with NoWorker once no worker of `model` has beaten for this
    long (at least producer.liveness.MIN_GRACE_S; None: waits wait out their timeout).

    Checked here before anything is queued, with the worker's own validators and messages: every
    field rule and limit of a request (vela2.config.LIMITS: text characters and words, questions,
    options, labels, ids, tasks, fields, message bytes) -> InvalidRequest / LimitExceeded /
    ModelMismatch, and `deadline_s` (0 < deadline_s <= LIMITS.max_deadline_s) -> LimitExceeded,
    all ValueErrors. Not checked here: the tokens of a request (LIMITS.max_request_tokens), which
    need the model's tokenizer: the worker answers such a request with a `limit_exceeded` error
    result. An id reused for other content raises IdConflict at submit.
    """

    def __init__(
        self,
        redis_url: str = DEFAULT_REDIS_URL,
        *,
        model: str = DEFAULT_MODEL,
        redis: Any = None,
        track_submitted: bool = True,
        submitted_ttl_s: int = DEFAULT_SUBMITTED_TTL_S,
        tenant: str | None = None,
        broker_url: str | None = None,
        broker: Any = None,
        wait_replicas: int = 0,
        no_worker_grace_s: float | None = DEFAULT_GRACE_S,
    ):
        # a push returns once this many replicas of the broker's Redis have it (WAIT; see "Redis Sentinel")
        self.wait_replicas = brokers.check_wait_replicas(wait_replicas, broker_url)
        self.redis = redis if redis is not None else redis_client(redis_url)
        # the queues' broker: the result store's Redis unless the workers take from another broker
        self.broker = broker if broker is not None else brokers.connect(broker_url, self.redis)
        self.model = model
        self.scope = Scope(tenant)  # ids of a tenant never meet another's (see Scope)
        # Write vela2:submitted:<id> markers at submit time (with the push): without them an expired
        # answer cannot be told from one not written yet, and waits on it last their whole timeout.
        self.track_submitted = track_submitted
        self.submitted_ttl_s = check_ttl(submitted_ttl_s)
        self._subscriptions = Subscriptions(self.redis)  # result waits: one pub/sub connection per thread
        self.liveness = Liveness(model, no_worker_grace_s)  # when waits give up: no worker beats
        tracing.configure("vela2-producer")  # only when OTEL_* variables ask for traces (vela2.wire.tracing)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def queue_for(self, request: Any = None, *, backfill: bool = False) -> str:
        """The queue this client's requests go to (online, or backfill)."""
        return queue_name(self.model, backfill=backfill)

    def _push(self, messages: list[Message], max_queued: int | None = None) -> None:
        """Queue every message on the broker (Redis: one round trip; RabbitMQ: each confirmed)."""
        brokers.push(self.broker, messages, self.wait_replicas, max_queued)

    def claim(self, items: list[tuple[str, Any]], queue: str) -> Claims:
        """Check prepared requests against what their ids already name, and mark them submitted (when
        tracking), in one round trip; see Claims."""
        pipe = self.redis.pipeline(transaction=False)
        claim_commands(pipe, items, queue, self.submitted_ttl_s if self.track_submitted else None)
        return read_claims(items, scripts.execute(pipe))

    def release(self, ids: list[str]) -> None:
        """Take back submitted markers a claim wrote for requests that are not queued after all."""
        if ids:
            self.redis.delete(*[submitted_key(rid) for rid in ids])

    def _submit(self, items: list[tuple[str, Any]], queue: str, chunk_size: int, expires: datetime | None,
                max_queued: int | None = None) -> None:
        messages = pack_messages(items, queue, chunk_size=chunk_size, expires=expires, tenant=self.scope.tenant)
        self._submit_packed(items, messages, queue, chunk_size, expires, max_queued)

    def _submit_packed(self, items: list[tuple[str, Any]], messages: list[Message], queue: str, chunk_size: int,
                       expires: datetime | None, max_queued: int | None) -> None:
        """Submit prepared requests whose messages are packed (sizes checked): claim, then push."""
        if one_call(items, messages, self.broker, self.redis):  # one request: claim and push in one call
            self._claim_push(items[0], messages[0], max_queued)
            return
        claims = self._claim_checked(items, queue)  # sizes first (above), then the ids
        self._send(items, claims, messages, queue, chunk_size, expires, max_queued)

    def _claim_push(self, item: tuple[str, Any], message: Message, max_queued: int | None) -> None:
        """Claim and queue one request in one round trip (CLAIM_PUSH). Nothing to take back on an
        error: a conflict or a refusal writes nothing, a full Redis refuses the script's first write."""
        pipe = self.redis.pipeline(transaction=False)
        claim_push_command(pipe, item, message, self.submitted_ttl_s if self.track_submitted else None,
                           self.wait_replicas, max_queued)
        try:
            replies = scripts.execute(pipe)
        except redis.exceptions.RedisError as exc:
            raise (store_full(exc) or exc) from exc
        check_claim_push(replies, self.scope.caller(item[0]), self.wait_replicas, max_queued)

    def _claim_checked(self, items: list[tuple[str, Any]], queue: str) -> Claims:
        """`claim`, raising StoreFull for a full Redis and IdConflict (its own markers taken back)."""
        try:
            claims = self.claim(items, queue)
        except redis.exceptions.RedisError as exc:
            raise (store_full(exc) or exc) from exc
        if claims.conflicts:
            self.release(claims.marked)
            raise conflict_error([self.scope.caller(w) for w in claims.conflicts])
        return claims

    def _send(self, items: list[tuple[str, Any]], claims: Claims, messages: list[Message], queue: str,
              chunk_size: int, expires: datetime | None, max_queued: int | None) -> None:
        """Push what the claims leave to queue; a push that queued nothing takes the markers back."""
        todo = plan_submit(items, claims, messages, queue, chunk_size, expires, self.scope.tenant)
        if not todo:
            return
        try:
            self._push(todo, max_queued)
        except Exception as exc:
            full = store_full(exc)
            if refused_whole(exc) or nothing_sent(exc):
                # nothing queued: a marker left behind would read "pending" for a day and hold the id
                release_quietly(self.release, claims.marked)
            if full is not None:
                raise full from exc
            raise

    def submit(
        self, request: Any, *, backfill: bool = False, deadline_s: float | None = None, validate: bool = True,
        max_queued: int | None = None,
    ) -> str:
        """Validate and queue one request (a row or a SystemOne request); returns the id it is
        answered under. Raises InvalidRequest / LimitExceeded / ModelMismatch before queueing.

        `validate=False` sends the request as it is (only the message size is checked), so the
        worker answers a bad one with its error result (demos and tests of that path).
        `max_queued`: refuse it (QuotaExceeded `queued`, nothing queued) when this client's queue list
        (its tenant's, on a Redis broker) would hold more messages than that."""
        item = prepare_request(request, self.model, validate=validate)
        self._submit(self.scope.wire_items([item]), self.queue_for(backfill=backfill), 1,
                     deadline_to_expires(deadline_s), max_queued)
        return item[0]

    def submit_many(
        self,
        requests: Iterable[Any],
        *,
        backfill: bool = False,
        chunk_size: int = 1,
        deadline_s: float | None = None,
        validate: bool = True,
        max_queued: int | None = None,
    ) -> list[str]:
        """Validate all, then queue all in one round trip (nothing is queued if one is bad); returns
        the ids in input order. `chunk_size` > 1 packs up to that many requests into each message
        (each still answered under its own id). `validate=False`, `max_queued`: as in `submit`."""
        items = prepare_many(requests, self.model, validate=validate)
        expires = deadline_to_expires(deadline_s)
        if items:
            self._submit(self.scope.wire_items(items), self.queue_for(backfill=backfill), chunk_size, expires,
                         max_queued)
        return [rid for rid, _ in items]

    def cancel(self, ids: Iterable[str]) -> list[str]:
        """Cancel requests: a worker that has not started one answers it `cancelled` (status
        "cancelled", error type "cancelled") without running it; one already running finishes and
        keeps its answer. Sets a `vela2:cancel:<id>` marker per id (living `submitted_ttl_s`) and
        reads which ids are answered already, in one round trip; returns the ids with no answer yet
        (those the cancel can still reach). To cancel a bulk job: producer.jobs.cancel_job."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        cancel_commands(pipe, [self.scope.wire(rid) for rid in ids], self.submitted_ttl_s)
        return unanswered(ids, pipe.execute())

    def lookup_many(self, ids: Iterable[str]) -> dict[str, tuple[State, dict[str, Any] | None]]:
        """id -> (its state now, its stored answer or None), with ONE MGET (no waiting)."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return {}
        wire = [self.scope.wire(rid) for rid in ids]
        got = split_state(wire, self.redis.mget(state_keys(wire)))
        return {rid: (state_of(*got[w]), self.scope.back(parse_answer(got[w][0]), w))
                for rid, w in zip(ids, wire, strict=True)}

    def lookup(self, request_id: str) -> tuple[State, dict[str, Any] | None]:
        """(state, stored answer or None) of one id now (one MGET)."""
        return self.lookup_many([request_id])[request_id]

    def status(self, request_id: str) -> RequestStatus:
        """The state now: "answered", "pending", "no_worker", "expired" or "unknown" (module docstring;
        one MGET, and for a pending id the beats when the newest known is older than the grace)."""
        state = self.lookup(request_id)[0]
        if state == "pending" and self.liveness.absent(self.redis) is not None:
            return "no_worker"
        return state

    def is_submitted(self, request_id: str) -> bool:
        """True while a tracked submission is pending: submitted, not answered yet ("pending" or
        "no_worker"). False once it is answered (or its answer expired), and for unknown ids."""
        return self.status(request_id) in ("pending", "no_worker")

    def _check(self) -> None:
        """A wait's liveness check (NoWorker)."""
        self.liveness.check(self.redis)

    def result(self, request_id: str, timeout_s: float | None = None) -> RowResult:
        """Wait for one RowResult (pub/sub on its key, so no polling); TimeoutError after timeout_s;
        ResultExpired when its answer has expired from the result store (at once, whatever timeout_s);
        NoWorker once no worker of the model has beaten for no_worker_grace_s."""
        wire = self.scope.wire(request_id)
        return self.scope.back(wait_one(self.redis, wire, timeout_s, parse_meta, self._subscriptions,
                                        self._check), wire)

    def answer(self, request_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for one product answer: a SystemOne request's answer, else the RowResult dict.
        TimeoutError / ResultExpired / NoWorker as `result`."""
        wire = self.scope.wire(request_id)
        return self.scope.back(wait_one(self.redis, wire, timeout_s, parse_answer, self._subscriptions,
                                        self._check), wire)

    def results_many(self, ids: Iterable[str], timeout_s: float | None = None) -> dict[str, RowResult | None]:
        """Wait for many results, one MGET (result + marker keys) per poll over the ids still
        missing. An id whose answer expired maps to an error RowResult of type "result_expired"
        (never None: it will not come); ids without a result when timeout_s runs out map to None.
        NoWorker (the answers read in its `done`) once no worker of the model has beaten for
        no_worker_grace_s."""
        return self._read_many(list(ids), timeout_s, parse_meta, expired_row)

    def answers_many(self, ids: Iterable[str], timeout_s: float | None = None) -> dict[str, dict[str, Any] | None]:
        """As results_many, but the product answers: a SystemOne request's answer, else the
        RowResult dict (an expired id: the error RowResult dict of type "result_expired")."""
        return self._read_many(list(ids), timeout_s, parse_answer, expired_answer)

    def _read_many(self, ids: list[str], timeout_s: float | None, parse: Any, expired: Any) -> dict[str, Any]:
        timeout_s = check_timeout(timeout_s)
        wire = {rid: self.scope.wire(rid) for rid in ids}
        try:
            got = wait_many(self.redis, list(wire.values()), timeout_s, parse, expired, self._check)
        except NoWorker as e:  # its answers by the caller's ids
            e.done = {rid: self.scope.back(e.done[w], w) for rid, w in wire.items() if w in e.done}
            raise
        return {rid: self.scope.back(got[w], w) for rid, w in wire.items()}

    def ping(self) -> bool:
        """True when Redis answers; raises redis.ConnectionError when it does not."""
        return bool(self.redis.ping())

    def close(self) -> None:
        """Release the connection pools (the result waits' pub/sub connections first)."""
        self._subscriptions.close()
        self.redis.close()
        if self.broker is not self.redis:
            self.broker.close()


__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_REDIS_URL",
    "RESULT_EXPIRED",
    "Client",
    "check_words",
    "State",
    "RequestStatus",
    "expired_answer",
    "expired_row",
    "pack_messages",
    "prepare_many",
    "prepare_request",
    "result_expired_error",
    "state_of",
]
