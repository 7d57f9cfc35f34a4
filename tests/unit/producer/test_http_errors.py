"""producer.http.errors without a server: the hints (a path close to a route's, a body of another
route's form, JSONL), the OpenAPI document's one Error schema, and a failure of the route itself,
which is a 500 in the envelope (in process: nothing else makes the route fail). The route itself
over HTTP: tests/integration/producer/http/test_errors.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from producer.http.app import create_app
from producer.http.errors import form_hint, jsonl_hint, path_hint, unify_error_schemas
from producer.http.models import Error

ROW = {"id": "r", "task": "choice:x", "text": "t", "questions": [{"options": ["a", "b"]}]}
REQUEST = {"model": "m", "input": "t", "tasks": [{"name": "x", "kind": "choice", "options": ["a", "b"]}]}


@pytest.fixture(scope="module")
def app() -> Iterator[FastAPI]:
    made = create_app("redis://127.0.0.1:1/0", "vela2-demo", keys=None)  # its lifespan (Redis) never runs here
    yield made
    made.state.vela2.uploads.shutdown()


@pytest.mark.parametrize(("path", "meant"), [
    ("/v1/system-one", "did you mean POST /v1/system_one?"),
    ("/V1/system_one", "did you mean POST /v1/system_one?"),
    ("/v1/result/some-id", "did you mean GET /v1/results/{request_id}?"),
    ("/v1/batches/b1/outputs", "did you mean GET /v1/batches/{job_id}/output?"),
    ("/v1/file", "did you mean GET or POST /v1/files?"),
    ("/readiness", None),
    ("/v1/chat/completions", None),  # an id-shaped segment never makes a path look close
    ("/", None),
    ("/v1/system-one" + "/x" * 200, None),  # a path that long is no typo of a route's: not compared
])
def test_an_unknown_path_close_to_a_route_names_it(app, path, meant):
    assert path_hint(app, path) == meant


def test_a_body_of_another_route_s_form_gets_where_it_goes():
    assert form_hint(ROW, "/v1/system_one").startswith("this looks like a row (questions, task, text), not a SystemOne")
    assert "/v1/batches" in form_hint({**ROW, "model": "m"}, "/v1/system_one")  # a row naming a model is a row
    assert "OpenAI batch file" in form_hint({"custom_id": "c", "body": REQUEST}, "/v1/system_one")
    create = form_hint({"input_file_id": "f"}, "/v1/system_one")
    assert create == "this looks like a batch-create body: POST it to /v1/batches"
    one = form_hint(REQUEST, "/v1/batches")
    assert one.startswith("this looks like a SystemOne request: POST it to /v1/system_one")
    assert form_hint(ROW, "/v1/batches").startswith("this looks like a row: POST rows as the lines of a bulk job")
    for own in ({**REQUEST, "tasks": []}, {"model": "m"}, [ROW], "text", None):  # its own form, or none known
        assert form_hint(own, "/v1/system_one") is None
    assert form_hint({"input_file_id": ""}, "/v1/batches") is None
    lines = (json.dumps(REQUEST) + "\n" + json.dumps(REQUEST) + "\n").encode()
    assert "POST it to /v1/batches" in jsonl_hint(lines)
    for one in (json.dumps(REQUEST).encode() + b"\n", b"{not json\n{}", b"[1]\n[2]", b""):
        assert jsonl_hint(one) is None


def test_the_route_s_own_failure_is_a_500_in_the_envelope(app):
    def boom() -> None:
        raise RuntimeError("secret detail of a bug")

    app.add_api_route("/boom", boom)
    try:
        r = TestClient(app, raise_server_exceptions=False).get("/boom")
    finally:
        app.router.routes.pop()  # the module's app, as it was
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    body = Error.model_validate(r.json())
    assert body.error.type == body.error.code == "internal_error" and body.model == "vela2-demo"
    assert "RuntimeError" in body.error.message and "secret" not in r.text  # the traceback goes to the log only


def test_fastapi_s_own_422_schema_becomes_the_error_schema(app):
    spec = app.openapi()
    assert not {"HTTPValidationError", "ValidationError"} & set(spec["components"]["schemas"])
    get_batch = spec["paths"]["/v1/batches/{job_id}"]["get"]["responses"]  # a path parameter: FastAPI's 422
    assert get_batch["422"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    other = {"paths": {"/x": {"get": {"responses": {"422": {"content": {"application/json": {"schema": {
        "$ref": "#/components/schemas/Mine"}}}}}}}}, "components": {"schemas": {"Mine": {}}}}
    unify_error_schemas(other)  # a 422 of the route's own schema is left as it is
    assert other["paths"]["/x"]["get"]["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/Mine")
