"""Model identity across the fleet (issue 23): every answer names the model, checkpoint digest and
precision; a worker describes itself with its heartbeat; `vela2 status` shows queues and live workers;
a worker refuses to serve a model name that a live worker serves from another checkpoint."""

from __future__ import annotations

import json
import time

import redis

from producer import Client
from producer import status as status_cli
from vela2.model import checkpoint
from vela2.wire import fleet, keys

MODEL = "vela2-demo"


def _poll(fn, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def test_a_worker_describes_itself_and_vela2_status_shows_it(redis_url, start_worker, demo_dir, capsys):
    w = start_worker(redis_url).wait_ready()
    digest = checkpoint.digest(demo_dir)
    client = Client(redis_url, model=MODEL)
    ids = client.submit_many([{"id": f"f-{k}", "task": "choice:boolq", "text": "Is the sky blue?",
                               "questions": [{"question": "Is it?", "options": ["yes", "no"]}]} for k in range(5)])
    results = client.results_many(ids, timeout_s=60)
    assert all(r.status == "ok" for r in results.values())
    served = {json.dumps(r.served_by.model_dump(), sort_keys=True) for r in results.values()}
    assert served == {json.dumps({"digest": digest, "name": MODEL, "precision": "fp32", "batch_invariant": False},
                                 sort_keys=True)}

    r = redis.Redis.from_url(redis_url)
    live = _poll(lambda: [x for x in fleet.live_workers(r, MODEL) if x.get("answered", {}).get("ok") == 5],
                 what="a heartbeat counting the 5 answers")
    (info,) = live
    assert info["digest"] == digest and info["precision"] == "fp32" and info["device"] == "cpu"
    assert info["pid"] == w.pid and info["held"] == 0 and info["batches"] >= 1

    assert status_cli.main(["--redis", redis_url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["redis"] == redis_url  # which Redis it read (the default 127.0.0.1:6379 unless given)
    model = shown["models"][MODEL]
    assert model["queues"] == {"online": 0, "backfill": 0} and model["dead"] == 0
    assert [x["digest"] for x in model["workers"]] == [digest]
    assert status_cli.main(["--redis", redis_url]) == 0
    screen = capsys.readouterr().out
    assert screen.splitlines()[0] == f"reading {redis_url}"
    assert f"{MODEL}: online 0 | backfill 0 | dead letters 0 | live workers 1" in screen
    assert digest[:12] in screen and "MIXED" not in screen

    assert w.terminate() == 0  # a worker that stops takes its description with it
    assert fleet.live_workers(r, MODEL) == [] and r.get(keys.worker_info_key(MODEL, info["worker"])) is None


def _fake_live_worker(r: redis.Redis, digest: str) -> None:
    """Another worker of MODEL, live, serving a checkpoint with `digest`."""
    r.zadd(keys.workers_key(MODEL), {"elsewhere:1:cuda:0": time.time() + 120})  # stays fresh through the test
    r.set(keys.worker_info_key(MODEL, "elsewhere:1:cuda:0"), json.dumps({"digest": digest, "device": "cuda:0"}))


def test_a_worker_refuses_a_model_name_served_from_another_checkpoint(redis_url, start_worker):
    r = redis.Redis.from_url(redis_url)
    _fake_live_worker(r, "0" * 32)
    refused = start_worker(redis_url)
    assert refused.wait_exit(120) == 2
    last = refused.log().strip().splitlines()[-1]
    assert "live workers serve vela2-demo from other checkpoints: elsewhere:1:cuda:0 (000000000000)" in last
    assert "--allow-mixed 1" in last

    allowed = start_worker(redis_url, allow_mixed=1).wait_ready()
    assert "beside live workers with other checkpoints" in allowed.log()


def test_status_screen_flags_mixed_digests_and_says_when_redis_is_away(redis_url, capsys):
    r = redis.Redis.from_url(redis_url)
    _fake_live_worker(r, "a" * 32)
    r.zadd(keys.workers_key(MODEL), {"other:2:cuda:1": time.time() + 120})
    r.set(keys.worker_info_key(MODEL, "other:2:cuda:1"), json.dumps({"digest": "b" * 32}))
    r.rpush(keys.backfill_queue(MODEL), "x", "y")
    r.rpush(keys.dead_letter(MODEL), "z")
    assert status_cli.main(["--redis", redis_url]) == 0
    screen = capsys.readouterr().out
    assert f"{MODEL}: online 0 | backfill 2 | dead letters 1 | live workers 2" in screen
    assert "MIXED: 2 checkpoint digests serve this model name" in screen
    assert status_cli.main(["--redis", "redis://:secret@127.0.0.1:1/0"]) == status_cli.EXIT_REDIS_UNAVAILABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "127.0.0.1:1" in err[0] and "secret" not in err[0]


def test_status_reads_the_queues_on_the_broker_and_the_rest_in_the_result_store(redis_url):
    import fakeredis

    store, broker = redis.Redis.from_url(redis_url), fakeredis.FakeRedis()
    broker.rpush(keys.online_queue(MODEL), "a", "b", "c")
    store.rpush(keys.online_queue(MODEL), "not on the broker")
    store.rpush(keys.dead_letter(MODEL), "z")
    shown = status_cli.gather(store, [MODEL], broker)
    assert shown["models"][MODEL]["queues"] == {"online": 3, "backfill": 0}
    assert shown["models"][MODEL]["dead"] == 1 and shown["unacked"] == 0
