"""The real `openai` package against `vela2 http` (issue 39): its own client (`OpenAI(base_url=...)`)
uploads a batch file, creates, polls, lists, retrieves and cancels batches and downloads their output
and error files, unchanged; every object it gets validates as the package's own types
(`openai.types.Batch`, `FileObject`), and a body that is no upload or batch request is a 4xx in
OpenAI's error shape."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from openai.types import Batch, FileDeleted, FileObject

pytestmark = pytest.mark.integration

MODEL = "vela2-demo"


def request(i: int) -> dict:
    return {"model": MODEL, "id": f"q-{i}", "input": {"user": f"Where is my refund for order {i}?"},
            "tasks": [{"name": "intent", "kind": "choice", "question": "What does the user want?",
                       "options": ["refund", "other"]}]}


def batch_file(n: int, bad: bool = True) -> bytes:
    lines = [{"custom_id": f"c-{i}", "method": "POST", "url": "/v1/system_one", "body": request(i)} for i in range(n)]
    out = [json.dumps(x) for x in lines] + (['{"custom_id": "c-bad", "body": {"model": "vela2-demo"}}'] if bad else [])
    return ("\n".join(out) + "\n").encode()


def raw(http: httpx.Client, path: str) -> dict:
    got = http.get(path)
    assert got.status_code == 200, got.text
    return got.json()


def wait(client: openai.OpenAI, batch_id: str, until: tuple[str, ...], timeout_s: float = 120) -> Batch:
    deadline = time.monotonic() + timeout_s
    while (b := client.batches.retrieve(batch_id)).status not in until:
        assert time.monotonic() < deadline, b
        time.sleep(0.2)
    return b


def test_the_openai_client_runs_a_batch_end_to_end_unchanged(redis_url, real_worker, http_server):
    real_worker(redis_url)
    base = http_server(redis_url)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="not-checked-with-no-auth", max_retries=0)
    with httpx.Client(base_url=base, timeout=30) as http:
        f = client.files.create(file=("requests.jsonl", batch_file(5)), purpose="batch")
        assert isinstance(f, FileObject) and f.purpose == "batch" and f.filename == "requests.jsonl"
        assert f.bytes == len(batch_file(5)) and f.id.startswith("file-")
        FileObject.model_validate(raw(http, f"/v1/files/{f.id}"))
        assert client.files.retrieve(f.id).bytes == f.bytes
        assert client.files.content(f.id).content == batch_file(5)
        assert f.id in [x.id for x in client.files.list()]

        b = client.batches.create(input_file_id=f.id, endpoint="/v1/system_one", completion_window="24h",
                                  metadata={"team": "search"})
        assert b.input_file_id == f.id and b.completion_window == "24h" and b.metadata == {"team": "search"}
        done = wait(client, b.id, ("completed", "failed", "expired", "cancelled"))
        assert done.status == "completed", done
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (6, 5, 1)
        assert done.completed_at and done.in_progress_at and done.finalizing_at and done.output_file_id
        got = Batch.model_validate(raw(http, f"/v1/batches/{b.id}"))  # the package's own type, every field
        assert got.output_file_id == done.output_file_id and got.error_file_id == done.error_file_id

        out = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
        assert sorted(x["custom_id"] for x in out) == [f"c-{i}" for i in range(5)]
        assert all(x["error"] is None and x["response"]["status_code"] == 200 for x in out)
        assert {x["response"]["body"]["tasks"]["intent"]["decision"] for x in out} <= {"refund", "other", None}
        errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
        assert [x["custom_id"] for x in errors] == ["c-bad"]
        assert errors[0]["response"]["status_code"] == 422 and errors[0]["error"]["code"] == "invalid_request"
        view = client.files.retrieve(done.output_file_id)
        assert view.purpose == "batch_output" and view.bytes == len(client.files.content(done.output_file_id).content)

        second = client.batches.create(input_file_id=f.id, endpoint="/v1/system_one", completion_window="1h")
        page = client.batches.list(limit=1)
        assert [x.id for x in page.data] == [second.id] and page.has_more
        assert [x.id for x in page.get_next_page().data] == [b.id]
        assert [x.id for x in client.batches.list(limit=100)] == [second.id, b.id]  # the SDK's pagination
        for x in raw(http, "/v1/batches?limit=100")["data"]:
            Batch.model_validate(x)

        deleted = client.files.delete(f.id)
        assert isinstance(deleted, FileDeleted) and deleted.deleted
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(f.id)
        with pytest.raises(openai.NotFoundError) as refused:  # a file that is gone: 404 naming it
            client.batches.create(input_file_id=f.id, endpoint="/v1/system_one", completion_window="24h")
        assert refused.value.body["param"] == "input_file_id"


def test_a_batch_is_cancelled_and_bad_requests_are_4xx_in_openais_shape(redis_url, http_server, fake_worker):
    worker = fake_worker()
    worker.pause()  # nothing runs: the batch waits, to be cancelled
    base = http_server(redis_url)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    f = client.files.create(file=("in.jsonl", batch_file(4, bad=False)), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/system_one", completion_window="24h")
    cancelled = client.batches.cancel(b.id)
    assert cancelled.status in ("cancelling", "cancelled") and cancelled.cancelling_at
    worker.resume()
    done = wait(client, b.id, ("cancelled",), 60)
    assert done.cancelled_at and done.request_counts.total == 4
    Batch.model_validate(done.model_dump())

    for kwargs, param in [({"input_file_id": f.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
                           "endpoint"),
                          ({"input_file_id": f.id, "endpoint": "/v1/system_one", "completion_window": "forever"},
                           "completion_window"),
                          ({"input_file_id": "", "endpoint": "/v1/system_one", "completion_window": "24h"},
                           "input_file_id")]:
        with pytest.raises(openai.BadRequestError) as refused:
            client.batches.create(**kwargs)
        assert refused.value.body["param"] == param and refused.value.status_code == 400
    with httpx.Client(base_url=base, timeout=30) as http:
        for body in (b"{}", b"[]", b"not json", b'{"input_file_id": 3}'):
            r = http.post("/v1/batches", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
        assert http.post("/v1/files", content=b"x", headers={"content-type": "text/plain"}).status_code == 400
        r = http.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "fine-tune"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"
        long_id = "file-" + "x" * 2000  # an id no file can have: no such file, never a server error
        for method, path in (("GET", f"/v1/files/{long_id}"), ("GET", f"/v1/files/{long_id}/content"),
                             ("DELETE", f"/v1/files/{long_id}")):
            assert http.request(method, path).status_code == 404, path
        r = http.post("/v1/batches", json={"input_file_id": long_id, "endpoint": "/v1/system_one",
                                           "completion_window": "24h"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "input_file_id"
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-nope")


def test_the_docs_openai_example_runs_as_written(redis_url, http_server, fake_worker, capsys):
    from tests.unit.test_docs import examples

    fake_worker()
    base = http_server(redis_url)
    [code] = examples("openai")
    exec(compile(code, "docs/producers/openai.md", "exec"), {"BASE_URL": base, "API_KEY": "any-with-no-auth"})
    printed = capsys.readouterr().out.split()
    assert printed[0::2] == ["ticket-0", "ticket-1"] and all(d in ("refund", "other") for d in printed[1::2])


def test_files_count_in_stored_bytes_and_jobs_are_visible_both_ways(redis_url, http_server, fake_worker, tmp_path):
    from producer import Client
    from producer.jobs import list_jobs, submit_job

    fake_worker()
    quotas = tmp_path / "quotas.json"
    quotas.write_text(json.dumps({"": {"stored_bytes": 3000}}))
    base = http_server(redis_url, "--quotas-file", str(quotas))
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    f = client.files.create(file=("in.jsonl", batch_file(6, bad=False)), purpose="batch")
    assert f.bytes > 1500
    extra = [client.files.create(file=("more.jsonl", batch_file(6, bad=False)), purpose="batch")]  # past 3,000
    deadline = time.monotonic() + 30  # the route reads a tenant's usage at most once a second
    while True:
        try:
            extra.append(client.files.create(file=("more.jsonl", batch_file(1, bad=False)), purpose="batch"))
        except openai.APIStatusError as e:
            assert e.status_code == 507 and e.body["type"] == "quota_exceeded", e.body
            break
        assert time.monotonic() < deadline, "the files' bytes never counted in stored_bytes"
        time.sleep(0.2)
    for x in [f, *extra]:  # their bytes given back: uploads are accepted again
        client.files.delete(x.id)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.files.create(file=("again.jsonl", b'{"custom_id": "a", "body": {}}\n'), purpose="batch")
            break
        except openai.APIStatusError as e:
            assert e.status_code == 507 and time.monotonic() < deadline, e.body
            time.sleep(0.2)

    made_by_sdk = client.batches.create(input_file_id=client.files.list().data[0].id, endpoint="/v1/system_one",
                                        completion_window="24h")
    with Client(redis_url, model=MODEL) as producer:
        made_by_jobs = submit_job(producer, batch_file(2, bad=False).splitlines()).id
        assert made_by_sdk.id in [j.id for j in list_jobs(producer)]
    assert client.batches.retrieve(made_by_jobs).input_file_id == ""
    assert {made_by_sdk.id, made_by_jobs} <= {b.id for b in client.batches.list()}
