"""Our Celery protocol v2 messages against what celery.send_task writes."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

from celery import Celery
from kombu import Queue

from tests.unit.worker.transport.test_celery_messages import QUEUE, ROW
from vela2.wire.keys import TASK_NAME
from vela2.wire.messages import build_message, parse_expires


def _celery_message(redis_url: str, **options) -> dict:
    app = Celery("probe", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.update(task_serializer="json", task_queues=[Queue(QUEUE, routing_key=QUEUE)])
    app.send_task(TASK_NAME, args=[ROW], task_id="r-1", queue=QUEUE, **options)
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        (raw,) = client.lrange(QUEUE, 0, -1)
    finally:
        client.close()
    app.close()
    return json.loads(raw)


def test_our_message_has_the_layout_celery_send_task_writes(redis_url):
    expires = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    theirs = _celery_message(redis_url, expires=expires)
    ours = json.loads(build_message([ROW], QUEUE, expires=expires).payload)
    assert set(ours) == set(theirs) == {"body", "content-encoding", "content-type", "headers", "properties"}
    for key in ("content-encoding", "content-type"):
        assert ours[key] == theirs[key]
    assert json.loads(base64.b64decode(ours["body"])) == json.loads(base64.b64decode(theirs["body"]))
    skip = {"origin", "argsrepr"}  # the producing process; repr style
    assert set(ours["headers"]) == set(theirs["headers"])
    for key in set(theirs["headers"]) - skip:
        assert ours["headers"][key] == theirs["headers"][key], key
    assert parse_expires(ours["headers"]["expires"]) == expires
    props_skip = {"reply_to", "delivery_tag", "expiration"}  # per connection / per message; ignored by Redis
    assert set(ours["properties"]) == set(theirs["properties"]) - {"expiration"}
    for key in set(theirs["properties"]) - props_skip:
        assert ours["properties"][key] == theirs["properties"][key], key


