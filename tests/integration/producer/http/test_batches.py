"""The bulk-job routes of `vela2 http` for real: a `python -m producer.http.app` process, a redis-server, and
the fake worker in a thread (paused where a test needs the job to wait)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

pytestmark = pytest.mark.integration

MODEL = "vela2-demo"


def row(i: int) -> dict:
    return {"id": f"r-{i}", "task": "choice:boolq", "text": f"text {i}",
            "questions": [{"question": "Is it?", "options": ["yes", "no"]}]}


def jsonl(objs: list) -> bytes:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs).encode()


def wait_ended(http: httpx.Client, job: str, timeout_s: float = 30.0, headers: dict | None = None) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        got = http.get(f"/v1/batches/{job}", headers=headers).json()
        if got["status"] in ("completed", "cancelled", "expired", "failed"):
            return got
        assert time.monotonic() < deadline, got
        time.sleep(0.02)


def test_create_read_and_stream_a_batch(redis_url, http_server, fake_worker):
    fake_worker()
    base = http_server(redis_url)
    body = jsonl([row(0), {"custom_id": "c-1", "body": row(1)}, "oops", row(2)])
    with httpx.Client(base_url=base, timeout=30) as http:
        r = http.post("/v1/batches", content=body, params={"window_s": 3600, "metadata": ["k=1", "team=a=b"]},
                      headers={"content-type": "application/jsonl"})
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["object"] == "batch" and job["id"].startswith("batch_")
        assert job["metadata"] == {"k": "1", "team": "a=b"}
        assert job["request_counts"]["total"] == 4 and job["completion_window"] == "1h"  # as OpenAI writes it
        done = wait_ended(http, job["id"])
        assert done["status"] == "completed"
        assert done["counts"] == {"queued": 0, "ok": 3, "error": 1, "expired": 0, "cancelled": 0}
        out = http.get(f"/v1/batches/{job['id']}/output")
        assert out.status_code == 200 and out.headers["content-type"].startswith("application/jsonl")
        lines = [json.loads(x) for x in out.text.splitlines()]
        assert [x.get("custom_id") or x["id"] for x in lines] == ["r-0", "c-1", "line-3", "r-2"]
        assert lines[1]["response"]["status_code"] == 200 and lines[2]["error"]["type"] == "invalid_request"
        again = http.post(f"/v1/batches/{job['id']}/cancel")  # an ended job stays as it is
        assert again.status_code == 200 and again.json()["status"] == "completed"


def test_a_batch_line_with_a_lone_surrogate_or_nested_too_deeply_is_an_error_line(redis_url, http_server, fake_worker):
    """Such a line used to make POST /v1/batches answer 500 and leave the job validating (then failed),
    its good lines never queued: it is one invalid_request line of the job now."""
    fake_worker()
    base = http_server(redis_url)
    surrogate = '{"id": "bad\\ud800", "task": "choice:x", "text": "t", "questions": [{"options": ["a", "b"]}]}'
    with httpx.Client(base_url=base, timeout=30) as http:
        r = http.post("/v1/batches", content=jsonl([row(0), surrogate, "[" * 5000 + "]" * 5000, row(3)]))
        assert r.status_code == 201, r.text
        done = wait_ended(http, r.json()["id"])
        assert done["status"] == "completed" and done["counts"] == {
            "queued": 0, "ok": 2, "error": 2, "expired": 0, "cancelled": 0}
        lines = [json.loads(x) for x in http.get(f"/v1/batches/{done['id']}/output").text.splitlines()]
        assert [x["id"] for x in lines] == ["r-0", "bad\\ud800", "line-3", "r-3"]
        assert lines[1]["error"]["message"] == "line 2: id is not valid Unicode (lone surrogate at index 3)"
        assert "line 3 is nested deeper than 64 levels" in lines[2]["error"]["message"]


def test_cancel_a_batch_that_no_worker_started(redis_url, http_server, fake_worker):
    worker = fake_worker()
    worker.pause()
    base = http_server(redis_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        job = http.post("/v1/batches", content=jsonl([row(i) for i in range(10)])).json()
        assert job["status"] == "in_progress" and job["counts"]["queued"] == 10
        early = http.get(f"/v1/batches/{job['id']}/output")
        assert early.status_code == 409 and early.json()["error"]["type"] == "job_running"
        assert "0 of 10 lines answered" in early.json()["error"]["message"]
        cancel = http.post(f"/v1/batches/{job['id']}/cancel")
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelling"
        worker.resume()
        done = wait_ended(http, job["id"])
        assert done["status"] == "cancelled" and done["counts"]["cancelled"] == 10 and done["counts"]["ok"] == 0
        assert done["request_counts"] == {"total": 10, "completed": 0, "failed": 10}


def test_refusals_name_the_limit_and_the_value(redis_url, http_server):
    base = http_server(redis_url, "--max-batch-bytes", "1000")
    with httpx.Client(base_url=base, timeout=30) as http:
        big = http.post("/v1/batches", content=b"x" * 1001)
        assert big.status_code == 413 and "request body has 1,001 bytes; limit 1,000" in big.json()["error"]["message"]
        empty = http.post("/v1/batches", content=b"")
        assert empty.status_code == 422 and "body is empty: a batch needs at least one line" in empty.text
        blank = http.post("/v1/batches", content=b"\n \n")  # lines, none a request: a job of 0 lines, done
        assert blank.status_code == 201 and blank.json()["status"] == "completed" and blank.json()["counts"]["ok"] == 0
        window = http.post("/v1/batches", content=jsonl([row(0)]), params={"window_s": 0})
        assert window.status_code == 422 and "window_s" in window.json()["error"]["message"]
        meta = http.post("/v1/batches", content=jsonl([row(0)]), params={"metadata": "no-pair"})
        assert meta.status_code == 422 and "metadata.0: String should match pattern" in meta.json()["error"]["message"]
        many = http.post("/v1/batches", content=jsonl([row(0)]), params={"metadata": [f"k{i}=v" for i in range(17)]})
        assert many.status_code == 422 and "at most 16 items" in many.json()["error"]["message"]
        for path in ("/v1/batches/batch_nope", "/v1/batches/batch_nope/output"):
            assert http.get(path).status_code == 404
        assert http.post("/v1/batches/batch_nope/cancel").status_code == 404
        paths = http.get("/openapi.json").json()["paths"]
        assert {"/v1/batches", "/v1/batches/{job_id}", "/v1/batches/{job_id}/output",
                "/v1/batches/{job_id}/cancel"} <= set(paths)
        assert "201" in paths["/v1/batches"]["post"]["responses"]
        assert "application/jsonl" in paths["/v1/batches"]["post"]["requestBody"]["content"]


def test_a_tenant_sees_and_cancels_only_its_own_batches(redis_url, http_server, fake_worker, tmp_path):
    from producer.auth import new_key

    fake_worker()
    key_a, a = new_key("acme")
    key_b, b = new_key("beta")
    keys = tmp_path / "keys.jsonl"
    keys.write_text(a.line() + "\n" + b.line() + "\n")
    base = http_server(redis_url, "--api-keys-file", str(keys))
    acme, beta = {"Authorization": f"Bearer {key_a}"}, {"Authorization": f"Bearer {key_b}"}
    with httpx.Client(base_url=base, timeout=30) as http:
        assert http.post("/v1/batches", content=jsonl([row(0)])).status_code == 401
        job = http.post("/v1/batches", content=jsonl([row(0), row(1)]), headers=acme).json()["id"]
        for path in (f"/v1/batches/{job}", f"/v1/batches/{job}/output"):
            assert http.get(path, headers=beta).status_code == 404
        assert http.post(f"/v1/batches/{job}/cancel", headers=beta).status_code == 404
        deadline = time.monotonic() + 30
        while (got := http.get(f"/v1/batches/{job}", headers=acme).json())["status"] != "completed":
            assert time.monotonic() < deadline, got
            time.sleep(0.02)
        lines = http.get(f"/v1/batches/{job}/output", headers=acme).text.splitlines()
        assert [json.loads(x)["id"] for x in lines] == ["r-0", "r-1"]  # the tenant's ids, as given


def test_a_single_request_cannot_take_a_job_lines_id(redis_url, http_server, fake_worker):
    """Job lines travel as <job>#<line>: a single request under that id is refused (409 id_conflict,
    IdConflict from the clients) before anything is written, and the job's every line is answered."""
    from producer.client import Client
    from vela2.errors import IdConflict
    from vela2.wire.keys import result_key, submitted_key

    worker = fake_worker()
    worker.pause()
    base = http_server(redis_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        job = http.post("/v1/batches", content=jsonl([row(i) for i in range(3)])).json()
        taken = f"{job['id']}#1"
        sys1 = {"id": taken, "model": MODEL, "input": "Is it?",
                "tasks": [{"name": "q", "kind": "choice", "question": "Is it?", "options": ["yes", "no"]}]}
        r = http.post("/v1/system_one", json=sys1, params={"wait_s": 0})
        assert r.status_code == 409 and r.json()["error"]["type"] == "id_conflict", r.text
        assert "only jobs may use" in r.json()["error"]["message"]
        client = Client(redis_url, model=MODEL)
        with pytest.raises(IdConflict, match="has the form of a bulk job line's"):
            client.submit({**row(9), "id": taken})
        assert not client.redis.exists(result_key(taken)) and not client.redis.exists(submitted_key(taken))
        client.close()
        worker.resume()
        done = wait_ended(http, job["id"])
        assert done["status"] == "completed" and done["counts"]["ok"] == 3


def test_a_tenant_gets_at_most_its_share_of_upload_slots(redis_server_factory, http_server):
    """Six uploads at once while Redis holds writes (CLIENT PAUSE): the one that took the tenant's
    only slot (--uploads-per-tenant 1) waits for Redis; the five others are refused at once with 429
    too_many_uploads naming the limit, never queued behind it; once it is done the slot is free."""
    from concurrent.futures import ThreadPoolExecutor

    import redis as redis_lib

    server = redis_server_factory()
    base = http_server(server.url(), "--uploads-per-tenant", "1")
    r = redis_lib.Redis.from_url(server.url())
    with httpx.Client(base_url=base, timeout=60) as http:
        r.execute_command("CLIENT", "PAUSE", "2000", "WRITE")
        with ThreadPoolExecutor(6) as pool:
            got = list(pool.map(lambda i: http.post("/v1/batches", content=jsonl([row(i)])), range(6)))
        codes = sorted(g.status_code for g in got)
        assert codes == [201, 429, 429, 429, 429, 429], [g.text for g in got]
        refused = [g for g in got if g.status_code == 429]
        assert all(g.json()["error"]["type"] == "too_many_uploads" for g in refused)
        assert all("limit 1 (--uploads-per-tenant)" in g.json()["error"]["message"] for g in refused)
        assert all(g.headers["Retry-After"] == "5" for g in refused)
        again = http.post("/v1/batches", content=jsonl([row(7)]))  # the slot is free again
        assert again.status_code == 201, again.text
    r.close()


def test_an_upload_past_its_time_is_408_and_its_job_failed(redis_url, http_server):
    base = http_server(redis_url, "--upload-timeout-s", "0.000001")
    with httpx.Client(base_url=base, timeout=60) as http:
        r = http.post("/v1/batches", content=jsonl([row(i) for i in range(2500)]))
        assert r.status_code == 408, r.text
        err = r.json()["error"]
        assert err["type"] == "upload_timeout" and "longer than 1e-06 s to register" in err["message"]
        job = err["message"].rsplit("job ", 1)[1].split()[0]
        got = http.get(f"/v1/batches/{job}").json()
        assert got["status"] == "failed" and got["failed_reason"].startswith("UploadTimeout")


def test_a_tenants_live_jobs_quota_refuses_it_alone(redis_url, http_server, fake_worker, tmp_path):
    """acme may have 1 live job (quotas.live_jobs): a second upload while the first runs is 429
    quota_exceeded naming the quota, the limit and the usage, and creates no job; beta (no quota) is
    not refused; once acme's job ended, its next upload is accepted."""
    from producer.quotas import Quotas
    from tests.support.tenants import tenant_keys

    worker = fake_worker()
    worker.pause()
    keys = tmp_path / "keys.jsonl"
    headers = tenant_keys(keys, {"acme": Quotas(live_jobs=1), "beta": None})
    base = http_server(redis_url, "--api-keys-file", str(keys))
    acme, beta = headers["acme"], headers["beta"]
    with httpx.Client(base_url=base, timeout=30) as http:
        first = http.post("/v1/batches", content=jsonl([row(i) for i in range(3)]), headers=acme)
        assert first.status_code == 201, first.text
        second = http.post("/v1/batches", content=jsonl([row(9)]), headers=acme)
        assert second.status_code == 429, second.text
        err = second.json()["error"]
        assert err["type"] == "quota_exceeded" and "quota live_jobs of this tenant is 1; this would make it 2" in \
            err["message"]
        assert second.headers["Retry-After"] == "30"
        assert http.post("/v1/batches", content=jsonl([row(9)]), headers=beta).status_code == 201
        worker.resume()
        deadline = time.monotonic() + 30
        while http.get(f"/v1/batches/{first.json()['id']}", headers=acme).json()["status"] != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        third = http.post("/v1/batches", content=jsonl([row(8)]), headers=acme)
        assert third.status_code == 201, third.text


def test_a_tenants_job_lines_quota_counts_live_jobs_lines_and_gives_them_back(redis_url, http_server, fake_worker,
                                                                               tmp_path):
    """acme may have 5 lines in live jobs (quotas.job_lines): a 3-line job is accepted, a 3-line one
    while it runs is 429 quota_exceeded and creates no job, a 2-line one fits; once they ended, a
    5-line one is accepted and a 6-line one never is."""
    import redis as redis_lib

    from producer.quotas import Quotas
    from tests.support.tenants import tenant_keys
    from vela2.wire.keys import jobs_key

    worker = fake_worker()
    worker.pause()
    path = tmp_path / "keys.jsonl"
    acme = tenant_keys(path, {"acme": Quotas(job_lines=5)})["acme"]
    base = http_server(redis_url, "--api-keys-file", str(path))
    r = redis_lib.Redis.from_url(redis_url)
    with httpx.Client(base_url=base, timeout=30) as http:
        first = http.post("/v1/batches", content=jsonl([row(i) for i in range(3)]), headers=acme)
        assert first.status_code == 201, first.text
        refused = http.post("/v1/batches", content=jsonl([row(i) for i in range(3, 6)]), headers=acme)
        assert refused.status_code == 429, refused.text
        assert "quota job_lines of this tenant is 5; this would make it 6" in refused.json()["error"]["message"]
        assert r.zcard(jobs_key(MODEL)) == 1  # no job was made for it
        second = http.post("/v1/batches", content=jsonl([row(6), row(7)]), headers=acme)
        assert second.status_code == 201, second.text
        worker.resume()
        for job in (first.json()["id"], second.json()["id"]):
            assert wait_ended(http, job, headers=acme)["status"] == "completed"
        assert http.post("/v1/batches", content=jsonl([row(i) for i in range(10, 15)]), headers=acme).status_code == 201
        too_big = http.post("/v1/batches", content=jsonl([row(i) for i in range(20, 26)]), headers=acme)
        assert too_big.status_code == 429 and "this would make it 6" in too_big.json()["error"]["message"]
    r.close()
