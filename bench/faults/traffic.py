"""What the scenarios send: valid rows of the four task kinds, messages built and then tampered with
(raw envelopes), and a Producer thread that submits at a steady pace and retries through outages."""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

import redis as redis_lib

from bench.faults.context import MODEL, QUEUE
from producer.client import Client
from vela2.wire.messages import build_message

DEEP = 100_000  # nesting of the deep JSON items (the wire limit is 64 levels)

TEXTS = [
    "Alice Smith from Acme wrote to bob@globex.com on Monday about order {i}; the refund was sent.",
    "Is the support team helpful? Carol said the reply to ticket {i} came within the hour.",
    "The shipment {i} left Berlin on Friday and should reach Lisbon next week, said Dan.",
    "Eve asked whether invoice {i} from Initech was paid, and by whom, before the deadline.",
]


def good_row(rid: str, i: int) -> dict[str, Any]:
    """A short valid row; the type cycles through choice, set, span and score."""
    text = TEXTS[i % len(TEXTS)].format(i=i)
    kind = i % 4
    if kind == 0:
        return {"id": rid, "task": "choice:boolq", "text": text, "questions": [{"options": ["yes", "no"]}]}
    if kind == 1:
        return {"id": rid, "task": "set:shield", "text": text, "questions": [{"options": ["violence", "privacy"]}]}
    if kind == 2:
        return {"id": rid, "task": "span:pii_dev", "text": text, "questions": [{"labels": ["person", "email"]}]}
    return {"id": rid, "task": "score:helpsteer2", "text": text, "questions": [{"options": ["0", "1", "2", "3"]}]}


def good_rows(prefix: str, n: int, start: int = 0) -> list[dict[str, Any]]:
    return [good_row(f"{prefix}-{i}", i) for i in range(start, start + n)]


# --- tampered messages ----------------------------------------------------------------------------


def raw_message(requests: list[Any], *, chunk: bool = False, max_bytes: int = 10**9, **kw: Any) -> dict[str, Any]:
    """A built message as its envelope dict (to tamper with); size limits off unless given."""
    return json.loads(build_message(requests, QUEUE, chunk=chunk, max_message_bytes=max_bytes, **kw).payload)


def set_body(env: dict[str, Any], body: bytes) -> dict[str, Any]:
    env["body"] = base64.b64encode(body).decode("ascii")
    return env


def past() -> Any:
    """A deadline 5 s ago (a message `expires` there is answered `expired`)."""
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC) - timedelta(seconds=5)


# --- a producer through outages --------------------------------------------------------------------


def _retried_submit_errors() -> tuple[type[BaseException], ...]:
    import amqp.exceptions
    import kombu.exceptions

    # Redis away; RabbitMQ away (refused, forced closed, kombu's retries given up) or nacking a publish
    return (redis_lib.ConnectionError, redis_lib.TimeoutError, OSError, kombu.exceptions.OperationalError,
            amqp.exceptions.ConnectionError, amqp.exceptions.MessageNacked)


RETRIED_SUBMIT_ERRORS = _retried_submit_errors()


class Producer(threading.Thread):
    """Submits rows in small batches at a steady pace through producer.Client; on a connection
    error it records the error and retries the same batch with exponential backoff (0.1 s doubling
    to 2 s), so a Redis (or, with `broker_url`, a RabbitMQ) outage delays submissions and loses none."""

    def __init__(self, redis_url: str, rows: list[dict[str, Any]], *, per_s: float, batch: int = 10,
                 broker_url: str | None = None):
        super().__init__(daemon=True)
        self.client = Client(redis_url, model=MODEL, broker_url=broker_url)
        self.rows = rows
        self.per_s = per_s
        self.batch = batch
        self.submitted: list[str] = []
        self.errors = 0
        self.first_error: str | None = None
        self.longest_backoff_s = 0.0
        self.blocked_s = 0.0  # time spent waiting on Redis

    def run(self) -> None:
        pause = self.batch / self.per_s
        for k in range(0, len(self.rows), self.batch):
            part = self.rows[k : k + self.batch]
            backoff = 0.1
            t_fail = None
            while True:
                try:
                    self.submitted += self.client.submit_many(part)
                    break
                except RETRIED_SUBMIT_ERRORS as e:
                    self.errors += 1
                    self.first_error = self.first_error or f"{type(e).__name__}: {e}"
                    t_fail = t_fail or time.monotonic()
                    time.sleep(backoff)
                    self.longest_backoff_s = max(self.longest_backoff_s, backoff)
                    backoff = min(2.0, backoff * 2)
            if t_fail is not None:
                self.blocked_s += time.monotonic() - t_fail
            time.sleep(pause)
        self.client.close()

    def notes(self) -> dict[str, Any]:
        return {
            "producer_submitted": len(self.submitted),
            "producer_connection_errors": self.errors,
            "producer_first_error": self.first_error,
            "producer_policy": "retry the same submit_many with exponential backoff 0.1 s -> 2 s (no request dropped; "
            "a retry after a lost reply may queue a message twice, which the write-once result makes harmless)",
            "producer_longest_backoff_s": self.longest_backoff_s,
            "producer_blocked_s": round(self.blocked_s, 1),
        }
