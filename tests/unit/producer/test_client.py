"""producer.Client on fakeredis: validation at the caller, priority queues, deadlines, size limits,
submission markers and the four states (answered / pending / expired / unknown), terminal outcomes
for expired answers, pipelined reads; the producer imports without torch."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import fakeredis
import pytest

from producer.client import Client, pack_messages, prepare_request
from vela2.api.schemas import RowResult, Status, content_id, parse_row
from vela2.api.systemone import parse_request
from vela2.errors import IdConflict, InvalidRequest, LimitExceeded, ModelMismatch, QuotaExceeded, ResultExpired
from vela2.wire import keys
from vela2.wire.keys import result_key, submitted_key
from vela2.wire.messages import decode_body
from vela2.wire.results import ANSWERED, ResultStore, row_meta

ROOT = Path(__file__).resolve().parents[3]
ROW = {"task": "choice:boolq", "text": "The sky is green.", "questions": [{"options": ["yes", "no"]}]}
S1 = {"model": "vela2-demo", "input": "hi there", "tasks": [{"name": "t", "kind": "set", "options": ["a"]}]}
ONLINE, BACKFILL = "vela2.vela2-demo", "vela2.vela2-demo.backfill"


class CountingRedis(fakeredis.FakeRedis):
    commands: list[str] = []
    calls: list[tuple] = []  # the whole commands, arguments included

    def execute_command(self, *args, **kwargs):
        CountingRedis.commands.append(str(args[0]).upper())
        CountingRedis.calls.append(args)
        return super().execute_command(*args, **kwargs)


def _reset_counts() -> None:
    CountingRedis.commands = []
    CountingRedis.calls = []


def _wait_gone(redis, key: str, timeout_s: float = 15.0) -> None:
    """Poll until `key` has expired (its TTL runs in real time), failing after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while redis.exists(key):
        assert time.monotonic() < deadline, f"{key} did not expire within {timeout_s} s"
        time.sleep(0.02)


@pytest.fixture
def redis():
    _reset_counts()
    r = CountingRedis()
    r.flushall()
    yield r
    r.flushall()


@pytest.fixture
def client(redis):
    return Client(model="vela2-demo", redis=redis)


def _queued(redis, queue: str, tenant: str | None = None) -> list[dict]:
    """The messages waiting on `queue` (a tenant's own list of it for `tenant`), oldest first."""
    name = keys.tenant_list(queue, tenant) if tenant else queue
    return [json.loads(x) for x in reversed(redis.lrange(name, 0, -1))]


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


@pytest.mark.parametrize("deadline_s", [0, -1, float("nan"), float("inf"), 1e12])
def test_a_deadline_out_of_bounds_is_refused_and_nothing_is_queued(client, redis, deadline_s):
    with pytest.raises(LimitExceeded, match=r"deadline_s is .*; it must be > 0 and at most 2,592,000 s"):
        client.submit({**ROW, "id": "d"}, deadline_s=deadline_s)
    with pytest.raises(LimitExceeded):
        client.submit_many([{**ROW, "id": "e"}], deadline_s=deadline_s)
    assert redis.llen(ONLINE) == 0


def test_a_request_over_the_message_limit_is_refused_at_the_caller(client, redis):
    # 2,000,000 characters (the text limit) of 4-byte UTF-8 letters (31,250 words of 64: under the word
    # limit, which the client checks too): a valid row, but an 8 MB message.
    huge = {**ROW, "id": "huge", "text": "\U0001d400" * 2_000_000}
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
    client = Client(model="vela2-demo", redis=redis, submitted_ttl_s=60)
    assert client.track_submitted  # the default
    ids = client.submit_many([{**ROW, "id": "a"}, {**ROW, "id": "b"}], chunk_size=2)
    assert ids == ["a", "b"]
    assert client.is_submitted("a") and client.is_submitted("b") and not client.is_submitted("c")
    from vela2.wire.messages import request_digest

    # the marker holds the queue and the request's content digest (an id reused for other content conflicts)
    assert redis.get(submitted_key("a")) == f"{ONLINE} {request_digest({**ROW, 'id': 'a'})}".encode()
    assert 0 < redis.ttl(submitted_key("a")) <= 60
    assert Client(model="vela2-demo", redis=redis, track_submitted=False).submit({**ROW, "id": "c"}) == "c"
    assert not client.is_submitted("c") and client.status("c") == "unknown"  # untracked: no marker
    ResultStore(redis).store([("a", _ok("a"))])
    assert client.status("a") == "answered" and not client.is_submitted("a")  # never "pending" once answered
    assert redis.get(submitted_key("a")) == ANSWERED.encode() and client.status("b") == "pending"


