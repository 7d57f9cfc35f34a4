"""Where a producer queues its messages: a Redis broker (vela2.wire.taking.PUSH_SCRIPT: every message
on its tenant's list of its queue, the model's doorbell rung, in one round trip), or
RabbitMQ (`amqp://`: each message published with a publisher confirm, so `submit` returns only once
the broker has taken it — on a quorum queue, once a majority of its nodes have it).

The same message travels either way: vela2.wire.messages builds kombu's Redis envelope, and for
AMQP its body, headers and properties become the AMQP message's (what Celery's amqp transport would
send). The queue is declared (durable, vela2.wire.keys.AMQP_QUEUE_ARGUMENTS) before a producer's
first publish to it: RabbitMQ drops a message routed to a queue that does not exist yet (no worker
started), and confirms it all the same. kombu (the `amqp` extra) is imported only for an
amqp:// broker. No celery, no torch.
"""

from __future__ import annotations

import base64
import json
import threading
from itertools import groupby
from typing import Any

import redis.exceptions

from vela2.errors import QuotaExceeded
from vela2.wire import scripts
from vela2.wire.connections import redis_client
from vela2.wire.keys import AMQP_QUEUE_ARGUMENTS, is_amqp_url
from vela2.wire.messages import Message
from vela2.wire.taking import PUSH, PUSH_MAX, push_keys

WAIT_REPLICAS_TIMEOUT_MS = 1000  # a push waiting for replicas (wait_replicas) gives up after this
PUBLISH_RETRIES = 3  # a publish whose connection broke is retried this often (kombu reconnects), then raises
CONNECT_TIMEOUT_S = 5.0


class AmqpPublisher:
    """Publishes built messages to RabbitMQ with publisher confirms, over one connection (thread-safe:
    one publish at a time)."""

    def __init__(self, url: str):
        from kombu import Connection

        self.url = url
        self._conn = Connection(url, connect_timeout=CONNECT_TIMEOUT_S, transport_options={"confirm_publish": True})
        self._declared: set[str] = set()
        self._lock = threading.Lock()
        self._producer: Any = None

    def _queue(self, name: str) -> Any:
        from kombu import Queue

        return Queue(name, routing_key=name, durable=True, queue_arguments=AMQP_QUEUE_ARGUMENTS)

    def publish(self, messages: list[Message]) -> None:
        """Publish every message and wait for each confirm; raises kombu's / py-amqp's errors when the
        broker stays away for PUBLISH_RETRIES reconnects (nothing after the failing message is sent)."""
        with self._lock:
            if self._producer is None:
                self._producer = self._conn.Producer()
            for m in messages:
                envelope = json.loads(m.payload)
                props = envelope["properties"]
                declare = [] if m.queue in self._declared else [self._queue(m.queue)]
                self._producer.publish(
                    base64.b64decode(envelope["body"]),
                    exchange="",
                    routing_key=m.queue,
                    headers=envelope["headers"],
                    content_type=envelope["content-type"],
                    content_encoding=envelope["content-encoding"],
                    correlation_id=props["correlation_id"],
                    delivery_mode=2,  # persistent
                    declare=declare,
                    retry=True,
                    retry_policy={"max_retries": PUBLISH_RETRIES, "interval_start": 0.2, "interval_step": 0.5},
                )
                self._declared.add(m.queue)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._producer = None
            self._conn.release()


def connect(broker_url: str | None, store: Any) -> Any:
    """The broker connection of a producer: an AmqpPublisher for amqp:// URLs, a redis-py client for
    another Redis (sentinel:// too: vela2.wire.connections), else `store` (the result store's client:
    one Redis for both)."""
    if not broker_url:
        return store
    if is_amqp_url(broker_url):
        return AmqpPublisher(broker_url)
    return redis_client(broker_url)


class NotReplicated(redis.exceptions.TimeoutError):
    """A push reached fewer replicas than asked (`wait_replicas`) within WAIT_REPLICAS_TIMEOUT_MS: the
    messages are on the master, but a failover now could lose them. A TimeoutError, so callers that
    retry Redis timeouts retry it (the same ids again: a duplicate message at worst, skipped)."""


