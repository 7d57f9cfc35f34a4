"""The wire package: what a producer builds is what a worker decodes, and what is not a message of
ours is refused by name (no Redis needed)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vela2.api.schemas import content_id
from vela2.errors import InvalidRequest, LimitExceeded
from vela2.wire import keys
from vela2.wire.messages import (
    MAX_JSON_DEPTH,
    REFUSED_HEADER,
    Refused,
    answerable_ids,
    build_message,
    decode_delivery,
    decode_envelope,
    message_id,
    refusal,
    refused_ids,
    triage,
)

ROW = {"id": "r-1", "task": "choice:boolq", "text": "The sky is green.", "questions": [{"options": ["yes", "no"]}]}
Q = "vela2.m"


def delivered(msg):
    env = decode_envelope(msg.payload)
    mid = message_id(env.headers)
    assert mid == msg.id
    return env, decode_delivery(mid, env.headers, env.body, env.content_type)


def test_a_single_request_round_trips_with_its_deadline():
    when = datetime.now(UTC) + timedelta(seconds=30)
    env, got = delivered(build_message([ROW], keys.online_queue("m"), expires=when))
    assert not got.chunk and got.requests == [("r-1", ROW)] and got.expires == when
    assert env.content_type == "application/json" and "vela2_ids" not in env.headers


def test_a_chunk_answers_each_row_under_its_own_id_and_a_repeated_id_once():
    anon = {k: v for k, v in ROW.items() if k != "id"}
    env, got = delivered(build_message([ROW, anon, ROW], keys.backfill_queue("m"), chunk=True))
    assert keys.is_chunk_id(got.message_id) and got.chunk
    assert [rid for rid, _ in got.requests] == ["r-1", content_id(anon)] and got.repeated == 1


def test_ids_must_be_keys_at_the_producer_and_at_intake():
    for bad in ("\ud800", "x" * 257):
        with pytest.raises(InvalidRequest, match="request id"):
            build_message([{**ROW, "id": bad}], Q)
    chunk = json.dumps([[[ROW, {**ROW, "id": "\ud800"}, {**ROW, "id": "y" * 300}]], {"chunk": True}, {}])
    got = decode_delivery("chunk-1", {}, chunk)
    assert [rid for rid, _ in got.requests] == ["r-1"]
    assert [why for _, why in got.unusable] == ["request id is not valid Unicode (surrogates not allowed at index 0)",
                                                "request id has 300 characters; limit 256"]


def test_a_request_whose_id_differs_from_its_message_is_answered_under_both():
    body = json.dumps([[{**ROW, "id": "victim"}], {}, {}])
    with pytest.raises(InvalidRequest, match="differs from its message id"):
        decode_delivery("mine", {}, body)
    assert answerable_ids("mine", body) == ["mine", "victim"]


def test_a_request_without_an_id_is_answered_under_its_message_id_with_a_warning(caplog):
    """Plain Celery without task_id = the row's id: the task id becomes the storage key, said out loud."""
    row = {k: v for k, v in ROW.items() if k != "id"}
    body = json.dumps([[row], {}, {}])
    with caplog.at_level("WARNING", logger="vela2.wire.messages"):
        got = decode_delivery("celery-uuid-1", {}, body)
    assert got.requests == [("celery-uuid-1", row)]
    assert f"not under the request's content id {content_id(row)}" in caplog.text
    assert "celery-uuid-1" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="vela2.wire.messages"):  # the id given, or the content id: silent
        decode_delivery(ROW["id"], {}, json.dumps([[ROW], {}, {}]))
        decode_delivery(content_id(row), {}, body)
    assert caplog.text == ""


def test_an_undecodable_chunk_never_answers_ids_outside_its_body():
    assert answerable_ids("chunk-9", "not json") == ["chunk-9"]
    oversized = json.dumps([[[ROW, {**ROW, "id": "r-2"}]], {"chunk": True}, {}])
    with pytest.raises(LimitExceeded):
        decode_delivery("chunk-9", {"vela2_ids": ["someone-else"]}, oversized, max_message_bytes=10)
    assert answerable_ids("chunk-9", oversized) == ["chunk-9", "r-1", "r-2"]


def test_decoding_is_bounded_and_refuses_by_name():
    msg = build_message([ROW], Q)
    env = decode_envelope(msg.payload)
    with pytest.raises(LimitExceeded, match="message has .* bytes; limit 10"):
        decode_delivery(msg.id, env.headers, env.body, max_message_bytes=10)
    with pytest.raises(InvalidRequest, match="content-type"):
        decode_delivery(msg.id, env.headers, env.body, "application/x-python-serialize")
    with pytest.raises(InvalidRequest, match="expires header"):
        decode_delivery(msg.id, {**env.headers, "expires": "soon"}, env.body)
    for depth in (MAX_JSON_DEPTH + 1, 100_000):
        deep = "[" * depth + "]" * depth
        with pytest.raises(InvalidRequest, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
            decode_delivery("r-1", {}, f"[[{deep}],{{}},{{}}]")
    with pytest.raises(Refused):
        decode_delivery("r-1", {REFUSED_HEADER: "why"}, env.body)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2 * MAX_JSON_DEPTH), st.integers(0, 80), st.booleans())
def test_the_depth_limit_is_exact_with_or_without_the_bracket_count_shortcut(depth, siblings, as_bytes):
    from vela2.wire.messages import decode_json

    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    value.extend({} for _ in range(siblings))  # brackets that add to the count, not to the depth
    text = json.dumps(value)
    data = text.encode() if as_bytes else text
    real = max(depth, 2 if siblings else 1)
    if real > MAX_JSON_DEPTH:
        with pytest.raises(InvalidRequest, match="nested deeper"):
            decode_json(data, "x")
    else:
        assert decode_json(data, "x") == value


