"""The HTTP route for real: `python -m producer.http.app` (uvicorn) on a free loopback port, talked to with
httpx, answered by a real worker on the demo checkpoint (or by the fake worker where a test needs
control of the timing), against a real redis-server."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from producer.answers import http_status as status_code
from vela2.api.schemas import ErrorInfo, RowResult, Status
from vela2.wire.fleet import queue_depths
from vela2.wire.keys import online_queue, result_key, tenant_list
from vela2.wire.results import ResultStore, row_meta

pytestmark = pytest.mark.integration

MODEL = "vela2-demo"
REQUEST = {
    "model": MODEL,
    "id": "http-1",
    "input": {
        "user": "Hi, I am Carol Diaz, my email is carol@initech.com. Where is my refund?",
        "assistant": "Sorry Carol, the refund for order 4471 was sent on Monday.",
    },
    "tasks": [
        {"name": "intent", "kind": "choice", "question": "What does the user want?", "options": ["refund", "other"]},
        {"name": "quality", "kind": "score", "options": ["1", "2", "3", "4", "5"]},
        {"name": "pii", "kind": "span", "labels": ["person", "email"], "fields": ["user"]},
        {"name": "topic", "kind": "classify", "labels": ["finance", "support"]},
    ],
}


def test_round_trip_with_a_real_worker(redis_url, real_worker, http_server):
    real_worker(redis_url)
    base = http_server(redis_url)
    with httpx.Client(base_url=base, timeout=60) as http:
        r = http.post("/v1/system_one", json=REQUEST, params={"wait_s": 30})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["id"] == "http-1" and answer["status"] == "ok" and answer["model"] == MODEL
        assert list(answer["tasks"]) == ["intent", "quality", "pii", "topic"]
        assert abs(sum(answer["tasks"]["intent"]["probs"].values()) - 1) < 1e-6
        user = REQUEST["input"]["user"]
        for span in answer["tasks"]["pii"]["spans"]:
            assert span["field"] == "user" and user[span["start"] : span["end"]] == span["text"]
        assert set(answer["timings"]) >= {"queue_ms", "model_ms"}

        assert http.get("/v1/results/http-1").json() == answer
        again = http.post("/v1/system_one", json=REQUEST)  # an answered id is not queued again
        assert again.status_code == 200 and again.json() == answer

        # Not waiting: 202 with where to look, then the answer there.
        late = http.post("/v1/system_one", json={**REQUEST, "id": "http-2"}, params={"wait_s": 0})
        assert late.status_code == 202
        assert late.json() == {"id": "http-2", "status": "pending", "result_url": f"{base}/v1/results/http-2"}
        assert late.headers["location"] == f"{base}/v1/results/http-2"
        for _ in range(600):
            got = http.get("/v1/results/http-2")
            if got.status_code != 202:
                break
            time.sleep(0.01)
        assert got.status_code == 200 and got.json()["id"] == "http-2" and got.json()["status"] == "ok"

        # An id is an idempotency key: other content under an answered id is 409, never its answer
        changed = {**REQUEST, "input": {**REQUEST["input"], "user": "Please cancel my order."}}
        r = http.post("/v1/system_one", json=changed)
        assert r.status_code == 409 and r.json()["error"]["type"] == "id_conflict", r.text
        assert r.json()["id"] == "http-1"
        assert "already names a request with other content" in r.json()["error"]["message"]
        assert http.get("/v1/results/http-1").json() == answer  # unchanged
        fresh = http.post("/v1/system_one", json={**changed, "id": "http-3"}, params={"wait_s": 30})
        assert fresh.status_code == 200 and fresh.json()["tasks"] != answer["tasks"]

        health = http.get("/healthz")
        assert health.status_code == 200
        assert health.json() == {
            "status": "ok",
            "model": MODEL,
            "redis": "ok",
            "queue_depth": {"online": 0, "backfill": 0},
        }


def test_refusals_are_4xx_with_clear_messages_and_nothing_is_queued(redis_url, redis_server, http_server):
    base = http_server(redis_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        r = http.post("/v1/system_one", json={**REQUEST, "model": "vela2-9b"})
        assert r.status_code == 400
        assert r.json()["error"] == {
            "type": "model_mismatch",
            "message": "request names model 'vela2-9b'; this route serves 'vela2-demo'",
            "param": None,
            "code": "model_mismatch",
        }
        assert r.json()["id"] == "http-1" and r.json()["status"] == "error"

        bad_kind = {**REQUEST, "tasks": [{"name": "x", "kind": "guess", "options": ["a", "b"]}]}
        r = http.post("/v1/system_one", json=bad_kind)
        assert r.status_code == 422 and r.json()["error"]["type"] == "invalid_request"
        assert "unknown kind 'guess'" in r.json()["error"]["message"]

        bad_field = {**REQUEST, "tasks": [{"name": "p", "kind": "span", "labels": ["person"], "fields": ["email"]}]}
        r = http.post("/v1/system_one", json=bad_field)
        assert r.status_code == 422
        assert "field 'email' is not in input" in r.json()["error"]["message"]

        too_many = {**REQUEST, "tasks": [{"name": f"t{i}", "kind": "set", "options": ["a"]} for i in range(33)]}
        r = http.post("/v1/system_one", json=too_many)
        assert r.status_code == 422 and r.json()["error"]["type"] == "limit_exceeded"
        assert "33 tasks given; limit 32" in r.json()["error"]["message"]

        r = http.post("/v1/system_one", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("request body is not valid JSON")

        for depth in (100_000, 980):  # found by review: a RecursionError made a plain-text 500
            r = http.post("/v1/system_one", content=b"[" * depth + b"]" * depth)
            assert r.status_code in (400, 422) and r.json()["error"]["type"] == "invalid_request", r.text
        deep = {**REQUEST, "input": {"a": "x"}, "tasks": [{"name": "t", "kind": "set", "options": [[[["a"]]]]}]}
        r = http.post("/v1/system_one", json=deep)
        assert r.status_code == 422 and r.json()["error"]["type"] == "invalid_request"

        r = http.post("/v1/system_one", content=b" " * 8_000_001)
        assert r.status_code == 413 and r.json()["error"]["type"] == "limit_exceeded"
        assert r.json()["error"]["message"] == "request body has 8,000,001 bytes; limit 8,000,000"

        def chunked():  # no Content-Length: the limit is found while reading, and reading stops there
            for _ in range(200):
                yield b" " * 65_536

        r = http.post("/v1/system_one", content=chunked())
        assert r.status_code == 413 and r.json()["error"]["type"] == "limit_exceeded"
        assert r.json()["error"]["message"].startswith("request body has over 8,000,000 bytes (read ")

        r = http.post("/v1/system_one", json=REQUEST, params={"wait_s": 9999})
        assert r.status_code == 422 and "wait_s" in r.json()["error"]["message"]

        for deadline in ("1e12", "inf", "nan", "0", "-1"):  # every numeric parameter is bounded: 422, never 500
            r = http.post("/v1/system_one", json=REQUEST, params={"deadline_s": deadline})
            assert r.status_code == 422, (deadline, r.text)
            assert r.json()["error"]["type"] == "invalid_request" and "deadline_s" in r.json()["error"]["message"]

        r = http.get("/v1/results/never-submitted")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found", r.text
        assert "never-submitted" in r.json()["error"]["message"] and r.json()["id"] == "never-submitted"

    client = redis_server.client()
    try:
        assert client.llen(online_queue(MODEL)) == 0 and client.keys("vela2.*") == []
    finally:
        client.close()


def test_pending_expired_and_worker_failures_map_to_status_codes(redis_url, redis_server, http_server, fake_worker):
    worker = fake_worker()
    worker.pause()
    base = http_server(redis_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        r = http.post("/v1/system_one", json={**REQUEST, "id": "exp"}, params={"wait_s": 0.2, "deadline_s": 0.05})
        assert r.status_code == 202  # no worker took it yet
        assert http.get("/v1/results/exp").status_code == 202  # pending, not unknown
        worker.resume()
        for _ in range(600):
            r = http.get("/v1/results/exp")
            if r.status_code != 202:
                break
            time.sleep(0.01)
        # the caller's own deadline passed: 410 (never a 5xx), the stored answer in the error envelope
        assert r.status_code == 410 and r.json()["status"] == "expired", r.text
        assert r.json()["error"]["type"] == r.json()["error"]["code"] == "expired"
        assert "new id" in r.json()["error"]["hint"]

    # What the worker stored decides the code: a model failure is 500, a refused request 422.
    store = ResultStore(redis_server.client())
    for rid, code in (("boom", "model_error"), ("words", "limit_exceeded")):
        res = RowResult(id=rid, status=Status.error, error=ErrorInfo(type=code, message="m"))
        answer = {"version": "1", "model": MODEL, "id": rid, "status": "error", "error": {"type": code, "message": "m"}}
        store.store([(rid, row_meta(rid, res, answer))])
    with httpx.Client(base_url=base, timeout=30) as http:
        assert http.get("/v1/results/boom").status_code == 500
        assert http.get("/v1/results/words").status_code == 422
    store.redis.close()
    assert status_code({"status": "ok"}) == 200
    assert status_code({"status": "error", "error": {"type": "model_mismatch"}}) == 400


def test_an_expired_answer_is_410_gone_never_pending(redis_url, redis_server, http_server):
    base = http_server(redis_url)
    r = redis_server.client()
    store = ResultStore(r, ttl_s=1)  # result_expires of 1 s
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            req = {**REQUEST, "id": "gone"}
            assert http.post("/v1/system_one", json=req, params={"wait_s": 0}).status_code == 202
            assert http.get("/v1/results/gone").status_code == 202  # pending (no worker)
            answer = {"version": "1", "model": MODEL, "id": "gone", "status": "ok", "tasks": {}}
            res = RowResult(id="gone", task="set:intent", status=Status.ok, answers=[])
            assert store.store([("gone", row_meta("gone", res, answer))]) == [True]
            got = http.get("/v1/results/gone")
            assert got.status_code == 200 and got.json() == answer
            deadline = time.monotonic() + 15
            while r.exists(result_key("gone")):  # the result TTL runs out
                assert time.monotonic() < deadline, "the result did not expire"
                time.sleep(0.02)
            got = http.get("/v1/results/gone")
            assert got.status_code == 410, got.text
            body = got.json()
            assert body["id"] == "gone" and body["model"] == MODEL and body["status"] == "error"
            assert body["error"]["type"] == "result_expired"
            assert "'gone' expired from the result store" in body["error"]["message"]
            assert http.get("/v1/results/never-seen").status_code == 404  # unknown stays 404

            # POSTing it again scores it anew: queued again, pending again (the idempotency key only
            # holds while an answer is stored).
            assert http.post("/v1/system_one", json=req, params={"wait_s": 0}).status_code == 202
            assert http.get("/v1/results/gone").status_code == 202
        assert r.llen(online_queue(MODEL)) == 2
    finally:
        r.close()


def test_redis_down_is_503(http_server):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    base = http_server(dead)
    with httpx.Client(base_url=base, timeout=30) as http:
        health = http.get("/healthz")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        r = http.post("/v1/system_one", json=REQUEST)
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable"


def test_openapi_describes_every_route_and_the_systemone_schemas(redis_url, http_server):
    base = http_server(redis_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        raw = http.get("/openapi.json")
        spec = raw.json()
        # no page that loads scripts from a CDN: the document alone, which names no remote asset
        assert http.get("/docs").status_code == 404 and http.get("/redoc").status_code == 404
        assert "cdn" not in raw.text.lower() and "<script" not in raw.text
    assert set(spec["paths"]) == {"/v1/system_one", "/v1/results/{request_id}", "/v1/results", "/healthz", "/readyz",
                                  "/v1/batches", "/v1/batches/{job_id}", "/v1/batches/{job_id}/output",
                                  "/v1/batches/{job_id}/cancel", "/v1/files", "/v1/files/{file_id}",
                                  "/v1/files/{file_id}/content"}
    post = spec["paths"]["/v1/system_one"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SystemOneRequest"
    }
    assert {"200", "202", "400", "410", "413", "422", "503"} <= set(post["responses"])
    assert "504" not in post["responses"]  # a request's own deadline passing is a 410, no server error
    get = spec["paths"]["/v1/results/{request_id}"]["get"]
    assert {"200", "202", "404", "410", "500", "503"} <= set(get["responses"]) and "504" not in get["responses"]
    assert "result_expired" in get["responses"]["410"]["description"]
    schemas = spec["components"]["schemas"]
    assert {"SystemOneRequest", "SystemOneTask", "SystemOneAnswer", "TaskAnswer", "Pending", "Batch"} <= set(schemas)
    refs = set()

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.add(node["$ref"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)
    assert refs and all(r.startswith("#/components/schemas/") and r.split("/")[-1] in schemas for r in refs)
    assert json.dumps(spec)  # plain JSON


def test_api_keys_let_in_their_tenants_only_for_their_models(redis_url, redis_server, http_server, tmp_path):
    """A real uvicorn process with a keys file: no key or an unknown one 401 (WWW-Authenticate),
    a key for other models 403, a good one in; /healthz and the OpenAPI document stay open."""
    from producer.auth import new_key

    key_a, a = new_key("acme")
    key_b, b = new_key("beta", ["vela2-9b"])
    keys = tmp_path / "keys.jsonl"
    keys.write_text(a.line() + "\n" + b.line() + "\n")
    base = http_server(redis_url, "--api-keys-file", str(keys))
    with httpx.Client(base_url=base, timeout=30) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {key_a}"}):
            r = http.post("/v1/system_one", json=REQUEST, params={"wait_s": 0}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized", r.text
            assert r.headers["www-authenticate"] == "Bearer"
            assert http.get("/v1/results/http-1", headers=headers).status_code == 401
        beta = {"Authorization": f"Bearer {key_b}"}
        r = http.post("/v1/system_one", json=REQUEST, params={"wait_s": 0}, headers=beta)
        assert r.status_code == 403 and r.json()["error"]["type"] == "forbidden"
        assert "may not use model 'vela2-demo'" in r.json()["error"]["message"]
        client = redis_server.client()
        try:
            waiting = lambda: queue_depths(client, [online_queue(MODEL)])[online_queue(MODEL)]  # noqa: E731
            assert waiting() == 0  # nothing refused was queued
            good = {"Authorization": f"Bearer {key_a}"}
            r = http.post("/v1/system_one", json=REQUEST, params={"wait_s": 0}, headers=good)
            assert r.status_code == 202 and waiting() == 1
            assert client.llen(tenant_list(online_queue(MODEL), "acme")) == 1  # on acme's own list
        finally:
            client.close()
        assert http.get("/v1/results/http-1", headers=good).status_code == 202
        assert http.get("/healthz").status_code == 200 and http.get("/openapi.json").status_code == 200


@pytest.mark.parametrize(("args", "why"), [
    ([], "no API keys: give --api-keys-file F"),
    (["--no-auth", "--host", "0.0.0.0"], "--no-auth serves only on loopback"),
    (["--no-auth", "--broker", "amqp://guest:guest@127.0.0.1:1//", "--wait-replicas", "1"],
     "wait_replicas 1 counts replicas of a Redis broker; the broker is RabbitMQ"),
])
def test_the_route_refuses_to_start_open_by_accident(redis_url, args, why):
    import subprocess
    import sys

    from stack.harness import child_env

    cmd = [sys.executable, "-m", "producer.http.app", "--redis", redis_url, "--port", "1", "--model", MODEL, *args]
    done = subprocess.run(cmd, env={k: v for k, v in child_env().items() if not k.startswith("VELA2_API_KEYS")},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and why in done.stderr, done.stderr


def _concurrent_posts(base: str, n: int) -> list[httpx.Response]:
    import asyncio

    async def main() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as http:
            return await asyncio.gather(*(
                http.post("/v1/system_one", json={**REQUEST, "id": f"c-{i}"}, params={"wait_s": 60})
                for i in range(n)))

    return asyncio.run(main())


def test_500_concurrent_requests_are_all_answered_while_redis_is_up(redis_url, http_server, fake_worker):
    """One route process, 500 requests at once: every one answered (the Redis connections are a
    bounded pool that requests wait for), none told Redis is unreachable."""
    fake_worker()
    base = http_server(redis_url)
    responses = _concurrent_posts(base, 500)
    codes = sorted({r.status_code for r in responses})
    assert codes == [200], (codes, [r.text for r in responses if r.status_code != 200][:3])
    assert sorted(r.json()["id"] for r in responses) == sorted(f"c-{i}" for i in range(500))


def test_a_full_pool_is_429_with_retry_after_never_503(redis_url, http_server, fake_worker):
    """With one Redis connection and almost no wait, a burst is throttled, clearly, and what got in
    is answered."""
    fake_worker()
    base = http_server(redis_url, "--redis-connections", "1", "--redis-wait-s", "0.001")
    responses = _concurrent_posts(base, 200)
    codes = {r.status_code for r in responses}
    assert codes <= {200, 429} and 429 in codes, codes
    busy = next(r for r in responses if r.status_code == 429)
    assert busy.headers["retry-after"] == "1" and busy.json()["error"]["type"] == "busy"
    assert "Redis connections stayed busy" in busy.json()["error"]["message"]


def test_a_body_that_does_not_arrive_in_time_is_408(redis_url, http_server):
    """A slow client (headers, then 10 of 100 announced bytes) is answered 408 after the body
    timeout, not held open."""
    import socket

    base = http_server(redis_url, "--body-timeout-s", "1")
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /v1/system_one HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"model\": ")
        t0 = time.monotonic()
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(65536)
            assert chunk, "closed without an answer"
            reply += chunk
        waited = time.monotonic() - t0
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert 0.9 <= waited < 20


def test_readyz_follows_the_workers_heartbeats(redis_url, redis_server, http_server, real_worker):
    """/readyz is 503 no_worker until a real worker of the model beats, 200 while it runs, 503
    again once it stopped (its heartbeat removed); /healthz is 200 throughout (Redis is up)."""
    base = http_server(redis_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        r = http.get("/readyz")
        assert r.status_code == 503 and r.json() == {"status": "no_worker", "model": MODEL, "workers": 0,
                                                     "redis": "ok"}
        assert http.get("/healthz").status_code == 200
        worker = real_worker(redis_url)
        deadline = time.monotonic() + 30
        while (r := http.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.05)
        assert r.json()["status"] == "ready" and r.json()["workers"] == 1
        assert worker.terminate() == 0
        assert http.get("/readyz").status_code == 503 and http.get("/healthz").status_code == 200


def test_each_tenant_has_its_own_ids(redis_url, redis_server, http_server, fake_worker, tmp_path):
    """Two API keys of two tenants POST the same id with other content: no conflict, each gets its
    own answer under that id, and neither can read, pre-empt or overwrite the other's."""
    from producer.auth import new_key

    fake_worker()
    key_a, a = new_key("acme")
    key_b, b = new_key("beta")
    keys = tmp_path / "keys.jsonl"
    keys.write_text(a.line() + "\n" + b.line() + "\n")
    base = http_server(redis_url, "--api-keys-file", str(keys))
    acme, beta = {"Authorization": f"Bearer {key_a}"}, {"Authorization": f"Bearer {key_b}"}
    mine = {**REQUEST, "id": "t-1", "tasks": REQUEST["tasks"][:1]}
    theirs = {**REQUEST, "id": "t-1", "tasks": REQUEST["tasks"][1:2]}
    with httpx.Client(base_url=base, timeout=30) as http:
        ra = http.post("/v1/system_one", json=mine, params={"wait_s": 20}, headers=acme)
        rb = http.post("/v1/system_one", json=theirs, params={"wait_s": 20}, headers=beta)
        assert ra.status_code == rb.status_code == 200, (ra.text, rb.text)
        assert ra.json()["id"] == rb.json()["id"] == "t-1"
        assert list(ra.json()["tasks"]) == ["intent"] and list(rb.json()["tasks"]) == ["quality"]
        assert http.get("/v1/results/t-1", headers=acme).json() == ra.json()
        assert http.get("/v1/results/t-1", headers=beta).json() == rb.json()
        # within a tenant an id is still an idempotency key
        assert http.post("/v1/system_one", json=theirs, headers=acme).status_code == 409
    client = redis_server.client()
    try:
        assert client.exists(result_key("acme/t-1")) and client.exists(result_key("beta/t-1"))
        assert not client.exists(result_key("t-1"))
    finally:
        client.close()


