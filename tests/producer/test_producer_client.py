"""producer.Client on fakeredis: validation at the caller, priority queues, deadlines, size limits,
submission markers, pipelined reads; the producer imports without torch."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from pathlib import Path

import fakeredis
import pytest

from producer.client import Client, pack_messages, prepare_request
from vela2.errors import InvalidRequest, LimitExceeded, ModelMismatch
from vela2.schemas import RowResult, Status, content_id, parse_row
from vela2.systemone import parse_request
from vela2.wire.keys import submitted_key
from vela2.wire.messages import decode_body
from vela2.wire.results import ResultStore, row_meta

ROOT = Path(__file__).resolve().parents[2]
ROW = {"task": "choice:boolq", "text": "The sky is green.", "questions": [{"options": ["yes", "no"]}]}
S1 = {"model": "vela2-demo", "input": "hi there", "tasks": [{"name": "t", "kind": "set", "options": ["a"]}]}
ONLINE, BACKFILL = "vela2.vela2-demo", "vela2.vela2-demo.backfill"


class CountingRedis(fakeredis.FakeRedis):
    commands: list[str] = []

    def execute_command(self, *args, **kwargs):
        CountingRedis.commands.append(str(args[0]).upper())
        return super().execute_command(*args, **kwargs)


@pytest.fixture
def redis():
    CountingRedis.commands = []
    r = CountingRedis()
    r.flushall()
    yield r
    r.flushall()


@pytest.fixture
def client(redis):
    return Client(model="vela2-demo", redis=redis)


def _queued(redis, queue: str) -> list[dict]:
    return [json.loads(x) for x in reversed(redis.lrange(queue, 0, -1))]  # oldest first


def _body(msg: dict):
    return decode_body(base64.b64decode(msg["body"]))


def test_a_bad_row_fails_at_the_caller_with_the_workers_message_and_nothing_is_queued(client, redis):
    bad = {**ROW, "questions": [{"options": ["yes"]}]}
    with pytest.raises(InvalidRequest, match=r"questions\[0\]: choice questions need at least 2 options; got 1"):
        client.submit(bad)
    with pytest.raises(InvalidRequest, match="task type must be one of"):
        client.submit({**ROW, "task": "pick:boolq"})
    with pytest.raises(InvalidRequest, match="a row must be a JSON object"):
        client.submit(["not", "a", "row"])
    assert redis.llen(ONLINE) == 0 and redis.llen(BACKFILL) == 0


def test_system_one_requests_are_validated_and_must_name_the_clients_model(client, redis):
    with pytest.raises(ModelMismatch, match="request names model 'other'; this client submits to 'vela2-demo'"):
        client.submit({**S1, "model": "other"})
    with pytest.raises(InvalidRequest, match="unknown kind 'guess'"):
        client.submit({**S1, "tasks": [{"name": "t", "kind": "guess", "options": ["a"]}]})
    assert redis.llen(ONLINE) == 0 and redis.keys("vela2.other*") == []
    rid = client.submit(S1)
    assert rid == content_id(S1) == parse_request(S1).id  # the id the worker will answer under
    (msg,) = _queued(redis, ONLINE)
    assert msg["headers"]["id"] == rid and _body(msg).requests[0]["id"] == rid


def test_priority_online_versus_backfill_queue(client, redis):
    assert client.submit({**ROW, "id": "now"}) == "now"
    assert client.submit({**ROW, "id": "later"}, backfill=True) == "later"
    assert [m["headers"]["id"] for m in _queued(redis, ONLINE)] == ["now"]
    assert [m["headers"]["id"] for m in _queued(redis, BACKFILL)] == ["later"]


def test_submit_many_is_all_or_nothing_and_names_the_bad_index(client, redis):
    rows = [{**ROW, "id": f"r-{i}"} for i in range(4)]
    rows[2] = {**ROW, "id": "r-2", "text": "   "}
    with pytest.raises(InvalidRequest, match=r"requests\[2\]: .*text is empty"):
        client.submit_many(rows)
    assert redis.llen(ONLINE) == 0


def test_pydantic_requests_are_accepted(client, redis):
    row = parse_row({**ROW, "id": "typed"})
    assert client.submit(row) == "typed"
    assert client.submit(parse_request(S1)) == content_id(S1)
    assert [m["headers"]["id"] for m in _queued(redis, ONLINE)] == ["typed", content_id(S1)]


def test_deadline_becomes_the_celery_expires_header(client, redis):
    t0 = datetime.now(UTC)
    client.submit({**ROW, "id": "d"}, deadline_s=30)
    client.submit({**ROW, "id": "n"})
    d, n = _queued(redis, ONLINE)
    expires = datetime.fromisoformat(d["headers"]["expires"])
    assert 29 <= (expires - t0).total_seconds() <= 31
    assert n["headers"]["expires"] is None


def test_a_request_over_the_message_limit_is_refused_at_the_caller(client, redis):
    # 2,000,000 characters (the text limit) of 4-byte UTF-8: a valid row, but an 8 MB message.
    huge = {**ROW, "id": "huge", "text": "\U0001f600" * 2_000_000}
    with pytest.raises(LimitExceeded, match=r"request 'huge': message body has 8,000,[\d,]+ bytes; limit 8,000,000"):
        client.submit(huge)
    assert redis.llen(ONLINE) == 0


def test_chunks_over_the_byte_limit_are_split_and_a_single_oversized_request_is_named():
    items = [prepare_request({**ROW, "id": f"r-{i}", "text": "x" * 400}, "m") for i in range(8)]
    one = len(base64.b64decode(json.loads(pack_messages(items[:1], "q", chunk_size=2)[0].payload)["body"]))
    msgs = pack_messages(items, "q", chunk_size=8, max_message_bytes=3 * one // 2)
    assert [rid for m in msgs for rid in m.request_ids] == [f"r-{i}" for i in range(8)]
    assert len(msgs) == 8  # each half was still too big, down to one row each
    with pytest.raises(LimitExceeded, match=r"request 'r-0': message body has [\d,]+ bytes; limit 100"):
        pack_messages(items[:1], "q", max_message_bytes=100)


def test_tracked_submissions_leave_a_short_lived_marker(redis):
    client = Client(model="vela2-demo", redis=redis, track_submitted=True, submitted_ttl_s=60)
    ids = client.submit_many([{**ROW, "id": "a"}, {**ROW, "id": "b"}], chunk_size=2)
    assert ids == ["a", "b"]
    assert client.is_submitted("a") and client.is_submitted("b") and not client.is_submitted("c")
    assert 0 < redis.ttl(submitted_key("a")) <= 60
    assert Client(model="vela2-demo", redis=redis).submit({**ROW, "id": "c"}) == "c"
    assert not client.is_submitted("c")  # untracked clients write no marker


def test_answers_many_reads_system_one_answers_with_one_mget(client, redis):
    store = ResultStore(redis)
    s1_answer = {"version": "1", "model": "vela2-demo", "id": "s", "status": "ok", "tasks": {}}
    row = RowResult(id="s", task="set:t", status=Status.ok, answers=[])
    store.store([("s", row_meta("s", row, s1_answer))])
    store.store([("r", row_meta("r", RowResult(id="r", task="choice:boolq", status=Status.ok, answers=[])))])
    CountingRedis.commands = []
    got = client.answers_many(["s", "r", "missing"], timeout_s=0.05)
    assert got["s"] == s1_answer and got["r"]["id"] == "r" and got["missing"] is None
    assert set(CountingRedis.commands) == {"MGET"}
    assert client.answer("s", timeout_s=1) == s1_answer


def test_validate_false_sends_a_bad_request_for_the_worker_to_answer(client, redis):
    bad = {**ROW, "id": "bad", "questions": [{"options": ["yes"]}]}
    assert client.submit(bad, validate=False) == "bad"
    other = {**S1, "model": "other"}
    assert client.submit_many([other], validate=False) == [content_id(other)]
    first, second = _queued(redis, ONLINE)  # the client's own queue: the worker answers model_mismatch
    assert _body(first).requests == [bad]
    assert _body(second).requests[0]["model"] == "other"
