"""Fair share across tenants with a real worker: one tenant's backlog does not hold back another's
requests (issue 38, point 3)."""

from __future__ import annotations

import time

from producer.client import Client
from stack.faults import Faults
from vela2.wire import fleet, keys

MODEL = "vela2-demo"


def row(rid: str) -> dict:
    return {"id": rid, "task": "choice:boolq", "text": f"Request {rid} asks whether the sky is green.",
            "questions": [{"question": "Is the sky green?", "options": ["yes", "no"]}]}


def a_backlog(redis_url: str, start_worker, tenant_a: str | None, tenant_b: str | None) -> tuple[int, int]:
    """Tenant A queues 200 requests; once a slow worker runs them one at a time, tenant B sends 3.
    Returns (A's requests not answered when B's last answer came, A's requests in all)."""
    a = Client(redis_url, model=MODEL, tenant=tenant_a)
    b = Client(redis_url, model=MODEL, tenant=tenant_b)
    backlog = a.submit_many([row(f"a-{i:03d}") for i in range(200)])
    # a slow device, one request per batch, a small buffer: A's backlog drains one by one
    worker = start_worker(redis_url, faults=Faults(delay_s=0.05), max_buffered=4, max_batch_tokens=64,
                          max_wait_ms=0).wait_ready()
    deadline = time.monotonic() + 60
    while len([r for r in a.lookup_many(backlog).values() if r[0] == "pending"]) > 195:  # busy with A's
        assert time.monotonic() < deadline, "the worker never started on A's backlog"
        time.sleep(0.05)
    mine = [b.submit(row(f"b-{i}")) for i in range(3)]
    got = b.results_many(mine, timeout_s=120)
    assert all(r is not None and r.status.value == "ok" for r in got.values())
    left = sum(1 for state, _ in a.lookup_many(backlog).values() if state == "pending")
    worker.terminate()
    return left, len(backlog)


def test_a_tenants_requests_overtake_another_tenants_backlog(redis_url, start_worker):
    left, total = a_backlog(redis_url, start_worker, "acme", "beta")
    # beta's requests went in turn with acme's, not behind its backlog
    assert left >= 150, f"only {left} of acme's {total} requests were still waiting when beta's were answered"


def test_depths_tell_each_tenants_messages_apart(redis_url):
    acme, beta, keyless = (Client(redis_url, model=MODEL, tenant=t) for t in ("acme", "beta", None))
    acme.submit_many([row(f"x-{i}") for i in range(5)])
    beta.submit(row("y"), backfill=True)
    keyless.submit(row("z"))
    q, bq = keys.online_queue(MODEL), keys.backfill_queue(MODEL)
    totals, tenants = fleet.depths(acme.redis, [q, bq])
    assert (totals[q], totals[bq]) == (6, 1)
    assert tenants == {q: {"acme": 5}, bq: {"beta": 1}}
    assert acme.redis.llen(keys.tenant_list(q, "acme")) == 5 and acme.redis.llen(q) == 1