def test_a_connection_whose_headers_do_not_arrive_is_closed(redis_url, http_server):
    """A slowloris (a request line and half its headers, then nothing) is closed after the headers
    timeout; so is one that stalls in the headers of its second request; a whole request is served."""
    import socket

    base = http_server(redis_url, "--headers-timeout-s", "1")
    port = int(base.rsplit(":", 1)[1])

    def closed_after(sock: socket.socket) -> float:
        t0 = time.monotonic()
        while sock.recv(65536):  # what a served request sent first, then b"" once closed
            pass
        return time.monotonic() - t0

    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        assert 0.9 <= closed_after(sock) < 20
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # a whole request: answered
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHo")  # the next one stalls
        assert closed_after(sock) < 20


def test_a_pending_request_of_any_id_gets_a_result_url_that_reads_its_answer(redis_url, http_server, fake_worker):
    """Found by schemathesis: an id a header cannot carry (latin-1) made the 202 a 500; and an id
    holding "/" had a result_url that matched no route. Found by review: an id holding a line break
    matched no route, and one ending in one read the answer of the id before it ("k\n" -> "k");
    "." and ".." had URLs that clients resolve away."""
    worker = fake_worker()
    worker.pause()
    ids = ["\u00fc\u00f1 \U0001f600 \"x\"", "tenant-like/id", "a%2Fb", "k", "k\n", "k\r\n", "nl\nx", ".", "..",
           "a/..", "./b"]
    with httpx.Client(base_url=http_server(redis_url), timeout=30) as http:
        urls = {}
        for rid in ids:
            r = http.post("/v1/system_one", json={**REQUEST, "id": rid}, params={"wait_s": 0})
            assert r.status_code == 202 and r.headers["location"] == r.json()["result_url"]
            assert r.headers["location"].isascii()
            urls[rid] = r.headers["location"]
            assert http.get(urls[rid]).status_code == 202
        worker.resume()
        worker.run_until_empty()
        for rid, url in urls.items():
            got = http.get(url)
            assert got.status_code == 200 and got.json()["id"] == rid


