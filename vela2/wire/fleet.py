"""The fleet as Redis shows it, read by both sides: queue depths and what live workers say about
themselves (the worker's start-up check for another live worker serving the same model from another
checkpoint, its queue-depth metric, `vela2 status`).

A worker beats every keys.HEARTBEAT_S: its id goes into `keys.workers_key(model)` (a sorted set
scored with the beat's unix time) and its description (JSON) into `keys.worker_info_key(model, id)`
with a TTL of three beats. A worker counts as live while its last beat is at most STALE_S old.
"""

from __future__ import annotations

import json
import time
from typing import Any

from vela2.wire import keys, scripts, taking

STALE_S = 3 * keys.HEARTBEAT_S  # a worker whose last beat is older is not counted live


def live_workers(client: Any, model_name: str, now: float | None = None) -> list[dict[str, Any]]:
    """The descriptions of `model_name`'s live workers (one round trip for the ids, one for the
    descriptions), oldest beat first; a live id whose description is missing (a worker of an older
    version) appears as {"worker": id}."""
    now = time.time() if now is None else now
    ids = [i.decode() if isinstance(i, bytes) else i
           for i in client.zrangebyscore(keys.workers_key(model_name), now - STALE_S, "+inf")]
    if not ids:
        return []
    raw = client.mget([keys.worker_info_key(model_name, i) for i in ids])
    out = []
    for worker_id, blob in zip(ids, raw, strict=True):
        info: dict[str, Any] = {"worker": worker_id}
        if blob is not None:
            try:
                info = {**json.loads(blob), "worker": worker_id}
            except ValueError:
                pass
        out.append(info)
    return out


def other_digests(client: Any, model_name: str, digest: str, worker_id: str | None = None) -> dict[str, str]:
    """Live workers of `model_name` (other than `worker_id`) that serve a checkpoint whose digest is
    not `digest`: worker id -> their digest."""
    return {w["worker"]: w["digest"] for w in live_workers(client, model_name)
            if w["worker"] != worker_id and w.get("digest") and w["digest"] != digest}


def depths(client: Any, queues: list[str]) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """(queue_depths, tenant_depths) in one round trip."""
    pipe = client.pipeline(transaction=False)
    taking.DEPTH.queue(pipe, *taking.depth_call(queues))
    pipe.hlen(keys.UNACKED_KEY)
    reply, unacked = scripts.execute(pipe)
    read = taking.read_depths(queues, reply)
    totals = {q: total for q, (total, _) in read.items()}
    totals[keys.UNACKED_KEY] = int(unacked)
    return totals, {q: tenants for q, (_, tenants) in read.items()}


def queue_depths(client: Any, queues: list[str]) -> dict[str, int]:
    """Messages waiting in each queue (its kombu priority sub-lists and its tenants' lists included)
    and, under keys.UNACKED_KEY, those delivered to some worker and not yet acked; one round trip."""
    return depths(client, queues)[0]


def tenant_depths(client: Any, queues: list[str]) -> dict[str, dict[str, int]]:
    """Messages waiting on each tenant's list of each queue: queue -> {tenant: messages} (tenants with
    none waiting left out; keyless producers' messages are in no tenant's list)."""
    return depths(client, queues)[1]


def amqp_queue_depths(url: str, queues: list[str]) -> dict[str, int]:
    """Messages ready in each RabbitMQ queue (a passive declare each; kombu, the amqp extra, is
    imported here only). Delivered, unacked ones are not counted: AMQP does not tell them (RabbitMQ's
    management API does, as messages_unacknowledged)."""
    from kombu import Connection

    with Connection(url, connect_timeout=2) as conn:
        channel = conn.default_channel
        return {q: int(channel.queue_declare(q, passive=True).message_count) for q in queues}
