"""Broker and result store apart: a worker whose queues live on one redis-server and whose results on
another; bad and unreachable broker URLs end the worker with one line."""

from __future__ import annotations

import subprocess
import sys

from producer.client import Client
from stack.harness import ROOT, child_env
from tests.unit.worker.transport.test_brokers import MODEL, ROW
from vela2.wire.keys import queue_name, result_key, workers_key


def run_cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vela2.cli", "worker", *args], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=timeout_s)


def test_a_worker_takes_from_one_redis_and_stores_in_another(redis_server_factory, start_worker):
    results, queues = redis_server_factory(), redis_server_factory()
    w = start_worker(results.url(), broker_url=queues.url()).wait_ready()
    client = Client(results.url(), model=MODEL, broker_url=queues.url())
    online = client.submit_many([{**ROW, "id": f"on-{i}"} for i in range(5)])
    bulk = client.submit_many([{**ROW, "id": f"bf-{i}"} for i in range(5)], backfill=True, chunk_size=5)
    got = client.results_many(online + bulk, timeout_s=60)
    assert all(r is not None and r.status == "ok" for r in got.values()), got
    store, broker = results.client(), queues.client()
    assert all(store.exists(result_key(rid)) for rid in online + bulk)
    assert not broker.keys("celery-task-meta-*") and not broker.keys("vela2:*")  # no result, marker or count
    assert store.zcard(workers_key(MODEL)) == 1 and not broker.exists(workers_key(MODEL))  # heartbeat
    # the queues and their held records are the broker's only
    assert broker.exists("_kombu.binding." + queue_name(MODEL)) and not store.keys("_kombu*")
    assert not store.keys("unacked*") and broker.hlen("unacked") == 0  # every message acked
    assert w.terminate() == 0
    client.close()


def test_bad_and_unreachable_broker_urls_end_the_worker_with_one_line(redis_server, demo_dir):
    bad = run_cli("--checkpoint", str(demo_dir), "--redis", redis_server.url(), "--broker",
                  "kafka://user:s3cret@127.0.0.1:9092/0")
    assert bad.returncode == 2 and "s3cret" not in bad.stderr, bad.stderr
    assert bad.stderr.strip().splitlines()[1:] == [  # after the warning of a password in argv
        "vela2 worker: the broker URL 'kafka://user:**@127.0.0.1:9092/0' has scheme 'kafka'; "
        "expected one of redis://, rediss://, sentinel://, amqp://, amqps://, pyamqp://"]
    gone = run_cli("--checkpoint", str(demo_dir), "--redis", redis_server.url(), "--broker",
                   "redis://:s3cret@127.0.0.1:1/0", "--redis-wait-s", "1")
    last = gone.stderr.strip().splitlines()[-1]
    assert gone.returncode == 2 and "Traceback" not in gone.stderr and "s3cret" not in gone.stderr
    assert last.startswith("vela2 worker: Redis at redis://:**@127.0.0.1:1/0 (broker) did not answer within 1 s")