def test_submit_many_claims_every_id_in_one_round_trip_then_pushes_in_one(redis):
    round_trips: list[list[str]] = []  # the commands of each executed pipeline
    real = redis.pipeline

    def recording_pipeline(*a, **kw):
        pipe = real(*a, **kw)
        execute = pipe.execute

        def recorded_execute(*ea, **ekw):
            round_trips.append([str(args[0]).upper() for args, _ in pipe.command_stack])
            return execute(*ea, **ekw)

        pipe.execute = recorded_execute
        return pipe

    client = Client(model="vela2-demo", redis=redis)
    client.submit_many([{**ROW, "id": f"warm-{i}"} for i in range(2)], backfill=True)  # Redis has run (and
    client.submit({**ROW, "id": "warm"}, backfill=True)  # cached) each script once
    redis.pipeline = recording_pipeline
    _reset_counts()
    client.submit_many([{**ROW, "id": f"p-{i}"} for i in range(4)], chunk_size=2, backfill=True)
    assert CountingRedis.commands == []  # nothing beside the two pipelines
    # the claims (conflict check + submitted marker of every id), then the messages (one PUSH_SCRIPT)
    assert round_trips == [["EVALSHA"] * 4, ["EVALSHA"]]  # by SHA1, never SCRIPT EXISTS first
    assert len(_queued(redis, BACKFILL)) == 3 + 2
    assert {redis.get(submitted_key(f"p-{i}")).split()[0] for i in range(4)} == {BACKFILL.encode()}

    # one request: its claim and push in one script call, one round trip (CLAIM_PUSH)
    round_trips.clear()
    _reset_counts()
    client.submit({**ROW, "id": "one"}, backfill=True)
    assert round_trips == [["EVALSHA"]] and CountingRedis.commands == []
    assert len(_queued(redis, BACKFILL)) == 6 and redis.get(submitted_key("one")).split()[0] == BACKFILL.encode()
    client.submit({**ROW, "id": "one"}, backfill=True)  # pending, same content: queued again (the worker skips it)
    assert len(_queued(redis, BACKFILL)) == 7
    with pytest.raises(IdConflict, match="'one' already names a request with other content"):
        client.submit({**ROW, "id": "one", "text": "other"}, backfill=True)
    assert len(_queued(redis, BACKFILL)) == 7
    ResultStore(redis).store([("one", _ok("one"))])
    client.submit({**ROW, "id": "one"}, backfill=True)  # answered: nothing queued
    assert len(_queued(redis, BACKFILL)) == 7
    with pytest.raises(QuotaExceeded, match="queued"):  # the list's limit: nothing queued, the marker taken back
        client.submit({**ROW, "id": "two"}, backfill=True, max_queued=7)
    assert len(_queued(redis, BACKFILL)) == 7 and redis.get(submitted_key("two")) is None


def _ok(rid: str) -> dict:
    return row_meta(rid, RowResult(id=rid, task="choice:boolq", status=Status.ok, answers=[]))


