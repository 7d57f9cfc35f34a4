"""Task events for Flower: a worker with events on announces every request it answers."""

from __future__ import annotations

import threading
import time

from celery import Celery

from producer.client import Client
from vela2.train.demo_model import sample_rows


def test_worker_sends_task_events_for_flower(redis_url, start_worker):
    app = Celery("events-test", broker=redis_url, set_as_current=False)
    seen: dict[str, list[str]] = {}
    ready = threading.Event()

    def capture() -> None:
        with app.connection_for_read() as conn:
            recv = app.events.Receiver(conn, handlers={"*": lambda e: seen.setdefault(e["type"], []).append(
                e.get("uuid", ""))})
            ready.set()
            try:
                recv.capture(limit=None, timeout=60, wakeup=False)
            except Exception:  # the timeout ends the capture
                pass

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    assert ready.wait(10)
    worker = start_worker(redis_url, task_events=1).wait_ready()
    client = Client(redis_url, model="vela2-demo")
    rows = sample_rows()[:3]
    bad = {"id": "ev-bad", "task": "choice:x", "text": "hi", "questions": [{"options": ["a"]}]}
    ids = [client.submit(r) for r in rows] + [client.submit(bad, validate=False)]
    got = client.results_many(ids, timeout_s=120)
    assert all(got[i] is not None for i in ids)
    def all_seen() -> bool:  # events follow the stored results: wait for every one of them
        return (set(ids) <= set(seen.get("task-received", [])) and "ev-bad" in seen.get("task-failed", [])
                and {r["id"] for r in rows} <= set(seen.get("task-succeeded", [])))

    deadline = time.monotonic() + 10
    while not all_seen() and time.monotonic() < deadline:
        threading.Event().wait(0.1)
    assert set(ids) <= set(seen.get("task-received", []))
    assert {r["id"] for r in rows} <= set(seen.get("task-succeeded", []))
    assert seen.get("task-failed") == ["ev-bad"]
    worker.terminate()
