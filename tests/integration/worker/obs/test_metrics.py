"""The metrics endpoint of a real worker process: names, counts, queue depth, padding."""

from __future__ import annotations

import json
import re
import time
import urllib.request

from prometheus_client import generate_latest

from producer.client import Client
from stack.harness import free_port
from tests.unit.worker.obs.test_metrics import scrape
from vela2.train.demo_model import sample_rows
from vela2.wire.keys import online_queue
from vela2.wire.messages import build_message
from worker.obs.metrics import Metrics


def value(text: str, name: str, **labels: str) -> float:
    """The value of one sample; fails when it is absent."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # the client sorts label names
    pattern = rf"^{re.escape(name)}" + (rf"\{{{re.escape(want)}\}}" if want else "") + r" ([0-9.e+-]+)$"
    m = re.search(pattern, text, re.M)
    assert m, f"{name}{{{want}}} not in the metrics"
    return float(m.group(1))


def test_metrics_endpoint_of_a_real_worker(redis_url, start_worker):
    port = free_port()
    worker = start_worker(redis_url, metrics_port=port).wait_ready()
    client = Client(redis_url, model="vela2-demo")
    rows = sample_rows()
    bad = {"id": "m-bad", "task": "choice:x", "text": "hi", "questions": [{"options": ["a", "b"]}], "extra": 1}
    ids = [client.submit(r) for r in rows]
    client.redis.lpush(online_queue("vela2-demo"), b"not a celery message")  # dropped, logged
    msg = build_message([bad], online_queue("vela2-demo"))  # schema-invalid: error result
    client.redis.lpush(online_queue("vela2-demo"), msg.payload)
    answers = client.results_many([*ids, "m-bad"], timeout_s=120)
    assert all(answers[i] is not None for i in ids) and answers["m-bad"].status.value == "error"
    deadline = time.monotonic() + 30  # the metrics count a result right after it is stored
    while value(text := scrape(port), "vela2_requests_total", status="error") != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert value(text, "vela2_requests_total", status="ok") == len(rows)
    assert value(text, "vela2_requests_total", status="error") == 1
    assert value(text, "vela2_failures_total", reason="invalid_request") == 1
    assert value(text, "vela2_queue_depth", queue=online_queue("vela2-demo")) == 0
    assert value(text, "vela2_unacked_messages") == 0
    assert value(text, "vela2_batch_size_count") >= 1
    assert value(text, "vela2_batch_tokens_sum") > 0
    assert value(text, "vela2_batch_padding_fraction_count") >= 1
    for stage in ("queue", "render", "model", "decode"):
        assert value(text, "vela2_request_duration_seconds_count", stage=stage) == len(rows)
    assert value(text, "vela2_worker_info", model="vela2-demo", device="cpu", precision="fp32") == 1
    assert value(text, "process_resident_memory_bytes") > 50e6  # the process's own, on the same port
    for path, key in (("/livez", "live"), ("/readyz", "ready")):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            body = json.loads(r.read())
        assert r.status == 200 and body[key] is True and body["model"] == "vela2-demo" and len(body["digest"]) == 32
    # queue depth counts what waits: stop the worker, enqueue, scrape a fresh collector
    worker.terminate()
    for r in rows[:3]:
        client.submit(dict(r, id=r["id"] + "-later"))
    m = Metrics()
    m.describe_worker(model="vela2-demo", device="cpu", precision="fp32", redis=client.redis,
                      queues=[online_queue("vela2-demo")])
    later = generate_latest(m.registry).decode()
    assert value(later, "vela2_queue_depth", queue=online_queue("vela2-demo")) == 3


