"""The wire package: what a producer builds is what a worker decodes (no Redis needed)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest

from vela2.errors import InvalidRequest, LimitExceeded
from vela2.schemas import content_id
from vela2.wire import keys
from vela2.wire.messages import build_message, decode_delivery, decode_envelope, header_ids, message_id

ROW = {"id": "r-1", "task": "choice:boolq", "text": "The sky is green.", "questions": [{"options": ["yes", "no"]}]}


def delivered(msg):
    env = decode_envelope(msg.payload)
    mid = message_id(env.headers)
    assert mid == msg.id
    return env, decode_delivery(mid, env.headers, env.body, env.content_type)


def test_a_single_request_round_trips_with_its_deadline():
    when = datetime.now(UTC) + timedelta(seconds=30)
    env, got = delivered(build_message([ROW], keys.online_queue("m"), expires=when))
    assert not got.chunk and got.requests == [("r-1", ROW)] and got.expires == when
    assert header_ids(env.headers) == [] and env.content_type == "application/json"


def test_a_chunk_answers_each_row_under_its_own_id_and_a_repeated_id_once():
    anon = {k: v for k, v in ROW.items() if k != "id"}
    rows = [ROW, anon, ROW]
    env, got = delivered(build_message(rows, keys.backfill_queue("m"), chunk=True))
    assert keys.is_chunk_id(got.message_id) and got.chunk
    assert [rid for rid, _ in got.requests] == ["r-1", content_id(anon)] and got.repeated == 1
    assert header_ids(env.headers) == ["r-1", content_id(anon), "r-1"]


def test_decoding_refuses_what_the_worker_must_not_run():
    msg = build_message([ROW], keys.online_queue("m"))
    env = decode_envelope(msg.payload)
    with pytest.raises(LimitExceeded, match="message has .* bytes; limit 10"):
        decode_delivery(msg.id, env.headers, env.body, max_message_bytes=10)
    with pytest.raises(InvalidRequest, match="content-type"):
        decode_delivery(msg.id, env.headers, env.body, "application/x-python-serialize")
    with pytest.raises(InvalidRequest, match="expires header"):
        decode_delivery(msg.id, {**env.headers, "expires": "soon"}, env.body)
    with pytest.raises(InvalidRequest, match="not a Celery message envelope"):
        decode_envelope(b"not json")
    bad = json.loads(msg.payload)
    bad["headers"] = ["a", "list"]
    with pytest.raises(InvalidRequest, match="headers must be an object"):
        decode_envelope(json.dumps(bad))
    bad["headers"] = {}
    bad["body"] = "!!not base64!!"
    with pytest.raises(InvalidRequest, match="not a Celery message envelope"):
        decode_envelope(json.dumps(bad))


def test_plain_bodies_decode_too():
    msg = json.loads(build_message([ROW], keys.online_queue("m")).payload)
    msg["body"] = base64.b64decode(msg["body"]).decode()
    msg["properties"]["body_encoding"] = "utf-8"
    env = decode_envelope(json.dumps(msg))
    assert decode_delivery("r-1", env.headers, env.body).requests == [("r-1", ROW)]


def test_keys_name_kombus_priority_lists():
    assert keys.priority_lists("q") == ["q", "q\x06\x163", "q\x06\x166", "q\x06\x169"]
    assert keys.queue_name("m", backfill=True) == keys.backfill_queue("m") == "vela2.m.backfill"
    assert keys.is_backfill_queue("vela2.m.backfill") and not keys.is_backfill_queue("vela2.m")
