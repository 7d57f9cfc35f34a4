"""Stored results: Celery's meta layout, write-once with PUBLISH, readers in one round trip."""

from __future__ import annotations

import json
import time

import fakeredis
import pytest
from celery import Celery

from vela2.api.schemas import RowResult, Status, error_result, expired_result
from vela2.errors import InvalidRequest
from vela2.wire.keys import result_key
from vela2.wire.results import ResultStore, chunk_meta, exc_type_name, read_answers, read_results, row_meta


class CountingRedis(fakeredis.FakeRedis):
    """Counts round trips (commands sent outside a pipeline, and pipeline executions)."""

    round_trips = 0

    def execute_command(self, *args, **kwargs):
        CountingRedis.round_trips += 1
        return super().execute_command(*args, **kwargs)

    def pipeline(self, *args, **kwargs):
        pipe = super().pipeline(*args, **kwargs)
        execute = pipe.execute

        def counted(*a, **kw):
            CountingRedis.round_trips += 1
            return execute(*a, **kw)

        pipe.execute = counted
        return pipe


@pytest.fixture
def redis():
    r = CountingRedis()
    yield r
    r.flushall()


def ok_result(rid: str) -> RowResult:
    return RowResult.model_validate(
        {
            "id": rid,
            "task": "choice:boolq",
            "status": "ok",
            "answers": [{"question": 0, "task": "choice:boolq", "probs": {"yes": 0.9, "no": 0.1}, "decision": "yes"}],
            "timings": {"queue_ms": 1.0, "render_ms": 0.1, "model_ms": 2.0, "decode_ms": 0.1},
        }
    )


def test_success_meta_is_celery_layout_with_the_row_result():
    meta = row_meta("r1", ok_result("r1"))
    assert set(meta) == {"status", "result", "traceback", "children", "date_done", "task_id", "vela2"}
    assert meta["status"] == "SUCCESS" and meta["task_id"] == "r1" and meta["children"] == []
    assert meta["result"] == meta["vela2"] == ok_result("r1").to_json_dict()
    backend = Celery(backend="cache+memory://").backend
    decoded = backend.meta_from_decoded(backend.decode_result(json.dumps(meta)))
    assert decoded["status"] == "SUCCESS" and decoded["result"]["answers"][0]["decision"] == "yes"


def test_failure_meta_raises_a_readable_exception_in_celery():
    res = error_result("r2", "choice:boolq", InvalidRequest("text is empty"))
    meta = row_meta("r2", res)
    assert meta["status"] == "FAILURE"
    assert meta["result"] == {"exc_type": "InvalidRequest", "exc_message": ["text is empty"], "exc_module": "builtins"}
    assert meta["vela2"]["error"] == {"type": "invalid_request", "message": "text is empty"}
    exc = Celery(backend="cache+memory://").backend.exception_to_python(meta["result"])
    assert type(exc).__name__ == "InvalidRequest" and str(exc) == "text is empty"


def test_expired_is_a_success_carrying_the_expired_row():
    meta = row_meta("r3", expired_result("r3", None, "deadline passed"))
    assert meta["status"] == "SUCCESS" and meta["vela2"]["status"] == "expired"


@pytest.mark.parametrize(
    ("code", "name"),
    [
        ("invalid_request", "InvalidRequest"),
        ("limit_exceeded", "LimitExceeded"),
        ("model_error", "ModelError"),
        ("OutOfMemoryError", "OutOfMemoryError"),
        ("some_new_code", "SomeNewCode"),
    ],
)
def test_exc_type_names(code, name):
    assert exc_type_name(code) == name


def test_store_is_write_once_and_publishes_only_the_first_value(redis):
    store = ResultStore(redis, ttl_s=100)
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(result_key("r1"))
    first = row_meta("r1", ok_result("r1"))
    second = row_meta("r1", error_result("r1", None, RuntimeError("late duplicate")))
    assert store.store([("r1", first)]) == [True]
    assert store.store([("r1", second)]) == [False]
    assert json.loads(redis.get(result_key("r1")))["status"] == "SUCCESS"
    assert 0 < redis.ttl(result_key("r1")) <= 100
    published = _messages(pubsub)
    assert len(published) == 1  # the refused write announced nothing
    assert json.loads(published[0]["data"])["status"] == "SUCCESS"
    pubsub.close()


def _messages(pubsub, wait_s: float = 0.3) -> list[dict]:
    """Every published message that arrives within wait_s (subscribe confirmations skipped)."""
    out, deadline = [], time.monotonic() + wait_s
    while time.monotonic() < deadline:
        msg = pubsub.get_message(timeout=0.05)
        if msg is not None and msg.get("type") == "message":
            out.append(msg)
    return out


