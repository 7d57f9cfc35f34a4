"""Our Celery protocol v2 messages, built without celery: a chunk carries each row under its own id,
ids match what the library gives, refusals name the limit."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest

from vela2.api.schemas import content_id
from vela2.errors import InvalidRequest, LimitExceeded
from vela2.wire.keys import backfill_queue, is_chunk_id, online_queue, result_key
from vela2.wire.messages import build_message, decode_body, parse_expires, request_id

QUEUE = online_queue("vela2-demo")
ROW = {
    "id": "r-1",
    "task": "choice:boolq",
    "text": "The sky is green.",
    "questions": [{"question": "Is it?", "options": ["yes", "no"]}],
}


def test_a_chunk_carries_each_row_under_its_own_id():
    rows = [ROW, {**ROW, "id": "r-2"}, {k: v for k, v in ROW.items() if k != "id"}]
    msg = build_message(rows, backfill_queue("vela2-demo"), chunk=True)
    env = json.loads(msg.payload)
    assert is_chunk_id(msg.id) and env["headers"]["id"] == msg.id
    assert msg.request_ids == ("r-1", "r-2", content_id(rows[2]))
    assert "vela2_ids" not in env["headers"]  # the body alone says which ids a chunk may answer
    body = decode_body(base64.b64decode(env["body"]))
    assert body.chunk and [r["id"] for r in body.requests] == list(msg.request_ids)
    assert env["properties"]["delivery_info"]["routing_key"] == "vela2.vela2-demo.backfill"


def test_ids_match_what_the_library_gives_rows_and_system_one_requests():
    from vela2.api.schemas import parse_row
    from vela2.api.systemone import parse_request

    anon_row = {k: v for k, v in ROW.items() if k != "id"}
    assert request_id(anon_row) == parse_row(anon_row).id
    s1 = {"model": "vela2-demo", "input": "hello", "tasks": [{"name": "t", "kind": "choice", "options": ["a", "b"]}]}
    assert request_id(s1) == parse_request(s1).id


def test_refusals_name_the_limit():
    with pytest.raises(LimitExceeded, match="limit 100"):
        build_message([{**ROW, "text": "x " * 100}], QUEUE, max_message_bytes=100)
    with pytest.raises(InvalidRequest, match="chunk=True"):
        build_message([ROW, ROW], QUEUE)
    with pytest.raises(InvalidRequest, match="only 'chunk'"):
        decode_body(json.dumps([[ROW], {"x": 1}, {}]))
    with pytest.raises(InvalidRequest, match="ISO 8601"):
        parse_expires("tomorrow")


def test_keys():
    assert result_key("r-1") == "celery-task-meta-r-1"
    assert online_queue("m") == "vela2.m" and backfill_queue("m") == "vela2.m.backfill"
    assert parse_expires((datetime.now(UTC) + timedelta(seconds=5)).isoformat()) > datetime.now(UTC)
