"""Every error of the HTTP route is one envelope (issue 40): 404 of unknown ids, jobs, files and paths,
405, 422, 400 and 413, on the SystemOne and the OpenAI-shaped routes alike, read by the openai SDK as
its own errors; hints where the caller plainly used the wrong route or form; a request whose own
deadline_s passed is a 410, never a server error. A real `python -m producer.http.app` process, a
real redis-server, httpx and the real `openai` package."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from producer.http.models import Error
from vela2.wire.keys import online_queue

pytestmark = pytest.mark.integration

MODEL = "vela2-demo"
REQUEST = {"model": MODEL, "id": "e-1", "input": {"user": "Where is my refund?"},
           "tasks": [{"name": "intent", "kind": "choice", "question": "What does the user want?",
                      "options": ["refund", "other"]}]}
ROW = {"id": "r-1", "task": "choice:intent", "text": "Where is my refund?",
       "questions": [{"question": "What does the user want?", "options": ["refund", "other"]}]}


def envelope(r: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    """The error of `r`, checked to be the one envelope with `status` and error.type `kind`."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/json", r.headers
    body = r.json()
    Error.model_validate(body)  # the schema the OpenAPI document declares for every error
    assert set(body) == {"version", "model", "id", "status", "error"} and body["version"] == "1", body
    err = body["error"]
    assert {"type", "message", "param", "code"} <= set(err) <= {"type", "message", "param", "code", "hint"}, err
    assert err["type"] == err["code"] == kind, err
    if "hint" in err:  # a client showing only the message shows the hint too
        assert err["message"].endswith(err["hint"]), err
    return body


