"""RabbitMQ as broker: every delivery is looked at before Celery dispatches it, as the Redis channel
looks at every queue item (worker.transport.redis), by the same check (vela2.wire.messages.refusal).

Celery's consumer logs and drops what is no message of ours (a message that is not JSON, another
task, no id, protocol 1, a wrong content type, a compressed body kombu cannot decompress), writes
a NotRegistered failure of its own for an unknown task, and would run Celery's built-in tasks.
Here such a delivery is rewritten in place into a message of our task that carries the reason, the
ids found in it and the delivery itself (a kombu-style JSON envelope, the body base64), and goes on
to the engine like any other: it answers each id with an `invalid_request` error, or puts the
delivery on the dead-letter list with its reason when there is none, and acks only after that is
stored (a worker that dies first leaves it to RabbitMQ to redeliver). Installed by worker.app as
Celery's `worker_consumer` on an amqp:// broker only: the Redis channel wraps its items itself.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from typing import Any

from celery.worker.consumer import Consumer

from vela2.wire import keys, messages

log = logging.getLogger(__name__)

# delivery properties that the envelope carries elsewhere (headers, content type and encoding)
_NOT_IN_PROPERTIES = ("application_headers", "content_type", "content_encoding")


def delivery_item(message: Any) -> bytes:
    """A delivery as the dead-letter list keeps a queue item: kombu's JSON envelope (headers,
    content type and encoding, properties with the delivery info, the body base64)."""
    body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8", "surrogatepass")
    props = {k: v for k, v in (message.properties or {}).items() if k not in _NOT_IN_PROPERTIES}
    envelope = {
        "body": base64.b64encode(body).decode("ascii"),
        "content-encoding": message.content_encoding,
        "content-type": message.content_type,
        "headers": message.headers,
        "properties": {**props, "body_encoding": "base64", "delivery_info": message.delivery_info or {}},
    }
    return json.dumps(envelope, ensure_ascii=True, default=repr).encode("ascii")


def refuse(message: Any, found: messages.Refusal) -> None:
    """Rewrite `message` in place into a message of our task standing for it (see the module)."""
    log.warning("delivery on %s refused: %s", (message.delivery_info or {}).get("routing_key"), found.reason)
    item = delivery_item(message)
    message.vela2_refused = True  # kombu's Message keeps a __dict__ beside its slots
    message.headers = messages.refused_headers(found, f"refused-{uuid.uuid4().hex}")
    message.body = item
    message.content_type = messages.REFUSED_CONTENT_TYPE
    message.content_encoding = "binary"


def triage(message: Any) -> messages.Refusal | None:
    """Look at a delivery before Celery does: a message of ours loses any refusal headers it
    carries (only the worker sets them); anything else is rewritten by `refuse`. Returns the
    refusal, or None."""
    body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8", "surrogatepass")
    found = messages.refusal(message.headers, body, message.content_type)
    if found is None:
        messages.strip_refused(message.headers)
    else:
        refuse(message, found)
    return found


class TriagingConsumer(Consumer):
    """Celery's consumer with every delivery triaged before it is dispatched (worker_consumer)."""

    _dispatch: Any = None  # Celery's own handler: after triage every delivery is one of our task

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Any:
        dispatch = super().create_task_handler(*args, **kwargs)
        self._dispatch = dispatch

        def on_task_received(message: Any) -> Any:
            try:
                triage(message)
            except Exception as e:  # a bug here must not stop the consumer: the delivery is dead-lettered
                log.exception("triaging a delivery failed")
                refuse(message, messages.Refusal(f"the delivery could not be triaged: {type(e).__name__}: {e}"))
            return dispatch(message)

        return on_task_received

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        # kombu could not make a message of the delivery (a `compression` header whose body does not
        # decompress): Celery logs and acks it; here it is answered or dead-lettered like the rest
        if self._dispatch is None or getattr(message, "vela2_refused", False):
            super().on_decode_error(message, exc)
            return
        body = message.body if isinstance(message.body, bytes) else None
        checked = messages.refusal(message.headers, body, message.content_type)
        mid = messages.message_id(message.headers) if isinstance(message.headers, dict) else None
        ids = checked.ids if checked is not None else [mid] if mid else []
        refuse(message, messages.Refusal(f"message cannot be decoded: {type(exc).__name__}: {str(exc)[:200]}",
                                         [i for i in ids if keys.id_problem(i) is None]))
        self._dispatch(message)
