"""Broker and result store apart, on fakeredis: the client pushes to the broker and claims in the
result store."""

from __future__ import annotations

import fakeredis

from producer.client import Client
from vela2.wire.keys import queue_name, submitted_key

MODEL = "vela2-demo"
ROW = {"task": "choice:boolq", "text": "The sky is green.", "questions": [{"options": ["yes", "no"]}]}


def test_the_client_pushes_to_the_broker_and_claims_in_the_result_store():
    store = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    broker = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    client = Client(model=MODEL, redis=store, broker=broker)
    rid = client.submit({**ROW, "id": "apart-1"})
    assert broker.llen(queue_name(MODEL)) == 1 and not store.exists(queue_name(MODEL))
    assert store.exists(submitted_key(rid)) and not broker.exists(submitted_key(rid))


