"""Fail fast when nothing serves (issue 40), against a real Redis and the real HTTP route: a wait with
no worker of the model ends with NoWorker once the grace period has passed, well before its timeout;
a slow live worker is waited for past the grace; POST /v1/system_one answers 503 ``no_worker`` for a
wait (the request stays queued and is answered once a worker comes) and 202 for wait_s=0."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import redis

from producer import Client
from producer.liveness import MIN_GRACE_S
from vela2.errors import NoWorker
from vela2.wire import keys

MODEL = "vela2-demo"
ROW = {"task": "choice:boolq", "text": "The sky is green.", "questions": [{"options": ["yes", "no"]}]}
LONG_S = 120.0  # far beyond the grace: NoWorker must come well before it


def system_one(rid: str) -> dict:
    return {"model": MODEL, "id": rid, "input": {"user": f"Where is my refund? ({rid})"},
            "tasks": [{"name": "intent", "kind": "choice", "options": ["refund", "other"]}]}


@contextmanager
def beating(url: str, every_s: float = 1.0) -> Iterator[None]:
    """A worker's heartbeat (as worker.runtime.leases writes it) from a thread, for a fake worker,
    which beats none."""
    r = redis.Redis.from_url(url)
    stop = threading.Event()

    def run() -> None:
        while True:
            r.zadd(keys.workers_key(MODEL), {"beater@test": time.time()})
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=run, name="test-beater", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        r.close()


def test_with_no_worker_at_all_a_wait_ends_after_the_grace_not_the_timeout(redis_url):
    with Client(redis_url, model=MODEL, no_worker_grace_s=MIN_GRACE_S) as client:
        rid = client.submit({"id": "nw-none", **ROW})
        start = time.monotonic()
        with pytest.raises(NoWorker, match=f"no worker of model '{MODEL}' has beaten in the last") as e:
            client.result(rid, timeout_s=LONG_S)
        waited = time.monotonic() - start
        assert MIN_GRACE_S <= waited < LONG_S / 2, waited  # the grace ran from the first look
        assert "none on record" in str(e.value) and client.status(rid) == "no_worker"


def test_a_slow_live_worker_is_waited_for_past_the_grace(redis_url, fake_worker):
    with beating(redis_url), Client(redis_url, model=MODEL, no_worker_grace_s=MIN_GRACE_S) as client:
        fake_worker(delay_s=MIN_GRACE_S + 5)  # busy with each request for longer than the grace
        rid = client.submit({"id": "nw-slow", **ROW})
        assert client.result(rid, timeout_s=LONG_S).status == "ok"


def test_the_route_answers_503_no_worker_for_a_wait_and_keeps_the_request_queued(redis_url, http_server,
                                                                                  fake_worker):
    r = redis.Redis.from_url(redis_url)
    r.zadd(keys.workers_key(MODEL), {"crashed@test": time.time() - 300})  # a worker that died long ago
    base = http_server(redis_url)
    with httpx.Client(base_url=base, timeout=60) as http:
        start = time.monotonic()
        got = http.post("/v1/system_one", params={"wait_s": 30}, json=system_one("nw-route"))
        assert got.status_code == 503, got.text
        assert time.monotonic() - start < 20  # not the 30 s wait
        body = got.json()
        assert body["status"] == "error" and body["id"] == "nw-route" and body["model"] == MODEL
        assert body["error"]["type"] == "no_worker" and "no worker of model 'vela2-demo'" in body["error"]["message"]
        assert got.headers["Location"].endswith("/v1/results/nw-route")

        queued = http.post("/v1/system_one", params={"wait_s": 0}, json=system_one("nw-route-2"))
        assert queued.status_code == 202 and queued.json()["status"] == "pending"  # no wait: accepted

        fake_worker()  # a worker comes: both are answered, the refused wait's request too
        deadline = time.monotonic() + 60
        for rid in ("nw-route", "nw-route-2"):
            while (answer := http.get(f"/v1/results/{rid}")).status_code == 202:
                assert time.monotonic() < deadline, f"{rid} not answered"
                time.sleep(0.05)
            assert answer.status_code == 200 and answer.json()["status"] == "ok", answer.text
    r.close()


def test_the_routes_grace_is_its_no_worker_grace_s(redis_url, http_server):
    r = redis.Redis.from_url(redis_url)
    r.zadd(keys.workers_key(MODEL), {"crashed@test": time.time() - 300})  # beat 300 s ago
    # a grace longer than that: the crashed worker still counts, the wait runs to its wait_s
    patient = http_server(redis_url, "--no-worker-grace-s", "900")
    off = http_server(redis_url, "--no-worker-grace-s", "0")  # never: the same
    for base, rid in ((patient, "nw-patient"), (off, "nw-off")):
        with httpx.Client(base_url=base, timeout=60) as http:
            start = time.monotonic()
            got = http.post("/v1/system_one", params={"wait_s": 1.5}, json=system_one(rid))
            assert got.status_code == 202 and got.json()["status"] == "pending", got.text  # not 503 no_worker
            assert time.monotonic() - start >= 1.5
    r.close()
