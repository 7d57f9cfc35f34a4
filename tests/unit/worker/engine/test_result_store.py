"""Stored results: Celery's meta layout (nothing stored twice; the older layout still read), write-once
with PUBLISH, a TTL per kind (online, a bulk job's line), readers in one round trip."""

from __future__ import annotations

import json
import time

import fakeredis
import pytest
from celery import Celery

from vela2.api.schemas import RowResult, Status, error_result, expired_result
from vela2.errors import InvalidRequest
from vela2.wire.keys import job_key, result_key, submitted_key
from vela2.wire.results import (
    META_ROW_LUA,
    ResultStore,
    chunk_meta,
    encode_meta,
    exc_type_name,
    meta_answer,
    meta_row,
    parse_answer,
    parse_meta,
    read_answers,
    read_results,
    row_meta,
    split_state,
    state_keys,
    state_of,
)


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


def old_row_meta(task_id: str, res: RowResult, answer: dict | None = None, digest: str | None = None) -> dict:
    """The layout an older worker wrote (`vela2` on every result, `vela2_answer` beside a SystemOne
    SUCCESS too): results it stored stay readable for their TTL."""
    meta = row_meta(task_id, res, answer, digest)
    meta["vela2"] = res.to_json_dict()
    if answer is not None:
        meta["vela2_answer"] = answer
    if meta["status"] == "SUCCESS":
        meta["result"] = answer if answer is not None else res.to_json_dict()
    return meta


S1_ANSWER = {"id": "s1", "status": "ok", "tasks": {"intent": {"kind": "choice", "decision": "greet"}}}


def test_success_meta_is_celery_layout_with_the_row_result_once():
    meta = row_meta("r1", ok_result("r1"))
    assert set(meta) == {"status", "result", "traceback", "children", "date_done", "task_id"}
    assert meta["status"] == "SUCCESS" and meta["task_id"] == "r1" and meta["children"] == []
    assert meta["result"] == ok_result("r1").to_json_dict() == meta_row(meta) == meta_answer(meta)
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
    assert meta["status"] == "SUCCESS" and meta["result"]["status"] == "expired" and "vela2" not in meta
    assert meta_row(meta)["status"] == "expired"


def test_a_systemone_success_stores_the_answer_as_result_and_the_row_beside_it_once():
    res = ok_result("s1")
    meta = row_meta("s1", res, S1_ANSWER, digest="d")
    assert meta["result"] == S1_ANSWER and meta["vela2"] == res.to_json_dict() and "vela2_answer" not in meta
    assert meta["vela2_digest"] == "d"
    assert meta_row(meta) == res.to_json_dict() and meta_answer(meta) == S1_ANSWER
    backend = Celery(backend="cache+memory://").backend  # AsyncResult(id).get() is the answer, as before
    assert backend.meta_from_decoded(backend.decode_result(json.dumps(meta)))["result"] == S1_ANSWER
    failed = row_meta("s2", error_result("s2", None, InvalidRequest("bad")), {**S1_ANSWER, "status": "error"})
    assert failed["status"] == "FAILURE" and failed["result"]["exc_type"] == "InvalidRequest"
    assert failed["vela2"]["error"]["type"] == "invalid_request" and failed["vela2_answer"]["status"] == "error"
    assert meta_answer(failed) == {**S1_ANSWER, "status": "error"} and meta_row(failed) == failed["vela2"]


def test_a_short_success_is_smaller_than_before_and_holds_its_row_once():
    res = RowResult.model_validate({
        "id": "short-1", "task": "choice:sentiment", "status": "ok",
        "answers": [{"question": 0, "task": "choice:sentiment", "decision": "positive",
                     "probs": {"positive": 0.8731, "neutral": 0.0942, "negative": 0.0327}}],
        "timings": {"queue_ms": 1.25, "render_ms": 0.31, "model_ms": 4.07, "decode_ms": 0.12}})
    now = encode_meta(row_meta("short-1", res, digest="0" * 64))
    before = encode_meta(old_row_meta("short-1", res, digest="0" * 64))
    assert now.count(b"0.8731") == 1 and before.count(b"0.8731") == 2
    assert len(before) - len(now) == len(b',"vela2":') + len(encode_meta(res.to_json_dict()))  # the copy, saved
    assert json.loads(now)["result"] == res.to_json_dict()