def _item(**change):
    env = json.loads(build_message([ROW], Q).payload)
    for path, value in change.items():
        where = env
        *parents, last = path.split("__")
        for p in parents:
            where = where[p]
        where[last] = value
    return json.dumps(env)


@pytest.mark.parametrize(("item", "reason", "ids"), [
    (b"not json at all", "not valid JSON", []),
    (b"[1, 2]", "must be a JSON object", []),
    (("[" * 100_000 + "]" * 100_000).encode(), "nested deeper", []),
    (_item(headers=["a", "list"]), "headers must be an object", ["r-1"]),  # the body still names its request
    (_item(properties__body_encoding="rot13"), "body_encoding 'rot13'", ["r-1"]),
    (_item(headers__task="celery.backend_cleanup"), "'celery.backend_cleanup' is not served here", ["r-1"]),
    (_item(headers__id="\ud800"), "message id is not valid Unicode", []),
    (_item(body="!!not base64!!"), "not valid base64", ["r-1"]),
    (_item(body=12), "body must be a string", ["r-1"]),
    (_item(**{"content-type": "application/x-python-serialize"}), "content-type", ["r-1"]),
    (_item(headers__compression="application/x-gzip"), "compressed", ["r-1"]),
])
def test_triage_wraps_what_is_no_message_of_ours(item, reason, ids):
    t = triage(item, Q, "tag-1")
    assert t.refused is not None and reason in t.refused
    env = t.envelope
    assert env["headers"]["task"] == keys.TASK_NAME and env["headers"][REFUSED_HEADER] == t.refused
    assert refused_ids(env["headers"]) == ids
    assert env["properties"]["delivery_info"]["routing_key"] == Q and env["properties"]["delivery_tag"] == "tag-1"
    raw = item if isinstance(item, bytes) else item.encode("utf-8", "surrogatepass")
    assert base64.b64decode(env["body"]) == raw  # the item itself travels on, for the dead-letter list


def test_triage_passes_our_messages_and_pins_the_routing_key():
    t = triage(_item(properties__delivery_info={"exchange": "x", "routing_key": "elsewhere"},
                     headers__vela2_refused="forged"), Q, "tag-1")
    assert t.refused is None and t.envelope["properties"]["delivery_info"] == {"exchange": "", "routing_key": Q}
    assert t.envelope["properties"]["delivery_tag"] == "tag-1"  # the take's tag, never the item's
    assert REFUSED_HEADER not in t.envelope["headers"]


def test_protocol_1_messages_are_refused_under_their_id():
    body = base64.b64encode(json.dumps({"task": "vela2.score", "id": "p1", "args": [ROW]}).encode()).decode()
    item = json.dumps({"body": body, "properties": {"delivery_tag": "t", "body_encoding": "base64"}})
    t = triage(item, Q, "tag-1")
    assert "protocol 1" in (t.refused or "") and refused_ids(t.envelope["headers"]) == ["p1"]


def _delivery(**headers: Any) -> tuple[dict[str, Any], bytes]:
    """(headers, raw body) of a message of ours as RabbitMQ delivers it, the headers changed."""
    env = json.loads(build_message([ROW], Q).payload)
    return {**env["headers"], **headers}, base64.b64decode(env["body"])


@pytest.mark.parametrize(("headers", "body", "content_type", "reason", "ids"), [
    (*_delivery(task="celery.backend_cleanup"), "application/json", "'celery.backend_cleanup' is not served", ["r-1"]),
    ({}, b"not json", "text/plain", "a message with no task is not served", []),
    ({}, json.dumps({"task": "vela2.score", "id": "p1", "args": [ROW]}).encode(), None, "protocol 1", ["p1"]),
    ({k: v for k, v in _delivery()[0].items() if k != "id"}, b"[]", "application/json", "message id is missing", []),
    (*_delivery(id=7), "application/json", "message id must be a string; got int", []),
    (*_delivery(compression="application/x-gzip"), "application/json", "compressed", ["r-1"]),
    (*_delivery(), "application/x-python-serialize", "content-type", ["r-1"]),
    (["a", "list"], _delivery()[1], "application/json", "headers must be an object", ["r-1"]),
])
def test_refusal_names_what_is_wrong_with_a_delivery_and_the_ids_found(headers, body, content_type, reason, ids):
    found = refusal(headers, body, content_type)
    assert found is not None and reason in found.reason and found.ids == ids


def test_refusal_passes_our_messages_whatever_their_body():
    headers, body = _delivery()
    assert refusal(headers, body, "application/json") is None
    assert refusal(headers, b"{not json", None) is None  # the engine answers a bad body under the message id


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                              lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                              max_leaves=30).map(lambda v: json.dumps(v).encode())))
def test_triage_never_raises(item):
    t = triage(item, Q, "tag-1")
    assert isinstance(t.envelope, dict) and t.envelope["properties"]["delivery_tag"] == "tag-1"


def test_keys_name_kombus_priority_lists():
    assert keys.priority_lists("q") == ["q", "q\x06\x163", "q\x06\x166", "q\x06\x169"]
    assert keys.queue_name("m", backfill=True) == keys.backfill_queue("m") == "vela2.m.backfill"
    assert keys.is_backfill_queue("vela2.m.backfill") and not keys.is_backfill_queue("vela2.m")
