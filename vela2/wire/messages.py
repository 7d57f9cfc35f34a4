"""Celery protocol v2 messages for kombu's Redis transport: built by producers, decoded by workers.

A message is a JSON envelope LPUSHed onto the queue's list (kombu's Redis transport BRPOPs the
other end). The body is base64(JSON [args, kwargs, embed]):

- one request: args = [request], kwargs = {}, message id = the request id;
- a bulk chunk: args = [[request, ...]], kwargs = {"chunk": true}, message id = "chunk-<uuid>";
  every request is answered under its own id, the chunk id gets a small summary.

A deadline becomes Celery's `expires` header (ISO 8601); the worker answers `expired` after it.
`build_message` writes the layout; `decode_delivery` reads a delivered message back (headers +
body + content type -> its id, its requests with the ids they are answered under, its expiry), so
the worker and every fake of it decode exactly what the producer built.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from vela2.config import LIMITS
from vela2.errors import InvalidRequest, LimitExceeded
from vela2.schemas import content_id
from vela2.wire.keys import TASK_NAME, chunk_id

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
        if "model" in obj and "tasks" in obj and "input" in obj:  # SystemOne (vela2.systemone.is_system_one)
            return content_id({k: v for k, v in obj.items() if k != "id"})
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


def build_message(
    requests: list[Any],
    queue: str,
    *,
    chunk: bool = False,
    message_id: str | None = None,
    expires: datetime | None = None,
    max_message_bytes: int = LIMITS.max_message_bytes,
) -> Message:
    """Build one message for `requests` (exactly one unless `chunk`); raises LimitExceeded when the
    JSON body is over `max_message_bytes` (the worker would refuse it)."""
    if not requests:
        raise InvalidRequest("a message needs at least one request")
    if not chunk and len(requests) != 1:
        raise InvalidRequest(f"a single-request message carries 1 request; got {len(requests)} (use chunk=True)")
    pairs = [with_id(r) for r in requests]
    ids = tuple(rid for rid, _ in pairs)
    objs = [obj for _, obj in pairs]
    if chunk:
        mid = message_id or chunk_id(uuid.uuid4().hex)
        args: list[Any] = [objs]
        kwargs: dict[str, Any] = {"chunk": True}
    else:
        mid = message_id or ids[0]
        args, kwargs = [objs[0]], {}
    body = json.dumps([args, kwargs, _EMBED], ensure_ascii=False, separators=(",", ":")).encode()
    if len(body) > max_message_bytes:
        raise LimitExceeded(f"message body has {len(body):,} bytes; limit {max_message_bytes:,}")
    headers: dict[str, Any] = {
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
    }
    if chunk:
        # The row ids, so a worker can answer every row of a chunk it refuses without decoding it.
        headers["vela2_ids"] = list(ids)
    envelope = {
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
    payload = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"))
    return Message(id=mid, queue=queue, payload=payload, request_ids=ids)


def deadline_to_expires(deadline_s: float | None) -> datetime | None:
    """A relative deadline in seconds -> the absolute `expires` time (None: no deadline)."""
    return None if deadline_s is None else datetime.now(UTC) + timedelta(seconds=deadline_s)


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


@dataclass(frozen=True)
class Body:
    """A decoded message body: the requests it carries and whether it is a chunk."""

    requests: list[Any]
    chunk: bool


def decode_body(body: bytes | str, content_type: str | None = "application/json") -> Body:
    """Decode [args, kwargs, embed]; raises InvalidRequest naming what is wrong with it."""
    if content_type not in (None, "application/json"):
        raise InvalidRequest(f"message content-type must be application/json; got {content_type!r}")
    try:
        decoded = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"message body is not valid JSON: {e}") from None
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


def header_ids(headers: dict[str, Any]) -> list[str]:
    """The row ids a chunk's `vela2_ids` header lists ([] for a single request or none given)."""
    ids = headers.get("vela2_ids")
    return [i for i in ids if isinstance(i, str) and i] if isinstance(ids, list) else []


@dataclass(frozen=True)
class Delivered:
    """A decoded delivery: the message id, whether it is a chunk, its requests as (id, request)
    pairs in order (an id repeated inside one chunk is answered once: `repeated` counts the rest),
    and its deadline."""

    message_id: str
    chunk: bool
    requests: list[tuple[str, Any]]
    expires: datetime | None
    repeated: int = 0


def decode_delivery(
    mid: str,
    headers: dict[str, Any],
    body: bytes | str,
    content_type: str | None = "application/json",
    *,
    max_message_bytes: int = LIMITS.max_message_bytes,
) -> Delivered:
    """Decode the delivery of message `mid` (see `message_id`); raises InvalidRequest /
    LimitExceeded naming what is wrong (the caller answers the ids it knows: `header_ids`, else `mid`)."""
    if len(body) > max_message_bytes:
        raise LimitExceeded(f"message has {len(body):,} bytes; limit {max_message_bytes:,}")
    decoded = decode_body(body, content_type)
    expires = parse_expires(headers.get("expires"))
    pairs: dict[str, Any] = {}
    repeated = 0
    for obj in decoded.requests:
        rid = request_id(obj) if decoded.chunk else mid
        if rid in pairs:
            repeated += 1
            continue
        pairs[rid] = obj
    return Delivered(mid, decoded.chunk, list(pairs.items()), expires, repeated)


@dataclass(frozen=True)
class Envelope:
    """What kombu's Redis transport hands a consumer from one queue item."""

    headers: dict[str, Any]
    body: bytes
    content_type: str | None


def decode_envelope(payload: bytes | str) -> Envelope:
    """A queue item (the JSON envelope `build_message` LPUSHes) -> headers, raw body, content type;
    raises InvalidRequest when it is no envelope (what kombu would choke on)."""
    try:
        env = json.loads(payload)
        headers = env["headers"]
        raw = env["body"]
        encoding = (env.get("properties") or {}).get("body_encoding")
        body = base64.b64decode(raw, validate=True) if encoding == "base64" else str(raw).encode()
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise InvalidRequest(f"queue item is not a Celery message envelope: {type(e).__name__}: {e}") from None
    if not isinstance(headers, dict):
        raise InvalidRequest(f"envelope headers must be an object; got {type(headers).__name__}")
    return Envelope(headers, body, env.get("content-type"))