@pytest.mark.parametrize("layout", ["now", "older"])
def test_every_reader_reads_both_layouts(redis, layout):
    make = row_meta if layout == "now" else old_row_meta
    bad = error_result("bad", "choice:boolq", InvalidRequest("text is empty"))
    metas = {"ok": make("ok", ok_result("ok")), "s1": make("s1", ok_result("s1"), S1_ANSWER),
             "bad": make("bad", bad), "gone": make("gone", expired_result("gone", None, "deadline passed"))}
    for rid, meta in metas.items():
        redis.set(result_key(rid), encode_meta(meta))
    redis.set(result_key("chunk-1"), encode_meta(chunk_meta("chunk-1", {"ok": 3})))
    rows = read_results(redis, [*metas, "chunk-1"])
    assert rows["ok"] == ok_result("ok") and rows["s1"] == ok_result("s1") and rows["chunk-1"] is None
    assert rows["bad"].error.type == "invalid_request" and rows["gone"].status == Status.expired
    answers = read_answers(redis, [*metas, "chunk-1"])
    assert answers["ok"] == ok_result("ok").to_json_dict() and answers["s1"] == S1_ANSWER
    assert answers["bad"]["error"]["message"] == "text is empty" and answers["chunk-1"] is None
    assert parse_meta(redis.get(result_key("s1"))) == ok_result("s1")
    assert parse_answer(redis.get(result_key("s1"))) == S1_ANSWER
    # a Lua reader (vela2 backfill's DROP_FAILED_SCRIPT): the same row
    status = META_ROW_LUA + """
local row = meta_row(cjson.decode(redis.call('GET', KEYS[1])))
if row then return row['status'] end
return 'none'
"""
    got = {rid: redis.eval(status, 1, result_key(rid)).decode() for rid in [*metas, "chunk-1"]}
    assert got == {"ok": "ok", "s1": "ok", "bad": "error", "gone": "expired", "chunk-1": "none"}
    # the store counts a job's line by the row's status (and model), read the same way
    store = ResultStore(redis)
    job = "batch_l"
    redis.hset(job_key(job), mapping={"id": job, "input": "reading", "total": 9})
    lines = [(f"{job}#{i}", make(f"{job}#{i}", r, a)) for i, (r, a) in
             enumerate([(ok_result("x"), None), (ok_result("y"), S1_ANSWER), (bad, None)])]
    assert store.store(lines, jobs=[job] * 3) == [True] * 3
    assert redis.hget(job_key(job), "ok") == b"2" and redis.hget(job_key(job), "error") == b"1"


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


def test_an_online_result_lives_the_online_ttl_a_job_lines_the_jobs_and_each_marker_outlives_its_result(redis):
    store = ResultStore(redis, ttl_s=3_000, online_ttl_s=100, expired_marker_s=500)
    for rid in ("online", "batch_k#0"):
        redis.set(submitted_key(rid), "vela2.m x", ex=86_400)
    items = [("online", row_meta("online", ok_result("online"))), ("batch_k#0", row_meta("batch_k#0", ok_result("l")))]
    assert store.store(items, jobs=[None, "batch_k"]) == [True, True]
    assert 0 < redis.ttl(result_key("online")) <= 100 and 2_900 < redis.ttl(result_key("batch_k#0")) <= 3_000
    assert 500 < redis.ttl(submitted_key("online")) <= 600 and 3_400 < redis.ttl(submitted_key("batch_k#0")) <= 3_500
    assert store.ttl_of(None) == 100 and store.ttl_of("batch_k") == 3_000
    assert ResultStore(redis, ttl_s=60, online_ttl_s=3_600).ttl_of(None) == 60  # never longer than the jobs'
    assert ResultStore(redis).ttl_of(None) == 3_600 and ResultStore(redis).ttl_of("j") == 86_400  # the defaults
    redis.delete(result_key("online"))  # the result expired: a reader finds the marker alone
    got = split_state(["online"], redis.mget(state_keys(["online"])))
    assert state_of(*got["online"]) == "expired"


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