def test_an_expired_answer_is_a_terminal_outcome_never_an_endless_wait(client, redis):
    ids = client.submit_many([{**ROW, "id": i} for i in ("gone", "kept", "waiting")])
    ResultStore(redis, ttl_s=1).store([("gone", _ok("gone"))])  # a result TTL (result_expires) of 1 s
    ResultStore(redis).store([("kept", _ok("kept"))])
    assert client.result("gone", timeout_s=5).status == "ok"  # while it lives
    _wait_gone(redis, result_key("gone"))
    assert redis.get(submitted_key("gone")) == ANSWERED.encode()
    assert [client.status(i) for i in ids] == ["expired", "answered", "pending"]
    assert not client.is_submitted("gone")

    with pytest.raises(ResultExpired, match=r"'gone' expired from the result store") as info:
        client.result("gone", timeout_s=None)  # would wait forever without the marker
    assert info.value.code == "result_expired" and isinstance(info.value, LookupError)
    with pytest.raises(ResultExpired, match="'gone'"):
        client.answer("gone", timeout_s=3600)

    # Many: an expired id is an error result of type result_expired (never None = "not yet"),
    # read in the same single MGET (result keys, then marker keys) as the others.
    _reset_counts()
    got = client.results_many(ids, timeout_s=0.1)
    assert got["gone"].status == "error" and got["gone"].error.type == "result_expired"
    assert got["gone"].id == "gone" and "expired from the result store" in got["gone"].error.message
    assert got["kept"].status == "ok" and got["waiting"] is None
    first = CountingRedis.calls[0]
    assert first[0].upper() == "MGET" and list(first[1:]) == [result_key(i) for i in ids] + [
        submitted_key(i) for i in ids
    ]
    assert set(CountingRedis.commands) == {"MGET"}
    answers = client.answers_many(["gone", "kept"], timeout_s=None)  # terminal: returns at once
    assert answers["gone"] == {
        "id": "gone",
        "status": "error",
        "error": {"type": "result_expired", "message": got["gone"].error.message},
    }
    assert answers["kept"]["status"] == "ok"


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


def test_resubmitting_an_answered_id_keeps_it_answered_then_expired(client, redis):
    client.submit({**ROW, "id": "again"})
    ResultStore(redis, ttl_s=1).store([("again", _ok("again"))])
    client.submit({**ROW, "id": "again"})  # a retry after the answer: the worker will skip it
    assert client.status("again") == "answered"
    _wait_gone(redis, result_key("again"))
    assert client.status("again") == "expired"  # never "pending" about a request whose answer came and went
    client.submit({**ROW, "id": "again"})  # submitted anew after expiry: pending again
    assert client.status("again") == "pending"


def _answered(redis, rid: str, obj: dict) -> None:
    """Store an answer for `obj` under `rid` as a worker does (its meta carries the digest)."""
    from vela2.wire.messages import request_digest

    row = RowResult(id=rid, task=obj["task"], status=Status.ok, answers=[])
    ResultStore(redis).store([(rid, row_meta(rid, row, digest=request_digest({**obj, "id": rid})))])


def test_an_id_reused_for_other_content_is_a_conflict_never_the_old_answer(client, redis):
    from vela2.errors import IdConflict

    other = {**ROW, "text": "The sky is blue."}
    client.submit({**ROW, "id": "x"})  # pending
    with pytest.raises(IdConflict, match=r"request id 'x' already names a request with other content") as e:
        client.submit({**other, "id": "x"})
    assert e.value.ids == ["x"] and redis.llen(ONLINE) == 1
    client.submit({**ROW, "id": "x"})  # the same content again: fine (a retry)
    assert redis.llen(ONLINE) == 2

    _answered(redis, "y", ROW)
    assert client.submit({**ROW, "id": "y"}) == "y" and redis.llen(ONLINE) == 2  # answered: not queued again
    with pytest.raises(IdConflict):
        client.submit({**other, "id": "y"})
    with pytest.raises(IdConflict, match=r"request id 'y' already names"):  # all or nothing
        client.submit_many([{**ROW, "id": "fresh"}, {**other, "id": "y"}])
    assert redis.llen(ONLINE) == 2 and client.status("fresh") == "unknown"  # its marker taken back

    # an answer stored without a digest (an older worker) is returned as before, never a conflict
    ResultStore(redis).store([("old", row_meta("old", RowResult(id="old", task="choice:boolq", status=Status.ok,
                                                                answers=[])))])
    assert client.submit({**other, "id": "old"}) == "old" and redis.llen(ONLINE) == 2