def test_the_route_queues_on_rabbitmq_when_given_an_amqp_broker(redis_url, amqp_url, rabbitmq_vhost, http_server):
    base = http_server(redis_url, "--broker", amqp_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        late = http.post("/v1/system_one", json={**REQUEST, "id": "http-amqp-1"}, params={"wait_s": 0})
        assert late.status_code == 202  # no worker: queued (confirmed by RabbitMQ), pending in the result store
        assert http.get("/v1/results/http-amqp-1").status_code == 202
    assert rabbitmq_vhost.ready(online_queue(MODEL)) == 1


def test_a_tenants_request_rate_quota_refuses_it_alone(redis_url, redis_server, http_server, fake_worker, tmp_path):
    """acme may send 5 SystemOne requests a second (quotas.requests_per_s in the keys file): a burst of
    20 gets 429 quota_exceeded naming the quota, the limit and the usage, with Retry-After, and the
    refused ones wrote nothing; beta, with no quota, is never refused."""
    import redis as redis_lib

    from producer.quotas import Quotas
    from tests.support.tenants import tenant_keys
    from vela2.wire.keys import scoped_id, submitted_key

    fake_worker()
    keys = tmp_path / "keys.jsonl"
    headers = tenant_keys(keys, {"acme": Quotas(requests_per_s=5), "beta": None})
    base = http_server(redis_url, "--api-keys-file", str(keys))
    acme, beta = headers["acme"], headers["beta"]
    r = redis_lib.Redis.from_url(redis_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        t0 = time.time()
        got = [http.post("/v1/system_one", json={**REQUEST, "id": f"q-{i}"}, params={"wait_s": 0}, headers=acme)
               for i in range(20)]
        seconds = int(time.time()) - int(t0) + 1  # the one-second windows the burst touched
        refused = [(i, g) for i, g in enumerate(got) if g.status_code == 429]
        accepted = [g for g in got if g.status_code != 429]
        assert all(g.status_code in (200, 202) for g in accepted), [g.text for g in accepted]
        assert refused and 5 <= len(accepted) <= 5 * seconds
        i, first = refused[0]
        err = first.json()["error"]
        assert err["type"] == "quota_exceeded" and "quota requests_per_s of this tenant is 5" in err["message"]
        assert first.headers["Retry-After"] == "1"
        assert not r.exists(submitted_key(scoped_id("acme", f"q-{i}")))  # refused before anything was written
        others = [http.post("/v1/system_one", json={**REQUEST, "id": f"b-{i}"}, params={"wait_s": 0}, headers=beta)
                  for i in range(20)]
        assert all(g.status_code in (200, 202) for g in others)
    r.close()