def push(broker: Any, messages: list[Message], wait_replicas: int = 0, max_queued: int | None = None) -> None:
    """Queue `messages` on `broker` (what `connect` returned, or a ready redis-py client); with
    `wait_replicas`, return only once that many replicas have them (Redis WAIT; NotReplicated else);
    with `max_queued`, QuotaExceeded (`queued`) and nothing queued when the tenant's list would hold more (a Redis
    broker; RabbitMQ counts no tenant's messages)."""
    if isinstance(broker, AmqpPublisher):
        broker.publish(messages)
        return
    pipe = broker.pipeline(transaction=False)
    queue_commands(pipe, messages, wait_replicas, max_queued)
    check_pushed(scripts.execute(pipe), wait_replicas, max_queued)


def check_wait_replicas(wait_replicas: Any, broker_url: str | None) -> int:
    """`wait_replicas` as a producer takes it: a whole number >= 0, and 0 for a RabbitMQ broker (its
    publisher confirms already wait for the queue: on a quorum queue, a majority of its nodes; Redis
    replicas do not exist there). Raises InvalidRequest naming the value otherwise."""
    from vela2.errors import InvalidRequest

    if isinstance(wait_replicas, bool) or not isinstance(wait_replicas, int) or wait_replicas < 0:
        raise InvalidRequest(f"wait_replicas must be a whole number, 0 or more; got {wait_replicas!r}")
    if wait_replicas and broker_url and is_amqp_url(broker_url):
        raise InvalidRequest(f"wait_replicas {wait_replicas} counts replicas of a Redis broker; the broker is "
                             "RabbitMQ (amqp://), whose publisher confirms already wait for the queue (a "
                             "quorum queue: a majority of its nodes): leave wait_replicas at 0")
    return wait_replicas


def wait_command(pipe: Any, wait_replicas: int) -> None:
    """Add `WAIT wait_replicas WAIT_REPLICAS_TIMEOUT_MS` to a pipeline (nothing for 0): its reply is the
    number of replicas that acknowledged every write before it on that connection."""
    if wait_replicas:
        pipe.execute_command("WAIT", wait_replicas, WAIT_REPLICAS_TIMEOUT_MS)


def check_replicated(replies: list[Any], wait_replicas: int) -> None:
    """Raise NotReplicated when a pipeline ending in `wait_command` reached fewer replicas than asked."""
    if wait_replicas and int(replies[-1]) < wait_replicas:
        raise NotReplicated(f"the push reached {int(replies[-1])} of {wait_replicas} replicas within "
                            f"{WAIT_REPLICAS_TIMEOUT_MS} ms (wait_replicas)")


def queue_commands(pipe: Any, messages: list[Message], wait_replicas: int = 0, max_queued: int | None = None) -> None:
    """Add the pushes of `messages` to a (sync or asyncio) Redis pipeline (PUSH_SCRIPT: each on its
    tenant's list of its queue, the doorbell rung; PUSH_MAX a call), then the WAIT for `wait_replicas`
    replicas (when not 0). `max_queued`: the first call of each list refuses the whole push when the
    list would hold more than that (check the replies with `check_pushed`)."""
    for (queue, tenant), group in groupby(messages, key=lambda m: (m.queue, m.tenant)):
        payloads = [m.payload for m in group]
        for k in range(0, len(payloads), PUSH_MAX):
            limit = max_queued if max_queued and k == 0 else 0
            PUSH.queue(pipe, push_keys(queue, tenant), [tenant or "", limit, len(payloads) - k,
                                                        *payloads[k : k + PUSH_MAX]])
    wait_command(pipe, wait_replicas)


def check_pushed(replies: list[Any], wait_replicas: int, max_queued: int | None) -> None:
    """Raise for a pipeline of `queue_commands` (and nothing else): NotReplicated (too few replicas),
    QuotaExceeded `queued` (a list over `max_queued`: nothing of it was queued)."""
    check_replicated(replies, wait_replicas)
    for reply in replies[:-1] if wait_replicas else replies:
        if max_queued and int(reply):
            raise QuotaExceeded("queued", max_queued, int(reply))