def test_every_route_answers_errors_in_one_envelope(redis_url, http_server):
    base = http_server(redis_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        got = envelope(http.get("/v1/results/nope"), 404, "not_found")  # was FastAPI's {"detail": ...}
        assert got["id"] == "nope" and "'nope'" in got["error"]["message"] and got["model"] == MODEL
        envelope(http.get("/v1/results", params={"id": "x" * 5000}), 404, "not_found")  # an id no request can have
        envelope(http.get("/v1/batches/batch_nope"), 404, "not_found")
        envelope(http.post("/v1/batches/batch_nope/cancel"), 404, "not_found")
        envelope(http.get("/v1/files/file-nope"), 404, "not_found")
        envelope(http.get("/nothing/here/at/all"), 404, "not_found")

        bad = envelope(http.post("/v1/system_one", json=REQUEST, params={"wait_s": -1}), 422, "invalid_request")
        assert bad["error"]["param"] == "wait_s" and "-1" in bad["error"]["message"]
        envelope(http.get("/v1/results"), 422, "invalid_request")  # no id
        envelope(http.post("/v1/system_one", content=b"{not json"), 400, "invalid_request")
        envelope(http.post("/v1/system_one", content=b" " * 8_000_001), 413, "limit_exceeded")
        envelope(http.post("/v1/system_one", json={**REQUEST, "tasks": []}), 422, "invalid_request")
        mismatch = envelope(http.post("/v1/system_one", json={**REQUEST, "model": "other"}), 400, "model_mismatch")
        assert mismatch["id"] == "e-1" and mismatch["model"] == "other"
        envelope(http.post("/v1/batches", content=b"{}", headers={"content-type": "application/json"}),
                 400, "invalid_request")
        envelope(http.post("/v1/batches", content=b""), 422, "invalid_request")
        envelope(http.post("/v1/files", content=b"x", headers={"content-type": "text/plain"}), 400, "invalid_request")

        for method, path, allowed in (("GET", "/v1/system_one", "POST"), ("DELETE", "/v1/results/x", "GET"),
                                      ("PUT", "/v1/batches", "GET, POST"), ("POST", "/healthz", "GET")):
            got = envelope(http.request(method, path), 405, "method_not_allowed")
            assert http.request(method, path).headers["allow"] == allowed
            assert got["error"]["message"].startswith(f"{method} is not allowed on {path}; it takes {allowed}")


def test_the_openai_sdk_reads_every_route_s_errors(redis_url, http_server):
    base = http_server(redis_url)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing:
        client.batches.retrieve("batch_nope")
    assert missing.value.code == missing.value.type == "not_found" and "batch_nope" in missing.value.message
    with pytest.raises(openai.NotFoundError) as unknown:  # a route this server does not have
        client.models.list()
    assert unknown.value.code == "not_found" and "/v1/models" in unknown.value.message
    # the SystemOne route's errors, through the SDK's generic POST: the same object
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.post("/system_one", body=ROW, cast_to=object)
    assert refused.value.code == "invalid_request" and "/v1/batches" in refused.value.message
    with pytest.raises(openai.NotFoundError) as no_answer:
        client.get("/results/nope", cast_to=object)
    assert no_answer.value.code == "not_found" and no_answer.value.param is None


def test_hints_name_the_route_a_body_or_path_belongs_to(redis_url, http_server):
    base = http_server(redis_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        # a row where a SystemOne request goes: where rows go, instead of "model: field required"
        row = envelope(http.post("/v1/system_one", json=ROW), 422, "invalid_request")["error"]
        assert row["hint"].startswith("this looks like a row (questions, task, text)")
        assert "POST /v1/batches" in row["hint"]
        line = envelope(http.post("/v1/system_one", json={"custom_id": "c", "body": REQUEST}), 422, "invalid_request")
        assert "OpenAI batch file" in line["error"]["hint"]
        create = {"input_file_id": "file-x", "endpoint": "/v1/system_one", "completion_window": "24h"}
        assert "POST it to /v1/batches" in envelope(http.post("/v1/system_one", json=create), 422,
                                                    "invalid_request")["error"]["hint"]
        jsonl = (json.dumps(REQUEST) + "\n" + json.dumps({**REQUEST, "id": "e-2"}) + "\n").encode()
        assert "POST it to /v1/batches" in envelope(http.post("/v1/system_one", content=jsonl), 400,
                                                    "invalid_request")["error"]["hint"]
        # ... and the reverse: a SystemOne request, or a row, as a batch-create body
        one = envelope(http.post("/v1/batches", json=REQUEST), 400, "invalid_request")["error"]
        assert one["param"] == "input_file_id" and "POST it to /v1/system_one" in one["hint"]
        rows = envelope(http.post("/v1/batches", json=ROW), 400, "invalid_request")["error"]
        assert rows["hint"].startswith("this looks like a row") and "application/jsonl" in rows["hint"]
        # a body of its own route's form but wrong gets no hint
        assert "hint" not in envelope(http.post("/v1/system_one", json={**REQUEST, "tasks": []}), 422,
                                      "invalid_request")["error"]

        for path, meant in (("/v1/system-one", "POST /v1/system_one"), ("/v1/systemone", "POST /v1/system_one"),
                            ("/system_one", "POST /v1/system_one"), ("/v1/result/abc", "GET /v1/results/{request_id}"),
                            ("/v1/batch", "GET or POST /v1/batches"), ("/health", "GET /healthz")):
            got = envelope(http.post(path, json=REQUEST), 404, "not_found")["error"]
            assert got["hint"] == f"did you mean {meant}?", (path, got)
            assert got["message"] == f"no route POST {path}; did you mean {meant}?"
        assert "hint" not in envelope(http.get("/v1/chat/completions"), 404, "not_found")["error"]  # nothing close

        get = envelope(http.get("/v1/system_one"), 405, "method_not_allowed")["error"]
        assert "GET /v1/results/{id}" in get["hint"]


def test_a_request_whose_deadline_passed_is_410_never_a_server_error(redis_url, redis_server, http_server, fake_worker):
    """POST with a wait: the caller's deadline_s passes while no worker takes it; the worker answers it
    expired, and the waiting POST gets 410 (status expired, a hint), as a later GET does."""
    worker = fake_worker()
    worker.pause()
    base = http_server(redis_url)
    client = redis_server.client()
    got: dict[str, httpx.Response] = {}

    def post() -> None:
        with httpx.Client(base_url=base, timeout=120) as http:
            got["post"] = http.post("/v1/system_one", json=REQUEST, params={"deadline_s": 0.05, "wait_s": 60})

    thread = threading.Thread(target=post)
    sent = time.monotonic()
    thread.start()
    try:
        deadline = time.monotonic() + 60
        # queued, and past its deadline (0.05 s after the submission, which came after `sent`)
        while client.llen(online_queue(MODEL)) == 0 or time.monotonic() - sent < 0.5:
            assert time.monotonic() < deadline, "the request was not queued"
            time.sleep(0.02)
        worker.resume()
        thread.join(90)
        assert not thread.is_alive()
    finally:
        client.close()
    body = envelope(got["post"], 410, "expired")
    assert body["status"] == "expired" and body["id"] == "e-1" and "new id" in body["error"]["hint"]
    with httpx.Client(base_url=base, timeout=30) as http:
        assert envelope(http.get("/v1/results/e-1"), 410, "expired") == body
        # the same request again gets the same stored answer: its id is an idempotency key
        assert http.post("/v1/system_one", json=REQUEST, params={"wait_s": 5}).json() == body


def test_every_declared_error_response_is_the_error_schema(redis_url, http_server):
    base = http_server(redis_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        spec = http.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    assert "Error" in schemas
    assert not {"HTTPValidationError", "ValidationError", "ErrorAnswer", "NotFound"} & set(schemas)
    assert set(schemas["Error"]["required"]) == {"error"}
    declared = 0
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            for code, response in op["responses"].items():
                if int(code) < 400 or path in ("/healthz", "/readyz"):  # the probes answer their own status
                    continue
                declared += 1
                assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}, \
                    (method, path, code)
                assert int(code) != 504, (method, path)
    assert declared > 40