def test_a_client_that_does_not_track_still_refuses_a_conflict(redis):
    from vela2.errors import IdConflict

    client = Client(model="vela2-demo", redis=redis, track_submitted=False)
    _answered(redis, "z", ROW)
    with pytest.raises(IdConflict):
        client.submit({**ROW, "text": "other", "id": "z"})
    assert redis.get(submitted_key("z")) is None and redis.llen(ONLINE) == 0


def test_tenants_ids_never_meet(redis):
    """Two tenants' equal ids are two requests: queued and stored as <tenant>/<id>, read back under
    the caller's id, never another tenant's answer, never a conflict between them."""
    from vela2.errors import IdConflict

    acme = Client(model="vela2-demo", redis=redis, tenant="acme")
    beta = Client(model="vela2-demo", redis=redis, tenant="beta")
    plain = Client(model="vela2-demo", redis=redis)
    assert acme.submit({**ROW, "id": "x"}) == "x"
    assert beta.submit({**ROW, "text": "other content", "id": "x"}) == "x"  # no conflict across tenants
    queued = _queued(redis, ONLINE, "acme") + _queued(redis, ONLINE, "beta")  # each on its tenant's list
    assert _queued(redis, ONLINE) == []
    assert sorted(m["headers"]["id"] for m in queued) == ["acme/x", "beta/x"]
    assert sorted(_body(m).requests[0]["id"] for m in queued) == ["acme/x", "beta/x"]

    _answered(redis, "acme/x", {**ROW, "id": "acme/x"})
    got = acme.result("x", timeout_s=1)
    assert got.id == "x" and got.status == Status.ok
    assert acme.answer("x", timeout_s=1)["id"] == "x"
    assert acme.lookup("x")[0] == "answered" and acme.lookup("x")[1]["id"] == "x"
    assert acme.results_many(["x"], timeout_s=1)["x"].id == "x"
    assert beta.status("x") == "pending" and beta.lookup("x")[1] is None  # never acme's answer
    assert plain.status("x") == "unknown"
    with pytest.raises(IdConflict, match=r"request id 'x' already") as e:  # within a tenant: still a key
        acme.submit({**ROW, "text": "changed", "id": "x"})
    assert e.value.ids == ["x"]  # the caller's ids, not the wire's


def test_a_tenants_id_limit_and_names(redis):
    acme = Client(model="vela2-demo", redis=redis, tenant="acme")
    with pytest.raises(LimitExceeded, match=r"under tenant 'acme' the limit is 251"):
        acme.submit({**ROW, "id": "i" * 252})
    assert acme.submit({**ROW, "id": "i" * 251}) == "i" * 251
    for bad in ("", "a/b", "-x", "a" * 65, "naïve"):
        with pytest.raises(InvalidRequest, match="a tenant name is 1-64 characters"):
            Client(model="vela2-demo", redis=redis, tenant=bad)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True, None])
def test_wait_replicas_out_of_range_is_refused_with_its_value(redis, bad):
    with pytest.raises(InvalidRequest, match="wait_replicas must be a whole number, 0 or more; got"):
        Client(model="vela2-demo", redis=redis, wait_replicas=bad)


def test_wait_replicas_with_a_rabbitmq_broker_is_refused_before_connecting(redis):
    # nothing listens on this port: the refusal comes before any connection is tried
    with pytest.raises(InvalidRequest, match="wait_replicas 1 counts replicas of a Redis broker; the broker is Rabbit"):
        Client(model="vela2-demo", redis=redis, broker_url="amqp://guest:guest@127.0.0.1:1//", wait_replicas=1)
    assert Client(model="vela2-demo", redis=redis, wait_replicas=0).wait_replicas == 0


def _dead_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing answers there


