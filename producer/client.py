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
it stores the result. So every read tells four states apart (`status(id)`):

- "answered": the result is stored;
- "pending": submitted, no result yet;
- "expired": answered, but the result has since expired from the result store (`result_expires`);
  `result` / `answer` raise `vela2.errors.ResultExpired` at once (never an endless wait), and
  `results_many` / `answers_many` map the id to an error result of type "result_expired";
- "unknown": never submitted by a tracking client (or so long ago that its marker is gone too);
  waits wait, as for any id a worker may still answer.

Reads are pipelined: each poll is ONE MGET over the result keys and the marker keys of the ids
still missing (MGET is atomic, so the worker's result-and-marker write is never seen half done).
No celery, no torch.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis.exceptions
from pydantic import BaseModel

from producer import brokers
from vela2.api.schemas import RowResult, Status, error_result, parse_row
from vela2.config import LIMITS
from vela2.errors import IdConflict, InvalidRequest, LimitExceeded, ModelMismatch, ResultExpired, Vela2Error
from vela2.wire import tracing
from vela2.wire.connections import redis_client
from vela2.wire.keys import (
    cancel_key,
    id_problem,
    queue_name,
    result_key,
    scoped_id,
    submitted_key,
    tenant_problem,
    unscoped_id,
)
from vela2.wire.messages import Message, build_message, deadline_to_expires, request_digest, with_id
from vela2.wire.results import (
    CLAIM_ANSWERED,
    CLAIM_CONFLICT,
    CLAIM_MARKED,
    CLAIM_SCRIPT,
    DEFAULT_SUBMITTED_TTL_S,
    State,
    claim_args,
    parse_answer,
    parse_meta,
    split_state,
    state_keys,
    state_of,
)

log = logging.getLogger(__name__)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_MODEL = "vela2-demo"
_POLL_START_S = 0.005  # first poll interval of results_many; doubles up to _POLL_MAX_S
_POLL_MAX_S = 0.2


RESULT_EXPIRED = ResultExpired.code  # the error.type of an expired id in results_many / answers_many


def result_expired_error(request_id: str) -> ResultExpired:
    """The error of an id whose answer expired from the result store before it was read."""
    return ResultExpired(
        f"the answer to {request_id!r} expired from the result store (result_expires) before it was read; "
        "submit the request again to score it anew"
    )


def expired_row(request_id: str) -> RowResult:
    """The stand-in results_many returns for an expired id: status "error", type "result_expired"."""
    return error_result(request_id, None, result_expired_error(request_id))


def expired_answer(request_id: str) -> dict[str, Any]:
    """The stand-in answers_many returns for an expired id (the RowResult dict of `expired_row`)."""
    return expired_row(request_id).to_json_dict()


REQUEST_ERROR_TYPES = {InvalidRequest.code, LimitExceeded.code}  # the caller's fault -> 422


def http_status(answer: dict[str, Any]) -> int:
    """The HTTP status of a stored answer (producer.http.app's table; OpenAI-batch output lines carry it)."""
    status = answer.get("status")
    if status == Status.ok:
        return 200
    if status == Status.expired:
        return 504
    if status == Status.cancelled:
        return 409
    code = (answer.get("error") or {}).get("type")
    if code == ModelMismatch.code:
        return 400
    return 422 if code in REQUEST_ERROR_TYPES else 500


@dataclass(frozen=True)
class Scope:
    """A client's tenant: the ids it sends travel and are stored as `<tenant>/<id>`
    (vela2.wire.keys.scoped_id), so two tenants' equal ids never meet; every read maps them back,
    answers included. No tenant: ids as given (the default)."""

    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.tenant is not None and (problem := tenant_problem(self.tenant)):
            raise InvalidRequest(problem)

    def wire(self, rid: str) -> str:
        """The id as it travels and is stored; InvalidRequest for one no request can have (not a
        string, empty, over the limit, not encodable: e.g. a lone surrogate)."""
        if problem := id_problem(rid):
            raise InvalidRequest(f"id {problem}")
        return scoped_id(self.tenant, rid)

    def wire_items(self, items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Prepared (id, request) pairs as they travel; LimitExceeded when a scoped id is too long."""
        if self.tenant is None:
            return items
        out = []
        for rid, obj in items:
            wire = self.wire(rid)
            if len(wire) > LIMITS.max_id_chars:
                room = LIMITS.max_id_chars - len(scoped_id(self.tenant, ""))
                raise LimitExceeded(f"id {rid[:40]!r}... has {len(rid):,} characters; under tenant "
                                    f"{self.tenant!r} the limit is {room:,}")
            out.append((wire, {**obj, "id": wire} if isinstance(obj, dict) else obj))
        return out

    def caller(self, wire: str) -> str:
        """The caller's id of a wire id."""
        return unscoped_id(self.tenant, wire)

    def back(self, value: Any, wire: str) -> Any:
        """A read value (RowResult, answer dict or None) with the caller's id in place of `wire`."""
        if self.tenant is None or value is None:
            return value
        user = self.caller(wire)
        if isinstance(value, RowResult):
            return value.model_copy(update={"id": user}) if value.id == wire else value
        if isinstance(value, dict) and value.get("id") == wire:
            return {**value, "id": user}
        return value


def _as_json(request: Any) -> Any:
    """A pydantic request (Row, SystemOneRequest) as its JSON dict; anything else as given."""
    if isinstance(request, BaseModel):
        return request.model_dump(mode="json", exclude_none=True)
    return request


def prepare_request(request: Any, model: str, *, validate: bool = True) -> tuple[str, Any]:
    """Validate one request for `model` at the caller -> (id it is answered under, object to send).

    Raises InvalidRequest / LimitExceeded (the worker's own messages) or ModelMismatch for a
    SystemOne request naming another model. Rows without an id get their content id.
    `validate=False` only assigns the id.
    """
    obj = _as_json(request)
    if validate:
        # Imported on use: vela2.api.systemone pulls numpy (vela2.model.calibration), which a client that only
        # sends rows does not need.
        from vela2.api import systemone

        if systemone.is_system_one(obj):
            parsed = systemone.parse_request(obj)
            if parsed.model != model:
                raise ModelMismatch(f"request names model {parsed.model!r}; this client submits to {model!r}")
            check_words(systemone.render_checked(parsed.input)[0])
        else:
            check_words(parse_row(obj).text)
    return with_id(obj)


def check_words(text: str) -> None:
    """The worker's word limit (LIMITS.max_text_words, words as vela2.text.rendering splits them), checked
    at the caller: LimitExceeded with the worker's message. A text of at most that many characters
    cannot have more words, so only longer ones are split (the splitter is imported on first use)."""
    if len(text) <= LIMITS.max_text_words:
        return
    from vela2.text.rendering import split_words

    n_words = len(split_words(text))
    if n_words > LIMITS.max_text_words:
        raise LimitExceeded(f"text has {n_words:,} words; limit {LIMITS.max_text_words:,}")


def prepare_many(requests: Iterable[Any], model: str, *, validate: bool = True) -> list[tuple[str, Any]]:
    """`prepare_request` over many; an error names the request's index (`requests[3]: ...`).
    `validate=False` only assigns ids (see Client.submit)."""
    out: list[tuple[str, Any]] = []
    for i, r in enumerate(requests):
        try:
            out.append(prepare_request(r, model, validate=validate))
        except Vela2Error as e:
            raise type(e)(f"requests[{i}]: {e}") from None
    return out


def pack_messages(
    items: list[tuple[str, Any]],
    queue: str,
    *,
    chunk_size: int = 1,
    expires: datetime | None = None,
    max_message_bytes: int = LIMITS.max_message_bytes,
    job: str | None = None,
) -> list[Message]:
    """Messages for prepared (id, object) pairs, in order: one per request when chunk_size <= 1,
    else chunks of up to chunk_size requests. A chunk over max_message_bytes is split in halves; a
    single request over it raises LimitExceeded naming its id. `job`: the bulk job they belong to."""
    out: list[Message] = []

    def build(part: list[tuple[str, Any]]) -> None:
        try:
            out.append(
                build_message(
                    [obj for _, obj in part],
                    queue,
                    chunk=chunk_size > 1,
                    expires=expires,
                    max_message_bytes=max_message_bytes,
                    extra_headers=tracing.message_headers(queue, tuple(rid for rid, _ in part)),
                    job=job,
                )
            )
        except LimitExceeded as e:
            if len(part) == 1:
                raise LimitExceeded(f"request {part[0][0]!r}: {e}") from None
            half = len(part) // 2
            build(part[:half])
            build(part[half:])

    step = max(1, chunk_size)
    for k in range(0, len(items), step):
        build(items[k : k + step])
    return out


@dataclass
class Claims:
    """What CLAIM_SCRIPT said of each prepared request before it is queued."""

    conflicts: list[str] = field(default_factory=list)  # ids naming other content: never queued
    answered: set[str] = field(default_factory=set)  # ids whose answer is stored: not queued again
    marked: list[str] = field(default_factory=list)  # ids whose submitted marker this call wrote


def claim_commands(pipe: Any, items: list[tuple[str, Any]], queue: str, submitted_ttl_s: int | None) -> None:
    """Add one CLAIM_SCRIPT call per (id, request) to a (sync or asyncio) pipeline: the conflict
    check, and the submitted marker when `submitted_ttl_s` is set."""
    for rid, obj in items:
        args = claim_args(request_digest(obj), queue if submitted_ttl_s is not None else None, submitted_ttl_s)
        pipe.eval(CLAIM_SCRIPT, 2, submitted_key(rid), result_key(rid), *args)


def read_claims(items: list[tuple[str, Any]], replies: list[Any]) -> Claims:
    """The pipeline replies of claim_commands, sorted."""
    claims = Claims()
    for (rid, _), code in zip(items, replies, strict=True):
        if code == CLAIM_CONFLICT:
            claims.conflicts.append(rid)
        elif code == CLAIM_ANSWERED:
            claims.answered.add(rid)
        elif code == CLAIM_MARKED:
            claims.marked.append(rid)
    return claims


def cancel_commands(pipe: Any, wire_ids: list[str], ttl_s: int) -> None:
    """Add to a (sync or asyncio) pipeline: a cancel marker per id, then one MGET of their results."""
    for w in wire_ids:
        pipe.set(cancel_key(w), "1", ex=ttl_s)
    pipe.mget([result_key(w) for w in wire_ids])


def unanswered(ids: list[str], replies: list[Any]) -> list[str]:
    """The ids without a stored answer, from the replies of cancel_commands."""
    return [rid for rid, raw in zip(ids, replies[-1], strict=True) if raw is None]


def conflict_error(ids: list[str]) -> IdConflict:
    """The IdConflict naming the ids (at most 5 in the message) that already name other content."""
    shown = ", ".join(repr(i) for i in ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    one = len(ids) == 1
    return IdConflict(
        f"request id{'' if one else 's'} {shown} already name{'s' if one else ''} a request with other content "
        "(answered or pending): an id is an idempotency key, so send this request under a new id (the same "
        "content under the same id gets the stored answer)",
        ids,
    )


def check_timeout(timeout_s: Any) -> float | None:
    """A wait's `timeout_s` as the waits take it: None or infinity (wait for ever: None), a number
    (<= 0: one look, no wait); InvalidRequest naming it for NaN, which would never time out, or for
    anything that is not a number."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or math.isnan(timeout_s):
        raise InvalidRequest(f"timeout_s must be a number of seconds or None; got {timeout_s!r}")
    return None if math.isinf(timeout_s) and timeout_s > 0 else max(0.0, float(timeout_s))


def check_ttl(submitted_ttl_s: Any) -> int:
    """`submitted_ttl_s` as the clients take it: a whole number of seconds >= 1 (Redis EX)."""
    if isinstance(submitted_ttl_s, bool) or not isinstance(submitted_ttl_s, int) or submitted_ttl_s < 1:
        raise InvalidRequest(f"submitted_ttl_s must be a whole number of seconds >= 1; got {submitted_ttl_s!r}")
    return submitted_ttl_s


def nothing_sent(exc: BaseException) -> bool:
    """True when a failed push certainly queued nothing: the broker refused the connection before any
    command went out (redis-py's "Error N connecting to ...", a refused socket under kombu). Any other
    failure (a timeout or a connection lost while waiting for the reply, NotReplicated, a publish
    RabbitMQ did not confirm) may have queued the messages: the submitted markers stay, so the id
    still refuses other content, and submitting the same request again is safe (a duplicate message
    at worst, skipped by the worker)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError):
            return True
        if isinstance(e, redis.exceptions.ConnectionError) and " connecting to " in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def release_quietly(release: Callable[[list[str]], Any], ids: list[str]) -> Any:
    """Call `release(ids)` after a failed push, never hiding the push's own error behind a second one
    (the result store may be the Redis that just went away; the markers then expire on their TTL)."""
    try:
        return release(ids)
    except Exception as exc:  # noqa: BLE001 - the push's error is the one the caller must see
        log.warning("could not take back %d submitted marker(s) after a failed push: %s", len(ids), exc)
        return None


def plan_submit(items: list[tuple[str, Any]], claims: Claims, messages: list[Message], queue: str,
                chunk_size: int, expires: datetime | None) -> list[Message]:
    """The messages to push once the claims are in: all of them, less the requests already answered."""
    if not claims.answered:
        return messages
    todo = [it for it in items if it[0] not in claims.answered]
    return pack_messages(todo, queue, chunk_size=chunk_size, expires=expires)


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
    long a pending marker lives (default a day). `tenant`: scope every id to this tenant (see Scope).
    `wait_replicas`: a submit returns only once this many replicas of the broker's Redis have its
    messages (Redis WAIT, up to producer.brokers.WAIT_REPLICAS_TIMEOUT_MS, then NotReplicated, a
    redis TimeoutError: submit again); so a Sentinel failover cannot lose an accepted submission.
    Default 0: the master's reply is enough (a failover may lose the last accepted ones).

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
        tracing.configure("vela2-producer")  # only when OTEL_* variables ask for traces (vela2.wire.tracing)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def queue_for(self, request: Any = None, *, backfill: bool = False) -> str:
        """The queue this client's requests go to (online, or backfill)."""
        return queue_name(self.model, backfill=backfill)

    def _push(self, messages: list[Message]) -> None:
        """Queue every message on the broker (Redis: one round trip; RabbitMQ: each confirmed)."""
        brokers.push(self.broker, messages, self.wait_replicas)

    def claim(self, items: list[tuple[str, Any]], queue: str) -> Claims:
        """Check prepared requests against what their ids already name, and mark them submitted (when
        tracking), in one round trip; see Claims."""
        pipe = self.redis.pipeline(transaction=False)
        claim_commands(pipe, items, queue, self.submitted_ttl_s if self.track_submitted else None)
        return read_claims(items, pipe.execute())

    def release(self, ids: list[str]) -> None:
        """Take back submitted markers a claim wrote for requests that are not queued after all."""
        if ids:
            self.redis.delete(*[submitted_key(rid) for rid in ids])

    def _submit(self, items: list[tuple[str, Any]], queue: str, chunk_size: int, expires: datetime | None) -> None:
        messages = pack_messages(items, queue, chunk_size=chunk_size, expires=expires)  # sizes: before any claim
        claims = self.claim(items, queue)
        if claims.conflicts:
            self.release(claims.marked)
            raise conflict_error([self.scope.caller(w) for w in claims.conflicts])
        todo = plan_submit(items, claims, messages, queue, chunk_size, expires)
        if not todo:
            return
        try:
            self._push(todo)
        except Exception as exc:
            if nothing_sent(exc):
                # nothing queued: a marker left behind would read "pending" for a day and hold the id
                release_quietly(self.release, claims.marked)
            raise

    def submit(
        self, request: Any, *, backfill: bool = False, deadline_s: float | None = None, validate: bool = True
    ) -> str:
        """Validate and queue one request (a row or a SystemOne request); returns the id it is
        answered under. Raises InvalidRequest / LimitExceeded / ModelMismatch before queueing.

        `validate=False` sends the request as it is (only the message size is checked), so the
        worker answers a bad one with its error result (demos and tests of that path)."""
        item = prepare_request(request, self.model, validate=validate)
        self._submit(self.scope.wire_items([item]), self.queue_for(backfill=backfill), 1,
                     deadline_to_expires(deadline_s))
        return item[0]

    def submit_many(
        self,
        requests: Iterable[Any],
        *,
        backfill: bool = False,
        chunk_size: int = 1,
        deadline_s: float | None = None,
        validate: bool = True,
    ) -> list[str]:
        """Validate all, then queue all in one round trip (nothing is queued if one is bad); returns
        the ids in input order. `chunk_size` > 1 packs up to that many requests into each message
        (each still answered under its own id). `validate=False`: as in `submit`."""
        items = prepare_many(requests, self.model, validate=validate)
        expires = deadline_to_expires(deadline_s)
        if items:
            self._submit(self.scope.wire_items(items), self.queue_for(backfill=backfill), chunk_size, expires)
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

    def status(self, request_id: str) -> State:
        """The state now: "answered", "pending", "expired" or "unknown" (module docstring; one MGET)."""
        return self.lookup(request_id)[0]

    def is_submitted(self, request_id: str) -> bool:
        """True while a tracked submission is pending: submitted, not answered yet. False once it is
        answered (or its answer expired), and for unknown ids. See `status`."""
        return self.status(request_id) == "pending"

    def _read_one(self, request_id: str, parse: Any) -> Any:
        """The parsed result now, or None; raises ResultExpired when the answer came and went."""
        raw, marker = self.redis.mget(state_keys([request_id]))
        if state_of(raw, marker) == "expired":
            raise result_expired_error(request_id)
        return parse(raw)

    def _wait_one(self, request_id: str, timeout_s: float | None, parse: Any) -> Any:
        """Wait on the result key's pub/sub channel (no polling); TimeoutError after timeout_s,
        ResultExpired as soon as the marker says the answer came and expired."""
        timeout_s = check_timeout(timeout_s)
        key = result_key(request_id)
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(key)  # subscribe first, then read: a result written in between is not missed
            found = self._read_one(request_id, parse)
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while found is None:
                left = 1.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no result for {request_id!r} after {timeout_s} s")
                msg = pubsub.get_message(timeout=min(left, 1.0))
                if msg is not None and msg.get("type") == "message":
                    found = parse(msg["data"])
                elif msg is None:
                    found = self._read_one(request_id, parse)  # a reconnect may drop a publish
            return found
        finally:
            pubsub.close()

    def result(self, request_id: str, timeout_s: float | None = None) -> RowResult:
        """Wait for one RowResult (pub/sub on its key, so no polling); TimeoutError after timeout_s;
        ResultExpired when its answer has expired from the result store (at once, whatever timeout_s)."""
        wire = self.scope.wire(request_id)
        return self.scope.back(self._wait_one(wire, timeout_s, parse_meta), wire)

    def answer(self, request_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for one product answer: a SystemOne request's answer, else the RowResult dict.
        TimeoutError / ResultExpired as `result`."""
        wire = self.scope.wire(request_id)
        return self.scope.back(self._wait_one(wire, timeout_s, parse_answer), wire)

    def results_many(self, ids: Iterable[str], timeout_s: float | None = None) -> dict[str, RowResult | None]:
        """Wait for many results, one MGET (result + marker keys) per poll over the ids still
        missing. An id whose answer expired maps to an error RowResult of type "result_expired"
        (never None: it will not come); ids without a result when timeout_s runs out map to None."""
        return self._read_many(list(ids), timeout_s, parse_meta, expired_row)

    def answers_many(self, ids: Iterable[str], timeout_s: float | None = None) -> dict[str, dict[str, Any] | None]:
        """As results_many, but the product answers: a SystemOne request's answer, else the
        RowResult dict (an expired id: the error RowResult dict of type "result_expired")."""
        return self._read_many(list(ids), timeout_s, parse_answer, expired_answer)

    def _read_many(self, ids: list[str], timeout_s: float | None, parse: Any, expired: Any) -> dict[str, Any]:
        timeout_s = check_timeout(timeout_s)
        wire = {rid: self.scope.wire(rid) for rid in ids}
        got = self._wait_many(list(wire.values()), timeout_s, parse, expired)
        return {rid: self.scope.back(got[w], w) for rid, w in wire.items()}

    def _wait_many(self, ids: list[str], timeout_s: float | None, parse: Any, expired: Any) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(ids)
        missing = list(dict.fromkeys(ids))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pause = _POLL_START_S
        while missing:
            still = []
            for rid, (raw, marker) in split_state(missing, self.redis.mget(state_keys(missing))).items():
                value = expired(rid) if state_of(raw, marker) == "expired" else parse(raw)
                if value is None:
                    still.append(rid)
                else:
                    out[rid] = value
            missing = still
            if not missing or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(pause * 2, _POLL_MAX_S)
        return out

    def ping(self) -> bool:
        """True when Redis answers; raises redis.ConnectionError when it does not."""
        return bool(self.redis.ping())

    def close(self) -> None:
        """Release the connection pools."""
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
    "expired_answer",
    "expired_row",
    "pack_messages",
    "prepare_many",
    "prepare_request",
    "result_expired_error",
    "state_of",
]
