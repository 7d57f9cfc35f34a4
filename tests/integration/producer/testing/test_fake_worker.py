"""producer.testing.FakeWorker against a real worker: it stores what the real worker stores for the
same requests; and the pytest plugin's fixtures name the extra when fakeredis has no Lua."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from producer import Client
from producer.testing import FAKE_META_KEY, FakeWorker
from tests.unit.producer.testing.test_fake_worker import MODEL, QUEUE, ROW, S1, _meta
from vela2.wire import keys
from vela2.wire.messages import build_message
from vela2.wire.results import DEFAULT_ONLINE_RESULT_EXPIRES_S


def _comparable(meta: dict) -> dict:
    """A stored meta less what differs between two runs (when, how long, which fake)."""
    out = {k: v for k, v in meta.items() if k not in ("date_done", FAKE_META_KEY)}
    for key in ("vela2", "vela2_answer", "result"):
        if isinstance(out.get(key), dict):
            out[key] = {k: v for k, v in out[key].items() if k != "timings"}
    return out


def _assert_close(a, b, path="meta"):
    """Equal structure and values, floats within the batch-shape noise floor."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-4), path
    elif isinstance(a, dict) and isinstance(b, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            _assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_close(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_the_fake_worker_stores_what_the_real_worker_stores(redis_url, real_worker, demo_dir, vela2_redis):
    """The same requests through a real worker process and through FakeWorker(answer="model") on the
    same checkpoint: every stored meta the same, key for key (numbers within float noise), with the
    same TTL (online_result_expires_s: none of them is a bulk job's line)."""
    rows = [ROW, {**ROW, "id": "r-2", "text": "Paris is in France.", "units": True,
                  "task": "span:pii", "questions": [{"labels": ["person", "place"]}]}]
    bad = [{**ROW, "id": "bad-row", "questions": [{"options": ["one"]}]}, {**S1, "id": "bad-model", "model": "other"},
           {**S1, "id": "bad-s1", "tasks": []}]
    chunk = [{**ROW, "id": f"c-{i}", "text": f"Row {i} of a chunk."} for i in range(3)]
    real = Client(redis_url, model=MODEL)
    fake = Client(redis=vela2_redis.client(), model=MODEL)
    worker = FakeWorker(vela2_redis.client(), answer="model", checkpoint=demo_dir)  # fp32 on a CPU, as the worker
    late = build_message([{**ROW, "id": "late"}], QUEUE, expires=datetime.now(UTC) - timedelta(seconds=1))
    for client in (real, fake):
        client.submit_many([*rows, S1])
        for request in bad:
            client.redis.lpush(QUEUE, build_message([request], QUEUE).payload)
        client.redis.lpush(QUEUE, build_message(chunk, QUEUE, chunk=True, message_id="chunk-fixed").payload)
        client.redis.lpush(QUEUE, late.payload)
    worker.drain()
    real_worker(redis_url)
    ids = [r["id"] for r in [*rows, S1, *bad, *chunk]] + ["late"]
    assert None not in real.results_many(ids, timeout_s=120).values()
    deadline = time.monotonic() + 30  # the chunk's summary is stored after its rows
    while real.redis.get(keys.result_key("chunk-fixed")) is None:
        assert time.monotonic() < deadline, "no summary of the chunk"
        time.sleep(0.05)
    for rid in [*ids, "chunk-fixed"]:
        want, got = _meta(real.redis, rid), _meta(fake.redis, rid)
        assert got[FAKE_META_KEY] == "model" and FAKE_META_KEY not in want
        _assert_close(_comparable(got), _comparable(want), rid)
        ttls = [c.redis.ttl(keys.result_key(rid)) for c in (real, fake)]
        assert all(3_000 < t <= DEFAULT_ONLINE_RESULT_EXPIRES_S for t in ttls), (rid, ttls)
    real.close()


@pytest.mark.integration  # a pytest subprocess
def test_the_fixtures_name_the_extra_when_fakeredis_has_no_lua(tmp_path):
    import subprocess
    import sys

    from stack.harness import child_env

    (tmp_path / "test_user.py").write_text(
        "import sys\nsys.modules['lupa'] = None  # as if fakeredis[lua] were not installed\n\n"
        "def test_uses_the_client(vela2_client):\n    pass\n\n"
        "def test_a_fake_worker_on_it():\n"
        "    import fakeredis, pytest\n"
        "    from producer.testing import FakeWorker\n"
        "    with pytest.raises(RuntimeError, match=r\"cannot run Lua scripts .* the 'testing' extra: pip install\"):\n"
        "        FakeWorker(fakeredis.FakeRedis())\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=tmp_path,
                         env=child_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "1 passed, 1 error" in run.stdout, run.stdout
    assert "During handling" not in run.stdout  # one message, no chained traceback
    assert ("the vela2 fixtures need fakeredis with Lua support: the 'testing' extra: pip install -e "
            "'.[testing]' -c constraints.txt in a checkout, or 'dist/<wheel>[testing]'") in run.stdout


