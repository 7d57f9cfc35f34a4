"""Poison requests with real worker processes: a request that kills every worker that runs it ends,
after max_attempts deliveries, as a "poison" error answer and an entry in the dead-letter list."""

from __future__ import annotations

import json
import time

import pytest

from producer.client import Client
from stack.faults import CRASH_EXIT, Faults
from vela2.api.schemas import Status
from vela2.wire.keys import UNACKED_KEY, attempts_key, dead_letter, online_queue
from vela2.wire.results import read_results

MODEL = "vela2-demo"
TEXT = "Alice from Acme wrote to the support team about order 4471 and asked whether the refund was sent."


# --- the real thing: crashing worker processes, restarted by a supervisor ----------------------


@pytest.mark.integration
def test_a_request_that_kills_every_worker_ends_in_the_dead_letter_list(redis_url, start_worker):
    # A short visibility timeout (a crashed worker's messages come back soon) that still passes the
    # start-up check on a busy runner: 2 buffered messages, one window per batch.
    settings = {"visibility_timeout_s": 10, "max_buffered": 2, "max_batch_tokens": 768, "max_wait_ms": 50}
    faults = Faults(crash_prefix="poison-")
    client = Client(redis_url, model=MODEL)
    r = client.redis
    rows = [
        {"id": f"good-{i}", "task": "choice:boolq", "text": f"{TEXT} {i}", "questions": [{"options": ["yes", "no"]}]}
        for i in range(6)
    ]
    rows.insert(2, {**rows[0], "id": "poison-1"})
    ids = client.submit_many(rows)

    exits: list[int] = []
    worker = start_worker(redis_url, faults=faults, **settings)
    deadline = time.monotonic() + 240
    while True:  # the supervisor: restart the worker whenever it dies
        got = read_results(r, ids)
        if all(v is not None for v in got.values()):
            break
        assert time.monotonic() < deadline, f"exits {exits}; missing {[k for k, v in got.items() if v is None]}"
        if worker.proc.poll() is not None:
            exits.append(worker.proc.returncode)
            assert exits[-1] == CRASH_EXIT, f"worker exited with {exits[-1]}:\n{worker.log()[-3000:]}"
            assert len(exits) <= 3, f"crash loop: {exits}\n{worker.log()[-3000:]}"
            worker = start_worker(redis_url, faults=faults, **settings)
        time.sleep(0.1)

    assert exits == [CRASH_EXIT] * 3  # the poison ran three times, then never again
    poison = got.pop("poison-1")
    assert poison.status == Status.error and poison.error.type == "poison"
    assert poison.error.message == f"request crashed the worker 3 times; moved to {dead_letter(MODEL)}"
    assert all(v.status == Status.ok for v in got.values())  # innocent company was answered
    entries = [json.loads(x) for x in r.lrange(dead_letter(MODEL), 0, -1)]
    assert [e["id"] for e in entries] == ["poison-1"] and entries[0]["request"]["text"] == rows[0]["text"]
    deadline = time.monotonic() + 30
    while r.llen(online_queue(MODEL)) or r.hlen(UNACKED_KEY):  # every message acked
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.05)
    assert not r.keys(attempts_key("*"))
    assert worker.terminate() == 0
    assert "1 dead-lettered" in worker.log()
    client.close()
