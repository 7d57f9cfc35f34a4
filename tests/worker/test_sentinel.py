"""Redis Sentinel: a sentinel:// URL for the result store and the broker, on every side, against a
real master, replica and sentinels (tests/sentinel_cluster.py); bad sentinel URLs end the worker
with one line; and a failover during a run, measured: what the old master acknowledged and never
replicated is lost (counted, then recovered by resubmitting the same ids), what ran twice is counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client
from stack.harness import ROOT, child_env
from vela2.wire.keys import queue_name, result_key, workers_key
from worker.app import create_app
from worker.settings import WorkerSettings

MODEL = "vela2-demo"
ROW = {"task": "choice:boolq", "text": "The sky is green.", "questions": [{"options": ["yes", "no"]}]}
RETRYABLE = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError)


def run_cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vela2.cli", "worker", *args], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=timeout_s)


def test_the_worker_app_takes_sentinel_urls_for_broker_and_backend(demo_dir):
    url = "sentinel://:s3cret@10.0.0.1:26379/2;sentinel://10.0.0.2?master_name=main"
    app = create_app(WorkerSettings(redis_url=url, checkpoint=str(demo_dir)))
    assert app.conf.broker_transport == "worker.broker:SentinelTransport"
    assert app.conf.broker_transport_options["master_name"] == "main"
    assert app.conf.broker_transport_options["queue_order_strategy"] == "priority"  # the Redis options kept
    assert app.conf.result_backend_transport_options == {"master_name": "main"}
    assert app.conf.broker_url == "sentinel://:s3cret@10.0.0.1:26379/2;sentinel://:s3cret@10.0.0.2:26379/2"
    assert "s3cret" not in app.backend.as_uri()


def test_bad_and_unreachable_sentinel_urls_end_the_worker_with_one_line(redis_server, demo_dir):
    no_master = run_cli("--checkpoint", str(demo_dir), "--redis", "sentinel://:s3cret@127.0.0.1:26379/0")
    assert no_master.returncode == 2 and "s3cret" not in no_master.stderr and "Traceback" not in no_master.stderr
    assert no_master.stderr.strip().splitlines()[-1] == (
        "vela2 worker: the result store URL 'sentinel://:**@127.0.0.1:26379/0' names no master: add "
        "?master_name=NAME (the name the sentinels monitor)")
    no_host = run_cli("--checkpoint", str(demo_dir), "--redis", redis_server.url(), "--broker",
                      "sentinel://:s3cret@?master_name=m")
    assert no_host.returncode == 2 and "s3cret" not in no_host.stderr
    assert no_host.stderr.strip().splitlines()[-1] == (
        "vela2 worker: the broker URL 'sentinel://:**@?master_name=m' has a segment that names no sentinel host")
    gone = run_cli("--checkpoint", str(demo_dir), "--redis", "sentinel://:s3cret@127.0.0.1:1/0?master_name=m",
                   "--redis-wait-s", "1")
    assert gone.returncode == 2 and "Traceback" not in gone.stderr and "s3cret" not in gone.stderr
    assert gone.stderr.strip().splitlines()[-1].startswith(
        "vela2 worker: Redis at sentinel://:**@127.0.0.1:1/0?master_name=m (result store) did not answer within 1 s")


def test_a_worker_and_a_client_meet_through_sentinel(sentinel_cluster_factory, start_worker):
    cluster = sentinel_cluster_factory(sentinels=1)
    url = cluster.url()
    w = start_worker(url, broker_url=url).wait_ready()
    client = Client(url, model=MODEL, broker_url=url)
    online = client.submit_many([{**ROW, "id": f"on-{i}"} for i in range(5)])
    bulk = client.submit_many([{**ROW, "id": f"bf-{i}"} for i in range(5)], backfill=True, chunk_size=5)
    got = client.results_many(online + bulk, timeout_s=60)
    assert all(r is not None and r.status == "ok" for r in got.values()), got
    master = cluster.master.client()
    assert all(master.exists(result_key(rid)) for rid in online + bulk)
    assert master.zcard(workers_key(MODEL)) == 1  # heartbeats through sentinel too
    assert master.exists("_kombu.binding." + queue_name(MODEL)) and master.hlen("unacked") == 0
    assert w.terminate() == 0
    client.close()


# --- a failover during a run ------------------------------------------------------------------------

N_ROWS = 200
SLICE = 10
KILL_AFTER = 60  # rows submitted when the master is SIGKILLed (the worker is answering by then)
REPORT_ENV = "VELA2_SENTINEL_REPORT"  # where the measured figures are written (default: the test's tmp dir)


def _retrying(what: str, call: Any, deadline: float, counts: dict[str, int]) -> Any:
    """call() until it does not raise a connection-type error (the producer riding out a failover)."""
    while True:
        try:
            return call()
        except RETRYABLE as e:
            counts[what] = counts.get(what, 0) + 1
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} still failing at the deadline: {e}") from None
            time.sleep(0.1)


def _answered(client: Client, ids: list[str], deadline: float, counts: dict[str, int]) -> dict[str, str]:
    """Poll until every id is answered or the deadline passes; id -> state ("answered", "pending", ...)."""
    while True:
        states = {rid: st for rid, (st, _) in _retrying("lookup", lambda: client.lookup_many(ids), deadline + 30,
                                                         counts).items()}
        if all(st == "answered" for st in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(0.2)


def test_a_failover_mid_run_is_measured_and_every_row_is_answered_or_reported(sentinel_cluster_factory,
                                                                               start_worker, tmp_path):
    cluster = sentinel_cluster_factory(sentinels=3)
    url = cluster.url()
    w = start_worker(url, visibility_timeout_s=10, redis_wait_s=30).wait_ready()
    client = Client(url, model=MODEL)
    rows = [{**ROW, "id": f"fo-{i:03d}", "text": f"Row {i}: the sky is green."} for i in range(N_ROWS)]
    ids = [r["id"] for r in rows]
    counts: dict[str, int] = {}
    t0 = time.monotonic()
    deadline = t0 + 45
    killed: dict[str, Any] = {}

    def kill_and_wait() -> None:
        killed["port"] = cluster.kill_master()
        killed["at"] = time.monotonic()
        killed["new_port"] = cluster.wait_failover(killed["port"], timeout_s=20)
        killed["failover_s"] = round(time.monotonic() - killed["at"], 2)

    killer = threading.Thread(target=kill_and_wait)
    for start in range(0, N_ROWS, SLICE):
        if start == KILL_AFTER:
            killer.start()  # the master dies while the producer keeps submitting and the worker answers
        _retrying("submit", lambda s=start: client.submit_many(rows[s:s + SLICE]), deadline, counts)
        time.sleep(0.05)
    killer.join(30)
    assert "failover_s" in killed, "no failover happened"
    states = _answered(client, ids, t0 + 40, counts)
    lost = sorted(rid for rid, st in states.items() if st != "answered")
    # the recovery a producer has: resubmit what has no answer under the same ids (idempotent)
    if lost:
        _retrying("resubmit", lambda: client.submit_many([r for r in rows if r["id"] in set(lost)]),
                  time.monotonic() + 10, counts)
    final = _answered(client, ids, time.monotonic() + 30, counts)
    assert w.terminate() == 0
    stats = w.engine_stats() or {}
    report = {
        "rows": N_ROWS, "sentinels": len(cluster.sentinels), "failover_s": killed["failover_s"],
        "submit_retries": counts.get("submit", 0), "lookup_retries": counts.get("lookup", 0),
        "lost_after_failover": len(lost), "lost_states": {st: sum(1 for r in lost if states[r] == st)
                                                          for st in {states[r] for r in lost}},
        "recovered_by_resubmit": sum(1 for r in lost if final[r] == "answered"),
        "unanswered_at_end": sorted(rid for rid, st in final.items() if st != "answered"),
        "worker_answers_stored": stats.get("answered"), "scored_twice": max(0, (stats.get("answered") or 0) - N_ROWS),
        "duplicate_deliveries_skipped": stats.get("duplicates"), "wall_s": round(time.monotonic() - t0, 1),
    }
    path = Path(os.environ.get(REPORT_ENV) or tmp_path / "sentinel-failover.json")
    with open(path, "a", encoding="utf-8") as f:  # appended: repeated runs build a record
        f.write(json.dumps(report) + "\n")
    print("sentinel failover:", json.dumps(report))
    assert json.loads(path.read_text().splitlines()[-1]) == report  # the figures are recorded
    # every row has an answer, or is reported by name
    assert sum(1 for st in final.values() if st == "answered") + len(report["unanswered_at_end"]) == N_ROWS
    assert not report["unanswered_at_end"], report
    client.close()


@pytest.mark.parametrize("url", ["sentinel://h1;sentinel://h2:26380/3?master_name=m"])
def test_client_builds_a_sentinel_master_client(url):
    client = Client(url, model=MODEL)
    pool = client.redis.connection_pool
    assert pool.service_name == "m" and pool.connection_kwargs["db"] == 3
    assert [(c.connection_pool.connection_kwargs["host"], c.connection_pool.connection_kwargs["port"])
            for c in pool.sentinel_manager.sentinels] == [("h1", 26379), ("h2", 26380)]
