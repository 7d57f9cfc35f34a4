"""`vela2 http --cells FILE` over two real redis-server cells, each with a fake worker of its own:
requests and bulk jobs land in their id's cell, /healthz and /readyz merge the cells, and a cell
that is down stalls only its own ids (503 cell_unavailable naming it) while every other id is
served."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from producer.testing.fake_worker import FakeWorker
from stack.harness import RedisServer
from vela2.wire.cells import Cell, CellMap, save_cells
from vela2.wire.keys import job_key, result_key, workers_key

pytestmark = pytest.mark.integration

MODEL = "vela2-demo"


def request(rid: str) -> dict:
    return {"model": MODEL, "id": rid, "input": {"user": f"Where is my refund? ({rid})"},
            "tasks": [{"name": "intent", "kind": "choice", "options": ["refund", "other"]}]}


@pytest.fixture
def two_cells(redis_server_factory: Callable[..., RedisServer],
              tmp_path: Path) -> Iterator[tuple[list[RedisServer], CellMap, Path, list[FakeWorker]]]:
    servers = [redis_server_factory(), redis_server_factory()]
    cell_map = CellMap.even([Cell(n, s.url()) for n, s in zip("ab", servers, strict=True)])
    path = tmp_path / "cells.json"
    save_cells(cell_map, path)
    workers = [FakeWorker(s.url(), model=MODEL).start() for s in servers]
    yield servers, cell_map, path, workers
    for w in workers:
        w.stop()
    for s in servers:
        s.stop()


def beat(server: RedisServer, worker_id: str) -> None:
    """A heartbeat as a worker writes it: what /readyz counts."""
    server.client().zadd(workers_key(MODEL), {worker_id: time.time()})


def _wait_job(http: httpx.Client, job_id: str, deadline_s: float = 60) -> dict:
    deadline = time.monotonic() + deadline_s
    while (job := http.get(f"/v1/batches/{job_id}").json())["status"] not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    return job


def test_requests_and_jobs_live_in_their_cells_and_health_merges(two_cells, http_server):
    servers, cell_map, path, workers = two_cells
    base = http_server(None, "--cells", str(path))
    with httpx.Client(base_url=base, timeout=30) as http:
        ids = [f"c-{i}" for i in range(40)]
        for rid in ids:
            r = http.post("/v1/system_one", json=request(rid), params={"wait_s": 20})
            assert r.status_code == 200 and r.json()["id"] == rid, r.text
        held = [{rid for rid in ids if s.client().exists(result_key(rid))} for s in servers]
        assert held == [{rid for rid in ids if cell_map.cell_of(rid) == k} for k in range(2)]
        assert held[0] and held[1]  # both cells used
        assert http.get(f"/v1/results/{ids[0]}").json()["id"] == ids[0]

        jobs = []
        while len({cell_map.cell_of(j) for j in jobs}) < 2:  # a job in each cell
            body = "\n".join(json.dumps(request(f"j{len(jobs)}-{n}")) for n in range(6)).encode()
            r = http.post("/v1/batches", content=body)
            assert r.status_code == 201, r.text
            jobs.append(r.json()["id"])
        for job_id in jobs:
            assert _wait_job(http, job_id)["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
            out = http.get(f"/v1/batches/{job_id}/output").text.splitlines()
            assert len(out) == 6 and all(json.loads(line)["status"] == "ok" for line in out)
            home = cell_map.cell_of(job_id)
            assert [bool(s.client().exists(job_key(job_id))) for s in servers] == [k == home for k in range(2)]

        health = http.get("/healthz").json()
        assert health["status"] == "ok" and set(health["cells"]) == {"a", "b"}
        assert all(c["redis"] == "ok" for c in health["cells"].values())
        ready = http.get("/readyz")  # each cell's fake worker beats
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        assert {n: c["workers"] for n, c in ready.json()["cells"].items()} == {"a": 1, "b": 1}
        workers[1].stop()  # its beat goes: a live worker in one cell only
        ready = http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        beat(servers[1], "w-b")
        ready = http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"


def test_a_cell_that_is_down_stalls_only_its_own_ids(two_cells, http_server):
    servers, cell_map, path, _ = two_cells
    base = http_server(None, "--cells", str(path))
    with httpx.Client(base_url=base, timeout=30) as http:
        job_in_b = None
        while job_in_b is None:
            r = http.post("/v1/batches", content=json.dumps(request(f"jb-{time.monotonic_ns()}")).encode())
            assert r.status_code == 201
            if cell_map.cell_of(r.json()["id"]) == 1:
                job_in_b = r.json()["id"]
        ids = [f"d-{i}" for i in range(30)]
        in_a = [rid for rid in ids if cell_map.cell_of(rid) == 0]
        in_b = [rid for rid in ids if cell_map.cell_of(rid) == 1]
        assert http.post("/v1/system_one", json=request(in_b[0]), params={"wait_s": 20}).status_code == 200
        servers[1].stop()

        for rid in in_a:  # cell a serves on
            r = http.post("/v1/system_one", json=request(rid), params={"wait_s": 20})
            assert r.status_code == 200, r.text
        for rid in in_b[1:4]:
            r = http.post("/v1/system_one", json=request(rid), params={"wait_s": 20})
            assert r.status_code == 503 and r.json()["error"]["type"] == "cell_unavailable", r.text
            assert "cell b" in r.json()["error"]["message"] and rid in r.json()["error"]["message"]
        got = http.get(f"/v1/results/{in_b[0]}")
        assert got.status_code == 503 and got.json()["error"]["type"] == "cell_unavailable"
        assert http.get(f"/v1/results/{in_a[0]}").status_code == 200
        job = http.get(f"/v1/batches/{job_in_b}")
        assert job.status_code == 503 and job.json()["error"]["type"] == "cell_unavailable", job.text
        assert job_in_b in job.json()["error"]["message"]

        health = http.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert health.json()["cells"]["a"]["redis"] == "ok" and health.json()["cells"]["b"]["redis"] != "ok"
        ready = http.get("/readyz")  # cell a's fake worker beats
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        assert ready.json()["cells"]["a"]["workers"] == 1 and ready.json()["cells"]["b"]["redis"] != "ok"

        servers[1].start()  # back: its ids are served again (the worker reconnects)
        r = http.post("/v1/system_one", json=request(in_b[1]), params={"wait_s": 30})
        assert r.status_code == 200, r.text
        assert http.get("/healthz").json()["status"] == "ok"


def test_cells_and_a_redis_url_together_are_refused(tmp_path, two_cells):
    import subprocess
    import sys

    _, _, path, _ = two_cells
    out = subprocess.run([sys.executable, "-m", "producer.http.app", "--no-auth", "--cells", str(path),
                          "--redis", "redis://127.0.0.1:1/0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--cells names each cell's Redis and broker: drop --redis" in out.stderr
