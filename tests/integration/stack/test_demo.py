"""`vela2 demo` (stack.demo.run_demo): embedded Redis, a worker, every request type, clean stop."""

from __future__ import annotations

import pytest
import redis

from stack import demo, harness

pytestmark = pytest.mark.integration  # a worker process, a redis-server


def test_embedded_redis_prefers_redis_server(tmp_path, redis_server):
    with harness.embedded_redis(tmp_path) as (url, what):
        assert what.startswith("redis-server")
        client = redis.Redis.from_url(url)
        assert client.ping()
        client.close()
    client = redis.Redis.from_url(url)
    try:
        client.ping()
        raise AssertionError("the embedded redis-server still answers after the demo")
    except redis.ConnectionError:
        pass
    finally:
        client.close()


def test_demo_runs_on_fakeredis_when_redis_server_is_missing(demo_dir, monkeypatch, capsys):
    monkeypatch.setattr(harness, "find_redis_server", lambda: None)
    assert demo.run_demo(checkpoint=demo_dir) == 0
    out = capsys.readouterr().out
    assert "fakeredis TcpFakeServer" in out and "demo OK" in out
    assert "the model: a 2-layer demo scorer trained on synthetic customer messages" in out  # says what it knows
    assert "text 'Hi, my name is Maria Lopez from Globex. Where is my package, it has...'; " \
           "asked: What does the customer want?" in out
    for rid in (
        "demo-choice",
        "demo-score",
        "demo-set",
        "demo-pii",
        "demo-bundle",
        "demo-long",
        "demo-long-choice",
        "demo-systemone",
        "demo-bad",
        "demo-bulk-0",
    ):
        line = next(x for x in out.splitlines() if x.startswith(rid + " "))
        assert "NO ANSWER" not in line, line
    # the answers a reader expects (the model was trained on messages like these)
    answer_of = {x.split()[0]: x for x in out.splitlines() if x.startswith("demo-")}
    assert 'choice:intent: "delivery"' in answer_of["demo-choice"]
    assert 'set:toxicity: ["insult", "threat"]' in answer_of["demo-set"]
    # e-mails by their tail: the local part's first name is where a model trained on another CPU may
    # start the span later (README, "The demo model")
    assert "person='Chen Garcia'" in answer_of["demo-pii"] and "garcia7@mail.test'" in answer_of["demo-pii"]
    assert 'intent: "refund"' in answer_of["demo-systemone"] and "evans4@example.com'" in answer_of["demo-systemone"]
    assert [answer_of[f"demo-bulk-{i}"].split("choice:sentiment: ")[1].split()[0] for i in range(3)] == [
        '"positive"', '"negative"', '"neutral"']
    assert "invalid_request" in next(x for x in out.splitlines() if x.startswith("demo-bad "))
    assert "worker stopped (exit code 0)" in out and "returned 0 to the queue" in out
