"""The steps of a submission that the sync and the asyncio client share (they differ only in how a
round trip is made): claim the ids (CLAIM_SCRIPT: an id already naming other content is refused
with IdConflict, one already answered is not queued again, the others are marked submitted), plan
what to push, and after a failed push tell whether anything could have been queued
(`nothing_sent`), so that markers of requests never queued are taken back. Cancelling ids is here
too (`cancel_commands`). No celery, no torch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis.exceptions

from producer.brokers import check_replicated, wait_command
from producer.prepare import pack_messages
from vela2.errors import IdConflict, InvalidRequest, QuotaExceeded, StoreFull
from vela2.wire.keys import cancel_key, result_key, submitted_key
from vela2.wire.messages import Message, request_digest
from vela2.wire.results import CLAIM, CLAIM_ANSWERED, CLAIM_CONFLICT, CLAIM_MARKED, claim_args
from vela2.wire.taking import CLAIM_PUSH, push_keys

log = logging.getLogger(__name__)


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
        CLAIM.queue(pipe, [submitted_key(rid), result_key(rid)], args)


def one_call(items: list[tuple[str, Any]], messages: list[Message], broker: Any, redis: Any) -> bool:
    """Whether a submission goes as one CLAIM_PUSH call: one request, in one message, queued on the
    result store's own Redis (the claim and the push then run in one script, one round trip)."""
    return len(items) == 1 and len(messages) == 1 and broker is redis


def claim_push_command(pipe: Any, item: tuple[str, Any], message: Message, submitted_ttl_s: int | None,
                       wait_replicas: int, max_queued: int | None) -> None:
    """Add one request's CLAIM_PUSH call (vela2.wire.taking: the claim of claim_commands and the push
    of producer.brokers.queue_commands in one script) to a (sync or asyncio) pipeline, then the WAIT
    for `wait_replicas` replicas (when not 0); read the replies with `check_claim_push`."""
    rid, obj = item
    args = claim_args(request_digest(obj), message.queue if submitted_ttl_s is not None else None, submitted_ttl_s)
    CLAIM_PUSH.queue(pipe, [submitted_key(rid), result_key(rid), *push_keys(message.queue, message.tenant)],
                     [len(args), *args, message.tenant or "", max_queued or 0, 1, message.payload])
    wait_command(pipe, wait_replicas)


def check_claim_push(replies: list[Any], caller_id: str, wait_replicas: int, max_queued: int | None) -> None:
    """Raise for the replies of `claim_push_command`: IdConflict (nothing written), QuotaExceeded
    `queued` (nothing queued, the marker taken back), NotReplicated (queued on too few replicas)."""
    code, refused = (int(x) for x in replies[0])
    if code == CLAIM_CONFLICT:
        raise conflict_error([caller_id])
    if code == CLAIM_ANSWERED:
        return
    if refused:
        raise QuotaExceeded("queued", max_queued or 0, refused)
    check_replicated(replies, wait_replicas)


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


def check_ttl(submitted_ttl_s: Any) -> int:
    """`submitted_ttl_s` as the clients take it: a whole number of seconds >= 1 (Redis EX)."""
    if isinstance(submitted_ttl_s, bool) or not isinstance(submitted_ttl_s, int) or submitted_ttl_s < 1:
        raise InvalidRequest(f"submitted_ttl_s must be a whole number of seconds >= 1; got {submitted_ttl_s!r}")
    return submitted_ttl_s


def refused_whole(exc: BaseException) -> bool:
    """True when a failed push certainly queued nothing because Redis or a quota refused it (Redis
    full, a tenant's `queued` quota): the claims' markers are taken back, as after `nothing_sent`."""
    return isinstance(exc, QuotaExceeded) or store_full(exc) is not None


def store_full(exc: BaseException) -> StoreFull | None:
    """The StoreFull a Redis refusal for memory stands for (redis-py's OutOfMemoryError, or an `OOM`
    error reply inside a script or pipeline), or None for any other error."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError) or (
            isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith("OOM")):
        return StoreFull("Redis refuses writes: it is full (used memory over its maxmemory); nothing was queued. "
                         "Results free memory as they expire or are read and deleted; an operator can raise "
                         "maxmemory")
    return None


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
                chunk_size: int, expires: datetime | None, tenant: str | None = None) -> list[Message]:
    """The messages to push once the claims are in: all of them, less the requests already answered."""
    if not claims.answered:
        return messages
    todo = [it for it in items if it[0] not in claims.answered]
    return pack_messages(todo, queue, chunk_size=chunk_size, expires=expires, tenant=tenant)
