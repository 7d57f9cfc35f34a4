"""Completion webhooks of `vela2 http` (producer.webhooks) for real: a receiver on loopback that
answers 500 once, then 200; the route retries with the same event id and signs every attempt per
Standard Webhooks, checked by the `openai` package's own verifier (an implementation independent of
ours); URLs outside the operator's allowlist are refused before any job exists."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
import redis as redis_lib

from producer.webhooks import WEBHOOKS_KEY, new_secret
from stack.harness import free_port
from vela2.wire.keys import job_key

pytestmark = pytest.mark.integration

MODEL = "vela2-demo"


class Receiver:
    """An HTTP endpoint that records every POST (headers, body) and answers the statuses queued."""

    def __init__(self, statuses: list[int]):
        self.got: list[tuple[dict[str, str], bytes, int]] = []
        self.statuses = statuses
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                status = outer.statuses.pop(0) if outer.statuses else 200
                outer.got.append(({k.lower(): v for k, v in self.headers.items()}, body, status))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, n: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.got) < n:
            assert time.monotonic() < deadline, self.got
            time.sleep(0.05)


def batch_file(n: int) -> bytes:
    rows = [{"custom_id": f"c-{i}", "body": {"id": f"r-{i}", "task": "choice:boolq", "text": f"text {i}",
                                             "questions": [{"question": "Is it?", "options": ["yes", "no"]}]}}
            for i in range(n)]
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


def test_a_jobs_end_is_posted_signed_and_retried_until_acknowledged(redis_url, http_server, fake_worker):
    receiver = Receiver([500])  # the first attempt fails: the event comes again
    secret = new_secret()
    worker = fake_worker()
    base = http_server(redis_url, "--webhook-allow", f"http://127.0.0.1:{receiver.port}", "--webhook-secret", secret)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    f = client.files.create(file=("in.jsonl", batch_file(3)), purpose="batch")
    hook = f"http://127.0.0.1:{receiver.port}/hooks/vela2"
    done = client.batches.create(input_file_id=f.id, endpoint="/v1/system_one", completion_window="24h",
                                 extra_body={"webhook_url": hook})
    receiver.wait_for(2)
    (h1, b1, s1), (h2, b2, s2) = receiver.got[:2]
    assert (s1, s2) == (500, 200) and h1["webhook-id"] == h2["webhook-id"] and b1 == b2
    verifier = openai.OpenAI(api_key="x", webhook_secret=secret)
    for headers, body, _ in receiver.got[:2]:
        evt = verifier.webhooks.unwrap(body, headers)  # raises InvalidWebhookSignatureError on a bad signature
        assert evt.type == "batch.completed" and evt.data.id == done.id and evt.id == headers["webhook-id"]
    with pytest.raises(openai.InvalidWebhookSignatureError):
        openai.OpenAI(api_key="x", webhook_secret=new_secret()).webhooks.unwrap(b2, h2)  # another secret
    r = redis_lib.Redis.from_url(redis_url)
    deadline = time.monotonic() + 10
    while r.zscore(WEBHOOKS_KEY, done.id) is not None:  # acknowledged: no longer due
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert r.hget(job_key(done.id), "webhook_attempts") == b"2"
    assert client.batches.retrieve(done.id).status == "completed"

    worker.pause()  # a cancelled job's event too
    second = client.batches.create(input_file_id=f.id, endpoint="/v1/system_one", completion_window="24h",
                                   extra_body={"webhook_url": hook})
    client.batches.cancel(second.id)
    worker.resume()
    receiver.wait_for(3)
    evt = verifier.webhooks.unwrap(receiver.got[2][1], receiver.got[2][0])
    assert evt.type == "batch.cancelled" and evt.data.id == second.id


def test_webhook_urls_outside_the_allowlist_are_refused_before_a_job_exists(redis_url, http_server):
    base = http_server(redis_url, "--webhook-allow", "https://*.hooks.example", "--webhook-secret", new_secret())
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    f = client.files.create(file=("in.jsonl", batch_file(1)), purpose="batch")
    for url in ("http://169.254.169.254/latest/meta-data", "https://hooks.example.evil.com/x",
                "http://a.hooks.example/x", "https://a.hooks.example:8443/x", "https://user:pw@a.hooks.example/",
                "not a url", "https://" + "a" * 3000):
        with pytest.raises(openai.BadRequestError) as refused:
            client.batches.create(input_file_id=f.id, endpoint="/v1/system_one", completion_window="24h",
                                  extra_body={"webhook_url": url})
        assert refused.value.body["param"] == "webhook_url", url
    assert client.batches.list().data == []  # nothing was created
    ok = client.batches.create(input_file_id=f.id, endpoint="/v1/system_one", completion_window="24h",
                               extra_body={"webhook_url": "https://a.hooks.example/x"})
    assert ok.id.startswith("batch_")
    off = http_server(redis_url)  # no --webhook-allow: webhooks are off, and say so
    with pytest.raises(openai.BadRequestError, match="webhook-allow"):
        openai.OpenAI(base_url=f"{off}/v1", api_key="x", max_retries=0).batches.create(
            input_file_id=f.id, endpoint="/v1/system_one", completion_window="24h",
            extra_body={"webhook_url": "https://a.hooks.example/x"})


def test_a_keys_webhook_url_and_secret_serve_its_jobs_that_name_none(redis_url, http_server, fake_worker, tmp_path):
    from dataclasses import replace

    from producer.auth import new_key

    receiver = Receiver([])
    tenant_secret = new_secret()
    key, api_key = new_key("acme")
    hook = f"http://127.0.0.1:{receiver.port}/acme"
    keys = tmp_path / "keys.jsonl"
    keys.write_text(replace(api_key, webhook_url=hook, webhook_secret=tenant_secret).line() + "\n")
    fake_worker()
    base = http_server(redis_url, "--api-keys-file", str(keys), "--webhook-allow", f"http://127.0.0.1:{receiver.port}",
                       "--webhook-secret", new_secret())  # the route's secret: not the one acme's events use
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    f = client.files.create(file=("in.jsonl", batch_file(2)), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/system_one", completion_window="24h")
    receiver.wait_for(1)
    headers, body, _ = receiver.got[0]
    evt = openai.OpenAI(api_key="x", webhook_secret=tenant_secret).webhooks.unwrap(body, headers)
    assert evt.data.id == b.id and evt.type == "batch.completed"

    bad = tmp_path / "bad.jsonl"  # a key's webhook_url outside the allowlist: refused at start, not per job
    bad.write_text(replace(api_key, webhook_url="https://elsewhere.example/x").line() + "\n")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "producer.http.app", "--redis", redis_url, "--api-keys-file", str(bad),
                          "--webhook-allow", f"http://127.0.0.1:{receiver.port}", "--webhook-secret", new_secret()],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "webhook_url of tenant 'acme'" in out.stderr and "allowlist" in out.stderr