def test_a_push_that_fails_takes_its_marker_back(redis):
    """The broker (another Redis) refuses the push: the caller gets the connection error and the id
    is free again (not "pending" for a day, not a conflict for other content); a later submit works."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    down = Client(model="vela2-demo", redis=redis, broker_url=f"redis://127.0.0.1:{_dead_port()}/0")
    with pytest.raises(RedisConnectionError):
        down.submit({**ROW, "id": "p"})
    with pytest.raises(RedisConnectionError):
        down.submit_many([{**ROW, "id": "q1"}, {**ROW, "text": "other", "id": "q2"}])
    assert [down.status(i) for i in ("p", "q1", "q2")] == ["unknown"] * 3
    assert [redis.get(submitted_key(i)) for i in ("p", "q1", "q2")] == [None] * 3
    up = Client(model="vela2-demo", redis=redis)
    assert up.submit({**ROW, "text": "new content", "id": "p"}) == "p"  # no IdConflict with what never queued
    assert up.status("p") == "pending" and redis.llen(ONLINE) == 1


def test_a_push_that_may_have_queued_keeps_its_marker(redis):
    """Found by review: a timeout while reading the push's reply (the server ran it) took the marker
    back, so the queued id read "unknown" and took other content: two requests under one id."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from producer.brokers import NotReplicated
    from producer.submitting import nothing_sent
    from vela2.errors import IdConflict

    class LateBroker(fakeredis.FakeRedis):  # runs the push, then the reply never comes
        def pipeline(self, *a, **kw):
            pipe = super().pipeline(*a, **kw)
            run = pipe.execute

            def execute(*ea, **ekw):
                run(*ea, **ekw)
                raise RedisTimeoutError("Timeout reading from socket")

            pipe.execute = execute
            return pipe

    late = Client(model="vela2-demo", redis=redis, broker=LateBroker(server=redis.connection_pool.connection_kwargs
                                                                       .get("server")))
    with pytest.raises(RedisTimeoutError):
        late.submit({**ROW, "id": "t"})
    assert late.status("t") == "pending"
    with pytest.raises(IdConflict):
        Client(model="vela2-demo", redis=redis).submit({**ROW, "text": "other", "id": "t"})
    assert not nothing_sent(NotReplicated("1 of 2 replicas"))
    assert not nothing_sent(RedisConnectionError("Connection closed by server."))
    assert nothing_sent(RedisConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."))
    try:  # kombu / py-amqp: the refused socket under its own error
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as inner:
            raise OSError("[Errno 111] Connection refused") from inner
    except OSError as wrapped:
        assert nothing_sent(wrapped)


def test_a_system_one_input_over_the_character_limit_is_refused_at_submit(client, redis):
    """The worker's own limit and message, before anything is queued: free text, and fields whose
    headers take the rendered text past the limit."""
    from vela2.config import LIMITS

    n = LIMITS.max_text_chars
    with pytest.raises(LimitExceeded, match=f"input renders to {n + 1:,} characters.*limit {n:,}"):
        client.submit({**S1, "input": "x" * (n + 1)})
    half = "y" * (n // 2)
    with pytest.raises(LimitExceeded, match="field headers included"):
        client.submit({**S1, "input": {"a": half, "b": half}})
    assert redis.llen(ONLINE) == 0
    assert client.submit({**S1, "input": "x" * n})  # at the limit: queued


def test_reads_and_waits_refuse_what_no_request_can_have(client):
    """Found by review: a lone-surrogate id raised a raw UnicodeEncodeError, a NaN timeout a bare
    ValueError (or a wait for ever), a TTL of 0 a Redis error at the first submit. Infinity still
    waits for ever and a negative timeout still looks once (`vela2 http --timeout-s` passes them)."""
    for call in (lambda: client.status("\ud800"), lambda: client.cancel(["\ud800"]),
                 lambda: client.results_many(["ok", "x" * 300], timeout_s=0)):
        with pytest.raises(InvalidRequest, match=r"^id (is not valid Unicode|has 300 characters)"):
            call()
    for bad in (float("nan"), "5", True):
        with pytest.raises(InvalidRequest, match="timeout_s must be a number of seconds or None"):
            client.result("a", timeout_s=bad)
    for no_wait in (0, -1, float("-inf")):  # one look, as before
        with pytest.raises(TimeoutError):
            client.result("a", timeout_s=no_wait)
    from producer.waiting import check_timeout

    assert check_timeout(float("inf")) is None  # wait for ever, as None
    for ttl in (0, -5, 1.5, None):
        with pytest.raises(InvalidRequest, match="submitted_ttl_s must be a whole number"):
            Client(model="vela2-demo", redis=client.redis, submitted_ttl_s=ttl)
