"""The producer side over a sentinel:// URL (a real master, replica and sentinel): AsyncClient, the
bounded pools and the route of `vela2 http`, `vela2 status` and `vela2 backfill` (answered by a
FakeWorker on the same URL); a push that waits for a replica (wait_replicas: Client, `vela2 backfill
--wait-replicas`, `vela2 http --wait-replicas`) and one that cannot get it."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import httpx
import pytest

from producer.aio import AsyncClient, BoundedPool, SyncBoundedPool
from producer.brokers import NotReplicated
from producer.client import Client
from producer.testing import FakeWorker
from stack.harness import ROOT, child_env
from vela2.wire.connections import async_redis_client, redis_client, redis_pool
from vela2.wire.keys import queue_name

MODEL = "vela2-demo"
ROW = {"task": "choice:boolq", "text": "The sky is green.", "questions": [{"options": ["yes", "no"]}]}
REQUEST = {"model": MODEL, "id": "http-1", "input": {"user": "Where is my refund?"},
           "tasks": [{"name": "intent", "kind": "choice", "question": "What does the user want?",
                      "options": ["refund", "other"]}]}


@pytest.fixture
def cluster(sentinel_cluster_factory):
    return sentinel_cluster_factory(sentinels=1)


def test_every_client_kind_reaches_the_master(cluster):
    url = cluster.url(db=1)
    master = cluster.master.client(db=1)
    redis_client(url).set("sync", 1)
    sync_pool = redis_pool(url, SyncBoundedPool, max_connections=2, timeout=1)
    assert type(sync_pool).__mro__[1:3] == (type(sync_pool).__mro__[1], SyncBoundedPool)
    import redis

    redis.Redis(connection_pool=sync_pool).set("pool", 1)

    async def run() -> None:
        client = async_redis_client(url)
        await client.set("async", 1)
        await client.aclose()
        pool = redis_pool(url, BoundedPool, max_connections=2, timeout=1)
        bounded = redis.asyncio.Redis(connection_pool=pool)
        await bounded.set("async_pool", 1)
        await bounded.aclose()
        await pool.disconnect()
        ac = AsyncClient(url, model=MODEL)
        await ac.submit({**ROW, "id": "a-1"})
        await ac.aclose()

    asyncio.run(run())
    assert {k.decode() for k in master.keys("*")} >= {"sync", "pool", "async", "async_pool", queue_name(MODEL)}


def test_a_push_waits_for_a_replica_and_says_when_none_has_it(cluster):
    url = cluster.url()
    client = Client(url, model=MODEL, wait_replicas=1)
    client.submit({**ROW, "id": "w-1"})  # the replica is in sync: WAIT 1 answers 1 at once
    assert cluster.replica.client().llen(queue_name(MODEL)) == 1  # on the replica when submit returned
    assert cluster.replica.proc is not None
    cluster.replica.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(NotReplicated, match="reached 0 of 1 replicas within 1000 ms"):
            client.submit({**ROW, "id": "w-2"})
    finally:
        cluster.replica.proc.send_signal(signal.SIGCONT)
    client.close()


def test_status_and_backfill_take_a_sentinel_url(cluster, tmp_path):
    url = cluster.url()
    Client(url, model=MODEL).submit({**ROW, "id": "s-1"})
    status = subprocess.run([sys.executable, "-m", "vela2.cli", "status", "--json", "--model", MODEL],
                            cwd=ROOT, env=child_env({"VELA2_REDIS_URL": url}), capture_output=True, text=True,
                            timeout=60)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["models"][MODEL]["queues"]["online"] == 1
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({**ROW, "id": f"b-{i}"}) + "\n" for i in range(5)))
    worker = FakeWorker(url, model=MODEL).start()  # answers through sentinel too
    try:
        run = subprocess.run([sys.executable, "-m", "vela2.cli", "backfill", str(rows), str(tmp_path / "out.jsonl"),
                              "--timeout-s", "60", "--wait-replicas", "1"], cwd=ROOT,
                             env=child_env({"VELA2_REDIS_URL": url}), capture_output=True, text=True, timeout=120)
    finally:
        worker.stop()
    assert run.returncode == 0, run.stderr
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(o["id"] for o in out if o["status"] == "ok") == [f"b-{i}" for i in range(5)]
    # no replica answering: each push is retried like a Redis timeout, then the run stops (exit 3, resumable)
    rows.write_text("".join(json.dumps({**ROW, "id": f"c-{i}"}) + "\n" for i in range(5)))
    assert cluster.replica.proc is not None
    cluster.replica.proc.send_signal(signal.SIGSTOP)
    try:
        stuck = subprocess.run([sys.executable, "-m", "vela2.cli", "backfill", str(rows), str(tmp_path / "out3.jsonl"),
                                "--wait-replicas", "1", "--redis-timeout-s", "2"], cwd=ROOT,
                               env=child_env({"VELA2_REDIS_URL": url}), capture_output=True, text=True, timeout=120)
    finally:
        cluster.replica.proc.send_signal(signal.SIGCONT)
    assert stuck.returncode == 3, stuck.stderr
    assert "reached 0 of 1 replicas" in stuck.stderr and "rerun the same command to resume" in stuck.stderr
    bad = subprocess.run([sys.executable, "-m", "vela2.cli", "backfill", str(rows), str(tmp_path / "out2.jsonl")],
                         cwd=ROOT, env=child_env({"VELA2_REDIS_URL": "sentinel://:s3cret@127.0.0.1:1/0"}),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "s3cret" not in bad.stderr and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1] == (
        "vela2 backfill: the result store URL 'sentinel://:**@127.0.0.1:1/0' names no master: add "
        "?master_name=NAME (the name the sentinels monitor)")


def test_the_http_route_serves_through_sentinel(cluster, http_server):
    url = cluster.url()
    worker = FakeWorker(url, model=MODEL).start()
    try:
        base = http_server(url, "--wait-replicas", "1")
        with httpx.Client(base_url=base, timeout=60) as http:
            r = http.post("/v1/system_one", json=REQUEST, params={"wait_s": 30})
            assert r.status_code == 200, r.text
            assert r.json()["id"] == REQUEST["id"] and r.json()["status"] == "ok"
            assert cluster.replica.proc is not None
            cluster.replica.proc.send_signal(signal.SIGSTOP)  # no replica answers: not accepted, 503
            try:
                r = http.post("/v1/system_one", json={**REQUEST, "id": "http-2"}, params={"wait_s": 0})
            finally:
                cluster.replica.proc.send_signal(signal.SIGCONT)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["message"].startswith("not accepted: the push reached 0 of 1 replicas")
    finally:
        worker.stop()
    assert cluster.master.client().exists("celery-task-meta-" + REQUEST["id"])