def test_existing_and_readers_take_one_round_trip_each(redis):
    store = ResultStore(redis)
    ids = [f"r{i}" for i in range(50)]
    store.store([(i, row_meta(i, ok_result(i))) for i in ids[:30]])
    store.store([("chunk-1", chunk_meta("chunk-1", {"ok": 30}))])
    store.existing(["warm"])  # a client's first call of a script also loads it
    before = CountingRedis.round_trips
    assert store.existing(ids) == set(ids[:30])
    got = read_results(redis, ids)
    answers = read_answers(redis, ids)
    assert CountingRedis.round_trips - before <= 3  # one EXISTS script call, one MGET, one MGET
    assert all(got[i].status == Status.ok for i in ids[:30]) and all(got[i] is None for i in ids[30:])
    assert answers["r0"]["answers"][0]["decision"] == "yes"
    assert read_results(redis, ["chunk-1"]) == {"chunk-1": None}  # a summary is no row result


def test_the_submitted_marker_becomes_an_answered_tombstone_that_outlives_the_result(redis):
    from vela2.wire.keys import submitted_key
    from vela2.wire.results import ANSWERED, marker_says_answered

    redis.set(submitted_key("tracked"), "vela2.m", ex=86_400)
    store = ResultStore(redis, ttl_s=60, expired_marker_s=600)
    assert store.store([("tracked", row_meta("tracked", ok_result("tracked"))),
                        ("untracked", row_meta("untracked", ok_result("untracked")))]) == [True, True]
    assert marker_says_answered(redis.get(submitted_key("tracked")))
    assert redis.get(submitted_key("tracked")) == ANSWERED.encode()
    assert 600 < redis.ttl(submitted_key("tracked")) <= 660 and redis.ttl(result_key("tracked")) <= 60
    assert redis.get(submitted_key("untracked")) is None  # no marker is created for an untracked request
    redis.set(submitted_key("tracked"), "vela2.m")  # a second answer neither writes nor touches the marker
    assert store.store([("tracked", row_meta("tracked", ok_result("tracked")))]) == [False]
    assert not marker_says_answered(redis.get(submitted_key("tracked")))


def test_one_item_that_cannot_be_stored_never_stops_the_others(redis):
    store = ResultStore(redis)
    out = store.store([("a", row_meta("a", ok_result("a"))), ("\ud800", row_meta("x", ok_result("x"))),
                       ("b", row_meta("b", ok_result("b")))])
    assert out[0] is True and isinstance(out[1], UnicodeEncodeError) and out[2] is True
    assert set(read_results(redis, ["a", "b"])) == {"a", "b"} and all(read_results(redis, ["a", "b"]).values())


def test_an_error_quoting_a_lone_surrogate_is_still_stored_as_valid_json(redis):
    res = error_result("e", None, InvalidRequest("text 'a\ud800b' is not valid Unicode"))
    assert ResultStore(redis).store([("e", row_meta("e", res))]) == [True]
    raw = redis.get(result_key("e"))
    assert b"\\ud800" in raw  # escaped: the stored value is UTF-8 JSON Redis and every reader can take
    got = read_results(redis, ["e"])["e"]
    assert got.error.type == "invalid_request" and "a\ud800b" in got.error.message


def test_many_results_go_in_one_call_and_one_refused_value_is_found_item_by_item(redis):
    import redis as redis_lib

    store = ResultStore(redis)
    store.store([("warm", row_meta("warm", ok_result("warm")))])
    before = CountingRedis.round_trips
    assert store.store([(f"m{i}", row_meta(f"m{i}", ok_result(f"m{i}"))) for i in range(600)]) == [True] * 600
    assert CountingRedis.round_trips - before == 1  # 512 + 88 results: two script calls, one pipeline
    real = store._store_many

    def refuses_big(keys, args, client):
        if any(len(str(v)) > 4000 for v in args[4:]):  # as Redis refuses a value over proto-max-bulk-len
            return client.eval("return redis.error_reply('string exceeds maximum allowed size')", 0)
        return real(keys=keys, args=args, client=client)

    store._store_many = refuses_big  # type: ignore[method-assign]
    big = row_meta("big", ok_result("big"))
    big["pad"] = "x" * 5000
    out = store.store([("s1", row_meta("s1", ok_result("s1"))), ("big", big), ("m0", row_meta("m0", ok_result("m0")))])
    # item by item: s1 written, big refused alone (its error, for the engine to store a storage_error
    # in its place), m0 was there
    assert out[0] is True and out[2] is False
    assert isinstance(out[1], redis_lib.exceptions.ResponseError) and "maximum allowed size" in str(out[1])
    assert read_results(redis, ["s1"])["s1"].status == Status.ok
