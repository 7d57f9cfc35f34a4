"""producer.Client on fakeredis: where messages go, which ids come back, how results are read."""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import fakeredis
import pytest

from producer.client import Client
from vela2.api.schemas import RowResult, Status, content_id
from vela2.errors import ModelMismatch
from vela2.wire.keys import result_key, submitted_key
from vela2.wire.messages import decode_body
from vela2.wire.results import ResultStore, row_meta

ROOT = Path(__file__).resolve().parents[3]
ROW = {"task": "choice:boolq", "text": "The sky is green.", "questions": [{"options": ["yes", "no"]}]}


class CountingRedis(fakeredis.FakeRedis):
    commands: list[str] = []
    calls: list[tuple] = []  # whole commands, arguments included

    def execute_command(self, *args, **kwargs):
        CountingRedis.commands.append(str(args[0]).upper())
        CountingRedis.calls.append(args)
        return super().execute_command(*args, **kwargs)


@pytest.fixture
def redis():
    CountingRedis.commands = []
    CountingRedis.calls = []
    r = CountingRedis()
    yield r
    r.flushall()


@pytest.fixture
def client(redis):
    return Client(model="vela2-demo", redis=redis)


def _queued(redis, queue: str) -> list[dict]:
    return [json.loads(x) for x in reversed(redis.lrange(queue, 0, -1))]  # oldest first


def _ok(rid: str) -> dict:
    return row_meta(rid, RowResult(id=rid, task="choice:boolq", status=Status.ok, answers=[]))


def test_submit_routes_rows_backfill_and_system_one_requests(client, redis):
    assert client.submit({**ROW, "id": "r-1"}) == "r-1"
    assert client.submit({**ROW, "id": "r-2"}, backfill=True) == "r-2"
    s1 = {"model": "vela2-demo", "input": "hi", "tasks": [{"name": "t", "kind": "set", "options": ["a"]}]}
    s1_id = client.submit(s1)
    assert s1_id == content_id(s1)
    other = dict(s1, model="other-model")
    with pytest.raises(ModelMismatch, match="other-model"):  # refused at the caller, never enqueued
        client.submit(other)
    assert [m["headers"]["id"] for m in _queued(redis, "vela2.vela2-demo")] == ["r-1", s1_id]
    assert [m["headers"]["id"] for m in _queued(redis, "vela2.vela2-demo.backfill")] == ["r-2"]
    assert _queued(redis, "vela2.other-model") == []
    msg = _queued(redis, "vela2.vela2-demo")[1]
    body = decode_body(base64.b64decode(msg["body"]))
    assert body.requests[0]["id"] == s1_id  # the id travels explicitly


def test_submit_many_keeps_input_order_and_chunks_per_queue(client, redis):
    rows = [{**ROW, "id": f"r-{i}"} for i in range(5)] + [dict(ROW)]
    ids = client.submit_many(rows, backfill=True, chunk_size=2)
    assert ids == [f"r-{i}" for i in range(5)] + [content_id(ROW)]
    msgs = _queued(redis, "vela2.vela2-demo.backfill")
    assert len(msgs) == 3 and all(m["headers"]["id"].startswith("chunk-") for m in msgs)
    bodies = [decode_body(base64.b64decode(m["body"])) for m in msgs]
    assert all(b.chunk for b in bodies) and [r["id"] for b in bodies for r in b.requests] == ids


def test_results_many_reads_all_ids_with_one_mget_per_poll(client, redis):
    store = ResultStore(redis)
    ids = [f"r-{i}" for i in range(40)]
    store.store([(i, _ok(i)) for i in ids])
    CountingRedis.commands = []
    CountingRedis.calls = []
    got = client.results_many(ids, timeout_s=1)
    assert all(v is not None and v.id == k for k, v in got.items())
    assert CountingRedis.commands == ["MGET"]
    # the one MGET reads every result key and every submitted marker (expired vs not yet)
    assert list(CountingRedis.calls[0][1:]) == [result_key(i) for i in ids] + [submitted_key(i) for i in ids]


def test_results_many_returns_none_for_ids_without_a_result(client, redis):
    ResultStore(redis).store([("here", _ok("here"))])
    CountingRedis.commands = []
    t0 = time.monotonic()
    got = client.results_many(["here", "not-yet"], timeout_s=0.3)
    assert got["here"] is not None and got["not-yet"] is None
    assert time.monotonic() - t0 >= 0.3  # waited its whole timeout for the missing one
    assert set(CountingRedis.commands) == {"MGET"}


def test_result_waits_on_the_published_value(client, redis):
    store = ResultStore(redis)
    timer = threading.Timer(0.2, lambda: store.store([("later", _ok("later"))]))
    timer.start()
    try:
        assert client.result("later", timeout_s=5).id == "later"
    finally:
        timer.join()
    with pytest.raises(TimeoutError, match="no result for 'never'"):
        client.result("never", timeout_s=0.2)


def test_the_exceptions_a_caller_catches_come_from_producer():
    import producer
    from vela2 import errors

    for name in ("InvalidRequest", "LimitExceeded", "ModelMismatch", "IdConflict", "ResultExpired", "Vela2Error"):
        assert getattr(producer, name) is getattr(errors, name)
    assert issubclass(producer.LimitExceeded, ValueError) and issubclass(producer.ModelMismatch, ValueError)


@pytest.mark.parametrize("deadline_s", [0, -1, float("nan"), 30 * 86_400 + 1])
def test_a_deadline_out_of_bounds_is_a_value_error_at_submit_and_nothing_is_queued(redis, deadline_s):
    import producer

    client = Client(redis=redis, model="m")
    with pytest.raises(ValueError, match="deadline_s is .*it must be > 0 and at most 2,592,000 s"):
        client.submit({**ROW, "id": "d-1"}, deadline_s=deadline_s)
    with pytest.raises(producer.LimitExceeded):
        client.submit_many([{**ROW, "id": "d-2"}], deadline_s=deadline_s)
    assert redis.keys("*") == []


def test_the_word_limit_is_checked_at_the_client_with_the_workers_message(redis):
    from vela2.config import LIMITS

    client = Client(redis=redis, model="m")
    over = " ".join(["w"] * (LIMITS.max_text_words + 1))
    with pytest.raises(ValueError, match=r"^text has 65,537 words; limit 65,536$"):
        client.submit({**ROW, "id": "w-1", "text": over})
    s1 = {"model": "m", "id": "w-2", "input": {"a": over[:70_000], "b": over[:70_000]},
          "tasks": [{"name": "t", "kind": "choice", "options": ["x", "y"]}]}
    with pytest.raises(ValueError, match=r"^text has 70,00\d words; limit 65,536$"):  # both fields' words, headers too
        client.submit(s1)
    assert redis.keys("*") == []
    at_limit = " ".join(["w"] * LIMITS.max_text_words)  # exactly the limit: queued
    assert client.submit({**ROW, "id": "w-3", "text": at_limit}) == "w-3"
