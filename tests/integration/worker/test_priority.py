"""Online requests overtake a backfill backlog; expired requests are answered `expired`, never scored."""

from __future__ import annotations

import json
import time

from producer.client import Client
from stack.faults import Faults
from vela2.wire.keys import result_key

MODEL = "vela2-demo"


def row(rid: str) -> dict:
    return {"id": rid, "task": "choice:boolq", "text": f"Request {rid} asks whether the sky is green.",
            "questions": [{"question": "Is the sky green?", "options": ["yes", "no"]}]}


def done_at(client: Client, rid: str) -> str:
    return json.loads(client.redis.get(result_key(rid)))["date_done"]


def test_online_requests_overtake_a_backfill_backlog(redis_url, start_worker):
    client = Client(redis_url, model=MODEL)
    backlog = client.submit_many([row(f"bf-{i:03d}") for i in range(40)], backfill=True, chunk_size=1)
    # a slow device, one request per batch, a small buffer: the backlog drains one by one
    worker = start_worker(redis_url, faults=Faults(delay_s=0.15), max_buffered=2, max_batch_tokens=64,
                          max_wait_ms=0).wait_ready()
    while client.redis.llen(f"vela2.{MODEL}.backfill") > 34:  # the worker is busy with the backlog
        time.sleep(0.05)
    online = [client.submit(row(f"on-{i}")) for i in range(3)]
    got = client.results_many([*online, *backlog], timeout_s=120)
    assert all(r is not None and r.status.value == "ok" for r in got.values())
    last_online = max(done_at(client, i) for i in online)
    later_backfill = [i for i in backlog if done_at(client, i) > last_online]
    # online went ahead of all but the few backfill requests already held or running
    assert len(later_backfill) >= 25, f"only {len(later_backfill)} backfill requests finished after online"
    worker.terminate()


def test_expired_requests_are_answered_expired_not_scored(redis_url, start_worker):
    client = Client(redis_url, model=MODEL)
    live = client.submit(row("live-1"), deadline_s=600)
    passed = time.monotonic() + 0.01
    dead = client.submit(row("dead-1"), deadline_s=0.01)
    while time.monotonic() <= passed:  # the deadline passes before any worker runs
        time.sleep(0.005)
    worker = start_worker(redis_url).wait_ready()
    got = client.results_many([live, dead], timeout_s=60)
    assert got[live].status.value == "ok"
    assert got[dead].status.value == "expired" and got[dead].answers is None
    assert "expired" in got[dead].error.message or got[dead].error.type == "expired"
    worker.terminate()
