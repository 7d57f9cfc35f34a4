"""Celery protocol v2 messages for kombu's Redis transport: built by producers, decoded by workers.

A message is a JSON envelope LPUSHed onto the queue's list (kombu's Redis transport BRPOPs the
other end). The body is base64(JSON [args, kwargs, embed]):

- one request: args = [request], kwargs = {}, message id = the request id;
- a bulk chunk: args = [[request, ...]], kwargs = {"chunk": true}, message id = "chunk-<uuid>";
  every request is answered under its own id, the chunk id gets a small summary.

A deadline becomes Celery's `expires` header (ISO 8601); the worker answers `expired` after it.
The requests of a bulk job carry its id in the `vela2_job` header (vela2.wire.jobs): the worker
counts their results on the job's record as it stores them.
`build_message` writes the layout; `decode_delivery` reads a delivered message back (headers +
body + content type -> its id, its requests with the ids they are answered under, its expiry), so
the worker and every fake of it decode exactly what the producer built. Before that, every
delivery passes `refusal` (on Redis inside `triage`, on RabbitMQ in worker.transport.amqp): anything that is
no message of ours becomes a message of our task carrying the reason and the ids found in it
(`refused_headers`), which the engine answers or dead-letters.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from vela2.api.schemas import content_id
from vela2.config import LIMITS
from vela2.errors import InvalidRequest, LimitExceeded
from vela2.wire.keys import JOB_HEADER, TASK_NAME, TENANT_HEADER, TENANT_SEP, chunk_id, id_problem, tenant_problem

log = logging.getLogger(__name__)

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_REPR_CHARS = 1024  # argsrepr / kwargsrepr are for humans (flower, logs); keep them short
_ORIGIN = f"gen{os.getpid()}@{socket.gethostname()}"


def request_id(obj: Any) -> str:
    """The id a request is answered under: its own "id", else the deterministic content id the
    library would give it (rows: of the object; SystemOne requests: of the object without "id")."""
    if isinstance(obj, dict):
        rid = obj.get("id")
        if isinstance(rid, str) and rid:
            return rid
        if "model" in obj and "tasks" in obj and "input" in obj:  # SystemOne (vela2.api.systemone.is_system_one)
            return request_digest(obj)  # its content without the (empty or absent) id
        return content_id(obj)
    return content_id(repr(obj))


def with_id(obj: Any) -> tuple[str, Any]:
    """(id, request carrying that id explicitly), so worker and producer agree on the id."""
    rid = request_id(obj)
    if isinstance(obj, dict) and obj.get("id") != rid:
        obj = {**obj, "id": rid}
    return rid, obj


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_CHARS else text[: _REPR_CHARS - 3] + "..."


@dataclass(frozen=True)
class Message:
    """A built message: its id, the queue it goes to and the JSON envelope to LPUSH."""

    id: str
    queue: str
    payload: str
    request_ids: tuple[str, ...]
    tenant: str | None = None  # the tenant its ids are scoped to: it waits on that tenant's list (fair share)


def build_message(
    requests: list[Any],
    queue: str,
    *,
    chunk: bool = False,
    message_id: str | None = None,
    expires: datetime | None = None,
    max_message_bytes: int = LIMITS.max_message_bytes,
    extra_headers: dict[str, Any] | None = None,
    job: str | None = None,
    tenant: str | None = None,
) -> Message:
    """Build one message for `requests` (exactly one unless `chunk`); raises LimitExceeded when the
    JSON body is over `max_message_bytes` (the worker would refuse it). `extra_headers`: added to
    Celery's (the trace context of vela2.wire.tracing). `job`: the (scoped) id of the bulk job the
    requests belong to (their ids must be that job's, vela2.wire.jobs.request_wire_id). `tenant`: the
    tenant the ids are scoped to (vela2.wire.keys.scoped_id), named in a header for the worker's fair share."""
    pairs = _requests_with_ids(requests, chunk)
    ids = tuple(rid for rid, _ in pairs)
    objs = [obj for _, obj in pairs]
    if chunk:
        mid = message_id or chunk_id(uuid.uuid4().hex)
        args: list[Any] = [objs]
        kwargs: dict[str, Any] = {"chunk": True}
    else:
        mid = message_id or ids[0]
        args, kwargs = [objs[0]], {}
    body = _json_bytes([args, kwargs, _EMBED])
    if len(body) > max_message_bytes:
        raise LimitExceeded(f"message body has {len(body):,} bytes; limit {max_message_bytes:,}")
    headers = _task_headers(mid, args, kwargs, expires, extra_headers)
    if job is not None:
        headers[JOB_HEADER] = job
    if tenant is not None:
        headers[TENANT_HEADER] = tenant
    envelope = _envelope(body, headers, mid, queue)
    payload = json.dumps(envelope, ensure_ascii=True, separators=(",", ":"))  # ASCII: base64 body, short headers
    return Message(id=mid, queue=queue, payload=payload, request_ids=ids, tenant=tenant)


def _requests_with_ids(requests: list[Any], chunk: bool) -> list[tuple[str, Any]]:
    """(id, request carrying it) of each request of a message; InvalidRequest for no request, several
    without `chunk`, or an id the wire cannot carry."""
    if not requests:
        raise InvalidRequest("a message needs at least one request")
    if not chunk and len(requests) != 1:
        raise InvalidRequest(f"a single-request message carries 1 request; got {len(requests)} (use chunk=True)")
    pairs = [with_id(r) for r in requests]
    for rid, _ in pairs:
        problem = id_problem(rid)
        if problem:
            raise InvalidRequest(f"request id {rid[:40]!r} {problem}")
    return pairs


def _task_headers(mid: str, args: list[Any], kwargs: dict[str, Any], expires: datetime | None,
                  extra_headers: dict[str, Any] | None) -> dict[str, Any]:
    """Celery's protocol-2 task headers of message `mid` (the deadline as `expires`), then `extra_headers`."""
    return {
        "lang": "py",
        "task": TASK_NAME,
        "id": mid,
        "shadow": None,
        "eta": None,
        "expires": expires.astimezone(UTC).isoformat() if expires is not None else None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": mid,
        "parent_id": None,
        "argsrepr": _short_repr(args),
        "kwargsrepr": _short_repr(kwargs),
        "origin": _ORIGIN,
        "ignore_result": False,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
        **(extra_headers or {}),
    }


def _envelope(body: bytes, headers: dict[str, Any], mid: str, queue: str) -> dict[str, Any]:
    """kombu's Redis envelope around a message body: base64 body, headers, delivery properties."""
    return {
        "body": base64.b64encode(body).decode("ascii"),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "correlation_id": mid,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }


def _json_bytes(obj: Any) -> bytes:
    """Compact UTF-8 JSON; strings UTF-8 cannot encode (lone surrogates) are escaped instead, so
    the worker can refuse them by name rather than the producer failing on the encoding."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def request_digest(obj: Any) -> str:
    """The content digest of a request: what it asks, without its id (a hash of its canonical JSON).
    The worker stores it with the answer and producers mark pending ids with it, so an id reused
    for other content is a conflict (vela2.errors.IdConflict), never the other request's answer."""
    return content_id({k: v for k, v in obj.items() if k != "id"} if isinstance(obj, dict) else obj)


def deadline_to_expires(deadline_s: float | None) -> datetime | None:
    """A relative deadline in seconds -> the absolute `expires` time (None: no deadline). Raises
    LimitExceeded unless 0 < deadline_s <= LIMITS.max_deadline_s."""
    if deadline_s is None:
        return None
    if not 0 < deadline_s <= LIMITS.max_deadline_s:  # NaN fails this too
        raise LimitExceeded(f"deadline_s is {deadline_s!r}; it must be > 0 and at most {LIMITS.max_deadline_s:,.0f} s")
    return datetime.now(UTC) + timedelta(seconds=deadline_s)


def parse_expires(value: Any) -> datetime | None:
    """The `expires` header as an aware datetime (None when absent); raises InvalidRequest."""
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None:
        raise InvalidRequest(f"expires header must be an ISO 8601 time; got {value!r}")
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


# --- decoding a delivery ------------------------------------------------------------------------

MAX_JSON_DEPTH = 64  # nesting of one message's JSON (envelope or body); requests need far less


def decode_json(data: bytes | str, what: str) -> Any:
    """JSON of bounded nesting; raises InvalidRequest naming `what` and the problem."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise InvalidRequest(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"{what} is not valid JSON: {e}") from None
    if _openers(data) > MAX_JSON_DEPTH:  # else it cannot nest that deep: no walk (the hot path)
        _check_depth(value, what)
    return value


def _openers(data: bytes | str) -> int:
    """How many `[` and `{` the text holds (those inside strings too): a bound on its nesting."""
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")


def _check_depth(value: Any, what: str) -> None:
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise InvalidRequest(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels")
            todo.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))


@dataclass(frozen=True)
class Body:
    """A decoded message body: the requests it carries and whether it is a chunk."""

    requests: list[Any]
    chunk: bool


def decode_body(body: bytes | str, content_type: str | None = "application/json") -> Body:
    """Decode [args, kwargs, embed]; raises InvalidRequest naming what is wrong with it."""
    if content_type not in (None, "application/json"):
        raise InvalidRequest(f"message content-type must be application/json; got {content_type!r}")
    decoded = decode_json(body, "message body")
    if not (
        isinstance(decoded, list)
        and len(decoded) == 3
        and isinstance(decoded[0], list)
        and isinstance(decoded[1], dict)
    ):
        raise InvalidRequest("message body must be [args, kwargs, embed] with args a list and kwargs an object")
    args, kwargs = decoded[0], decoded[1]
    unknown = set(kwargs) - {"chunk"}
    if unknown:
        raise InvalidRequest(f"unknown keyword arguments {sorted(unknown)}; only 'chunk' is accepted")
    chunk = kwargs.get("chunk", False)
    if chunk is True:
        if len(args) != 1 or not isinstance(args[0], list) or not args[0]:
            raise InvalidRequest("a chunk message carries args [[request, ...]] with at least one request")
        return Body(list(args[0]), True)
    if chunk is not False:
        raise InvalidRequest(f"kwarg chunk must be true or false; got {chunk!r}")
    if len(args) != 1:
        raise InvalidRequest(f"a request message carries args [request]; got {len(args)} arguments")
    return Body([args[0]], False)


def message_id(headers: dict[str, Any]) -> str | None:
    """The task id in a delivery's headers (a request's id, or a chunk's); None when missing."""
    mid = headers.get("id")
    return mid if isinstance(mid, str) and mid else None


@dataclass(frozen=True)
class Delivered:
    """A decoded delivery: the message id, whether it is a chunk, its requests as (id, request)
    pairs in order (an id repeated inside one chunk is answered once: `repeated` counts the rest),
    its deadline, the requests whose id cannot be a key (`unusable`: (request, why)), which
    can only be dead-lettered, and the bulk job its requests are counted on (None: none)."""

    message_id: str
    chunk: bool
    requests: list[tuple[str, Any]]
    expires: datetime | None
    repeated: int = 0
    unusable: list[tuple[Any, str]] = field(default_factory=list)
    job: str | None = None


def decode_delivery(
    mid: str,
    headers: dict[str, Any],
    body: bytes | str,
    content_type: str | None = "application/json",
    *,
    max_message_bytes: int = LIMITS.max_message_bytes,
) -> Delivered:
    """Decode the delivery of message `mid` (see `message_id`); raises Refused (a queue item the
    worker's channel took apart, see `triage`), or InvalidRequest / LimitExceeded naming what is
    wrong: then `answerable_ids` says which ids the error may be stored under."""
    refused = headers.get(REFUSED_HEADER)
    if refused is not None:
        raise Refused(str(refused))
    if len(body) > max_message_bytes:
        raise LimitExceeded(f"message has {len(body):,} bytes; limit {max_message_bytes:,}")
    decoded = decode_body(body, content_type)
    expires = parse_expires(headers.get("expires"))
    pairs: dict[str, Any] = {}
    unusable: list[tuple[Any, str]] = []
    repeated = 0
    for obj in decoded.requests:
        rid = request_id(obj) if decoded.chunk else mid
        if not decoded.chunk and isinstance(obj, dict) and isinstance(obj.get("id"), str) and obj["id"] != mid:
            raise InvalidRequest(f"the request's id {obj['id'][:80]!r} differs from its message id {mid[:80]!r}")
        if not decoded.chunk and isinstance(obj, dict) and request_id(obj) != rid:
            # A request sent without an id (plain Celery without task_id = the request's id): answered
            # under the message's task id, which its content id does not match.
            log.warning("message %.80s carries a request without an id: it is answered under the message id, "
                        "not under the request's content id %s (send task_id = the request's id)",
                        mid, request_id(obj))
        problem = id_problem(rid)
        if problem:
            unusable.append((obj, f"request id {problem}"))
            continue
        if rid in pairs:
            repeated += 1
            continue
        pairs[rid] = obj
    return Delivered(mid, decoded.chunk, list(pairs.items()), expires, repeated, unusable,
                     message_job(headers, list(pairs)))


def message_job(headers: dict[str, Any], ids: list[str]) -> str | None:
    """The job a delivery's requests are counted on: its `vela2_job` header, honoured only when
    every request id is one of that job's (`<job>#<line>`), so a message can never move the
    counters of a job it does not belong to."""
    job = headers.get(JOB_HEADER)
    if not isinstance(job, str) or not job or id_problem(job):
        return None
    prefix = job + "#"
    if not ids or not all(rid.startswith(prefix) for rid in ids):
        log.warning("message %.80s names job %.80s but carries ids of no such job; not counted on it",
                    headers.get("id"), job)
        return None
    return job


def message_tenant(headers: dict[str, Any], ids: list[str]) -> str | None:
    """The tenant whose share a delivery's requests are run in: its `vela2_tenant` header, honoured
    only when every request id is scoped to that tenant (`<tenant>/<id>`); else None (the share of
    keyless producers and plain Celery)."""
    tenant = headers.get(TENANT_HEADER)
    if tenant is None or tenant_problem(tenant):
        return None
    prefix = tenant + TENANT_SEP
    return tenant if ids and all(rid.startswith(prefix) for rid in ids) else None


def answerable_ids(mid: str, body: bytes | str) -> list[str]:
    """The ids an error for an undecodable message is stored under: its own id and every id its
    body names (found leniently: any size, as long as the JSON parses), never a header's claims,
    so a message can never write under an id that is not in its own body. Unusable ids are left
    out (the caller dead-letters the message when none is left)."""
    ids = [mid]
    try:
        decoded = decode_json(body, "message body")
    except InvalidRequest:
        decoded = None
    if isinstance(decoded, list) and decoded and isinstance(decoded[0], list):
        args = decoded[0]
        objs = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        ids += [request_id(o) for o in objs if isinstance(o, dict)]
    return [i for i in dict.fromkeys(ids) if id_problem(i) is None]


# --- what a worker's channel does with a queue item ------------------------------------------------

REFUSED_HEADER = "vela2_refused"  # set by the worker's triage on a delivery it took apart: the reason
REFUSED_IDS_HEADER = "vela2_refused_ids"  # beside it: the ids found in the delivery
REFUSED_CONTENT_TYPE = "application/x-vela2-refused"


class Refused(InvalidRequest):
    """A delivery that is no message of ours; the worker's triage (the Redis channel, the RabbitMQ
    consumer) wrapped it so it is answered or dead-lettered like any other delivery (ack after
    store, redelivered if the worker dies)."""


@dataclass(frozen=True)
class Refusal:
    """Why a delivery is no message of ours, and the ids found in it that its error may be stored
    under (usable keys only; empty: it can only be dead-lettered)."""

    reason: str
    ids: list[str] = field(default_factory=list)


def refusal(headers: Any, body: bytes | None, content_type: Any, *, body_problem: str | None = None,
            task: str = TASK_NAME) -> Refusal | None:
    """Check a delivery (its headers, raw body and content type, as either broker hands them over)
    is a protocol-2 message of `task` that the engine can take: dict headers naming our task and a
    usable id, no compression, JSON content. Returns None when it is, else the Refusal (a protocol-1
    message, or one whose headers are no object, is answered under the ids its body names).
    `body_problem`: why the transport could not read the body (the Redis envelope's encoding; then
    `body` is None). The one check both brokers run: the Redis channel on every queue item it takes
    (`triage`), the RabbitMQ consumer on every delivery (worker.transport.amqp)."""
    try:
        if not isinstance(headers, dict) or "task" not in headers:
            found = _protocol1_id(body)
            if found is not None:
                raise _WithIds("Celery protocol 1 messages are not supported: send protocol 2", [found])
        if not isinstance(headers, dict):
            raise _WithIds(f"envelope headers must be an object; got {type(headers).__name__}",
                           list(answerable_ids("", body)) if body is not None else [])
        mid = message_id(headers)
        if headers.get("task") != task:
            named = f"task {str(headers['task'])[:80]!r} is" if "task" in headers else "a message with no task is"
            raise _WithIds(f"{named} not served here (only {task!r})", [mid] if mid else [])
        if mid is None or id_problem(mid):
            raise InvalidRequest(f"message id {'is missing' if 'id' not in headers else id_problem(headers['id'])}")
        if body_problem is not None:
            raise _WithIds(body_problem, [mid])
        if headers.get("compression") is not None:
            raise _WithIds("compressed messages are not supported", [mid])
        if content_type not in (None, "application/json"):
            raise _WithIds(f"message content-type must be application/json; got {str(content_type)[:80]!r}", [mid])
    except _WithIds as e:
        return Refusal(e.reason, e.ids)
    except InvalidRequest as e:
        return Refusal(str(e))
    return None


def refused_headers(found: Refusal, fallback_id: str) -> dict[str, Any]:
    """The headers of a message of our task standing for a refused delivery: the engine answers the
    ids in them with the reason, or dead-letters the delivery (its body) when there are none. Its id
    is the first id found, else `fallback_id` (named in the dead-letter entry only)."""
    mid = found.ids[0] if found.ids else fallback_id
    return {"lang": "py", "task": TASK_NAME, "id": mid, REFUSED_HEADER: found.reason[:1000],
            REFUSED_IDS_HEADER: list(found.ids), "retries": 0, "expires": None}


@dataclass(frozen=True)
class Triage:
    """A queue item, looked at before kombu touches it: the envelope to deliver (the item's own, or
    a wrapper of it when refused) and why it was refused (None when it is a message of ours)."""

    envelope: dict[str, Any]
    refused: str | None = None


def triage(payload: bytes | str, queue: str, tag: str, *, task: str = TASK_NAME) -> Triage:
    """Check a raw Redis queue item is a protocol-2 message of `task` that kombu and the engine can
    take: a JSON object of bounded nesting with a properties object and a base64 or plain string
    body, which passes `refusal`. Anything else is wrapped in an envelope of our task carrying the
    raw item, its reason and the ids found in it, so the engine answers those ids with the reason,
    or dead-letters the item. The delivery tag is always `tag` (the one the take script recorded
    the item under, vela2.wire.taking) and the routing key the queue the item came from, whatever
    the item claims."""
    raw = payload.encode("utf-8", "surrogatepass") if isinstance(payload, str) else payload
    try:
        env = decode_json(raw, "queue item")
        if not isinstance(env, dict):
            raise InvalidRequest(f"queue item must be a JSON object; got {type(env).__name__}")
        props = env.get("properties")
        if not isinstance(props, dict):
            raise InvalidRequest(f"envelope properties must be an object; got {type(props).__name__}")
    except InvalidRequest as e:
        return Triage(_refused_envelope(raw, queue, tag, Refusal(str(e))), str(e))
    body, problem = _envelope_body(env, props)
    headers = env.get("headers")
    found = refusal(headers, body, env.get("content-type"), body_problem=problem, task=task)
    if found is not None:
        return Triage(_refused_envelope(raw, queue, tag, found), found.reason)
    props["delivery_tag"] = tag
    props["delivery_info"] = {"exchange": "", "routing_key": queue}
    strip_refused(cast(dict[str, Any], headers))  # a dict (refusal checked); only the channel sets them
    return Triage(env)


def strip_refused(headers: dict[str, Any]) -> None:
    """Drop the refusal headers from a delivery that is a message of ours: only the worker's own
    triage sets them (a producer's would make the engine answer ids of its choosing)."""
    headers.pop(REFUSED_HEADER, None)
    headers.pop(REFUSED_IDS_HEADER, None)


class _WithIds(Exception):
    """A refusal that names the ids found in the item (kept only when they are usable keys)."""

    def __init__(self, reason: str, ids: list[str | None]):
        super().__init__(reason)
        self.reason = reason
        self.ids = [i for i in ids if i is not None and id_problem(i) is None]


def _envelope_body(env: dict[str, Any], props: dict[str, Any]) -> tuple[bytes | None, str | None]:
    """(the raw body of a Redis queue item, None) or (None, why it cannot be read)."""
    body, encoding = env.get("body"), props.get("body_encoding")
    if encoding not in (None, "", "base64", "utf-8"):
        return None, f"body_encoding {str(encoding)[:40]!r} is not base64"
    if not isinstance(body, str):
        return None, f"message body must be a string; got {type(body).__name__}"
    if encoding == "base64":
        try:
            return base64.b64decode(body, validate=True), None
        except ValueError:
            return None, "message body is not valid base64"
    return body.encode("utf-8", "surrogatepass"), None


def _protocol1_id(body: bytes | None) -> str | None:
    """The task id of a Celery protocol-1 message (the task and id live in the body)."""
    if body is None:
        return None
    try:
        decoded = decode_json(body, "body")
    except InvalidRequest:
        return None
    if isinstance(decoded, dict) and "task" in decoded and id_problem(decoded.get("id")) is None:
        return str(decoded["id"])
    return None


def _refused_envelope(raw: bytes, queue: str, tag: str, found: Refusal) -> dict[str, Any]:
    """An envelope of our task carrying a refused queue item (base64) for the engine to answer."""
    headers = refused_headers(found, f"refused-{tag}")
    return {
        "body": base64.b64encode(raw).decode("ascii"),
        "content-encoding": "binary",
        "content-type": REFUSED_CONTENT_TYPE,
        "headers": headers,
        "properties": {"correlation_id": headers["id"], "delivery_mode": 2, "priority": 0, "body_encoding": "base64",
                       "delivery_tag": tag, "delivery_info": {"exchange": "", "routing_key": queue}},
    }


def refused_ids(headers: dict[str, Any]) -> list[str]:
    """The ids found in a refused item (set by the channel: they are safe keys)."""
    ids = headers.get(REFUSED_IDS_HEADER)
    return [i for i in ids if id_problem(i) is None] if isinstance(ids, list) else []


@dataclass(frozen=True)
class Envelope:
    """What kombu's Redis transport hands a consumer from one queue item."""

    headers: dict[str, Any]
    body: bytes
    content_type: str | None


def decode_envelope(payload: bytes | str) -> Envelope:
    """A queue item (the JSON envelope `build_message` LPUSHes) -> headers, raw body, content type;
    raises InvalidRequest when it is no envelope (what kombu would choke on)."""
    env = decode_json(payload, "queue item")
    try:
        headers = env["headers"]
        raw = env["body"]
        encoding = (env.get("properties") or {}).get("body_encoding")
        body = base64.b64decode(raw, validate=True) if encoding == "base64" else str(raw).encode()
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise InvalidRequest(f"queue item is not a Celery message envelope: {type(e).__name__}: {e}") from None
    if not isinstance(headers, dict):
        raise InvalidRequest(f"envelope headers must be an object; got {type(headers).__name__}")
    return Envelope(headers, body, env.get("content-type"))
