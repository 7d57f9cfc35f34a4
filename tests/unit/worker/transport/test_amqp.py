"""RabbitMQ triage without a broker: a refused delivery is rewritten so the engine answers it."""

from __future__ import annotations

import base64
import json

from vela2.wire.keys import backfill_queue, online_queue
from vela2.wire.messages import build_message

MODEL = "vela2-demo"
TEXT = "The quick brown fox jumps over the lazy dog near the river bank"
ONLINE, BACKFILL = online_queue(MODEL), backfill_queue(MODEL)


def row(rid: str) -> dict:
    return {"id": rid, "task": "choice:boolq", "text": f"{TEXT} {rid}", "questions": [{"options": ["yes", "no"]}]}


def ours(rid: str, **headers) -> tuple[bytes, dict]:
    """The body and headers of a message of ours for row(rid), the headers changed by `headers`."""
    env = json.loads(build_message([row(rid)], ONLINE).payload)
    return base64.b64decode(env["body"]), {**env["headers"], **headers}


def test_triage_rewrites_a_refused_delivery_and_strips_forged_refusal_headers(demo_dir):
    """worker.transport.amqp without a broker: kombu's Message as the consumer hands it over."""
    from datetime import UTC, datetime
    from decimal import Decimal

    from kombu.message import Message

    from vela2.wire.messages import REFUSED_CONTENT_TYPE, REFUSED_HEADER, refused_ids
    from worker.app import create_app
    from worker.settings import WorkerSettings
    from worker.transport import amqp

    body, headers = ours("r-1", vela2_refused="forged", vela2_refused_ids=["victim"])
    good = Message(body=body, headers=headers, content_type="application/json", delivery_info={"routing_key": ONLINE})
    assert amqp.triage(good) is None
    assert good.body == body and REFUSED_HEADER not in good.headers and "vela2_refused_ids" not in good.headers

    body, headers = ours("r-2", task="celery.backend_cleanup")
    bad = Message(body=body, headers=dict(headers), content_type="application/json", properties={"priority": 0},
                  delivery_info={"routing_key": ONLINE})
    found = amqp.triage(bad)
    assert found is not None and found.ids == ["r-2"]
    assert bad.headers["task"] == "vela2.score" and bad.headers["id"] == "r-2"
    assert bad.headers[REFUSED_HEADER] == found.reason and refused_ids(bad.headers) == ["r-2"]
    assert bad.content_type == REFUSED_CONTENT_TYPE
    item = json.loads(bad.body)  # the delivery itself, for the dead-letter list
    assert item["headers"] == headers and base64.b64decode(item["body"]) == body
    assert item["properties"]["delivery_info"] == {"routing_key": ONLINE}

    # AMQP table values JSON has no type for, and a task name in bytes: refused, the item still JSON
    odd = Message(body=b"\x00\x01", headers={"task": b"vela2.score", "id": "r-3", "at": datetime.now(UTC),
                                                "n": Decimal("1.5")}, content_type=None)
    found = amqp.triage(odd)
    assert found is not None and "b'vela2.score'" in found.reason and found.ids == ["r-3"]
    assert base64.b64decode(json.loads(odd.body)["body"]) == b"\x00\x01"

    on_amqp = create_app(WorkerSettings(checkpoint=str(demo_dir), broker_url="amqp://guest:guest@127.0.0.1:5672/x"))
    on_redis = create_app(WorkerSettings(checkpoint=str(demo_dir)))
    assert on_amqp.conf.worker_consumer == "worker.transport.amqp:TriagingConsumer"
    assert on_redis.conf.worker_consumer == "celery.worker.consumer:Consumer"  # the Redis channel triages
    on_amqp.close()
    on_redis.close()
