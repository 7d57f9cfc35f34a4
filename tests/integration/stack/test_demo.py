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
    assert "the model: vela2-demo: a toy 2-layer model trained in minutes on synthetic customer-support" in out
    assert "it knows nothing else" in out  # says what it knows, in one line
    assert "on messages unlike its training data (held-out.json): company F1" in out  # and how well
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
    # each address found (its span may start late or run on into the next word: docs/model/demo.md)
    assert "person='Chen Garcia'" in answer_of["demo-pii"] and "@mail.test" in answer_of["demo-pii"]
    assert 'intent: "refund"' in answer_of["demo-systemone"] and "@example.com" in answer_of["demo-systemone"]
    assert [answer_of[f"demo-bulk-{i}"].split("choice:sentiment: ")[1].split()[0] for i in range(3)] == [
        '"positive"', '"negative"', '"neutral"']
    assert "invalid_request" in next(x for x in out.splitlines() if x.startswith("demo-bad "))
    # the long row is labelled as beyond what the demo was trained on
    lines = out.splitlines()
    long_at = next(i for i, x in enumerate(lines) if x.startswith("demo-long "))
    assert "beyond the demo's training" in " ".join(lines[long_at:long_at + 3])
    assert "worker stopped (exit code 0)" in out and "returned 0 to the queue" in out
