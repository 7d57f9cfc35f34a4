"""Unique worker names (issue 40): `vela2 worker --hostname` follows Celery's rules (%h, %n, %d; a name
without @ is a host), and its default, vela2-<model>-<device>-<pid>@<host>, differs for two workers of
one model on one host; the same name is the Celery node name (Flower, `celery inspect`), the
heartbeats' and `vela2 status`'s. A starting worker says so, so that requests wait for it."""

from __future__ import annotations

import json
import socket
import sys
import time

import pytest
import redis

from producer import status as status_cli
from producer.liveness import Liveness
from vela2.errors import ConfigError, NoWorker
from vela2.wire import fleet, keys
from worker.app import node_name
from worker.runtime.announce import Announcer
from worker.settings import WorkerSettings

MODEL = "vela2-demo"
HOST = socket.gethostname()


def test_the_default_name_is_unique_per_model_device_and_process():
    name = node_name(WorkerSettings(model_name=MODEL, device="cuda:0"), pid=123)
    assert name == f"vela2-{MODEL}-cuda0-123@{HOST}"
    others = {node_name(WorkerSettings(model_name=MODEL, device="cuda:0"), pid=124),
              node_name(WorkerSettings(model_name=MODEL, device="cuda:1"), pid=123),
              node_name(WorkerSettings(model_name="other", device="cuda:0"), pid=123)}
    assert name not in others and len(others) == 3
    # what Celery would read in a model name ("@" splits, "%" expands) is left out of the default
    assert node_name(WorkerSettings(model_name="org/m@x%h", device="cpu"), pid=1) == f"vela2-orgmxh-cpu-1@{HOST}"
    assert node_name(WorkerSettings(), pid=7) == f"vela2-cpu-7@{HOST}"  # no checkpoint yet: no model part


def test_hostname_follows_celerys_rules():
    assert node_name(WorkerSettings(hostname="w1@%h")) == f"w1@{HOST}"
    assert node_name(WorkerSettings(hostname="gpu-box")) == "celery@gpu-box"  # no @: a host
    short = HOST.partition(".")[0]
    assert node_name(WorkerSettings(hostname="w-%n@%h")) == f"w-{short}@{HOST}"
    with pytest.raises(ConfigError, match=r"hostname 'w%x@%h': Unknown format %x"):
        node_name(WorkerSettings(hostname="w%x@%h"))
    assert WorkerSettings.from_env({"VELA2_HOSTNAME": "w2@%h"}).hostname == "w2@%h"


def _poll(fn, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not (got := fn()):
        assert time.monotonic() < deadline, f"{what} not seen within {timeout_s} s"
        time.sleep(0.02)
    return got


def test_a_starting_worker_is_waited_for_and_shown_starting(redis_url):
    r = redis.Redis.from_url(redis_url)
    r.zadd(keys.workers_key(MODEL), {"crashed@elsewhere": time.time() - 300})
    with pytest.raises(NoWorker):
        Liveness(MODEL).check(r)
    starting = Announcer(redis.Redis.from_url(redis_url), MODEL, "vela2-w@box", interval_s=0.05).start()
    try:
        _poll(lambda: starting.beats >= 2, "two starting beats")
        Liveness(MODEL).check(r)  # a request waits for it: no NoWorker
        r.delete(keys.workers_key(MODEL))
        shown = status_cli.gather(r)  # the model is found by its starting worker alone
        assert [w["worker"] for w in shown["models"][MODEL]["starting"]] == ["vela2-w@box"]
        screen = status_cli.render(shown)
        assert f"{MODEL}: online 0 | backfill 0 | dead letters 0 | live workers 0 | starting 1" in screen
        assert "  vela2-w@box: starting" in screen
    finally:
        starting.stop()
    assert r.zcard(keys.starting_key(MODEL)) == 0  # gone once it serves (or stops)
    r.close()


def test_two_workers_on_one_host_have_distinct_names_everywhere(redis_url, start_worker, capsys):
    vela2_worker = [sys.executable, "-m", "worker.cli"]  # `vela2 worker`, with its default --hostname
    workers = [start_worker(redis_url, command=vela2_worker) for _ in range(2)]
    for w in workers:
        w.wait_ready()
    names = {f"vela2-{MODEL}-cpu-{w.pid}@{HOST}" for w in workers}
    assert len(names) == 2
    for w in workers:  # Celery's node name (its banner, Flower, `celery inspect`) is that name
        assert f"vela2-{MODEL}-cpu-{w.pid}@{HOST}" in w.log()
    r = redis.Redis.from_url(redis_url)
    live = _poll(lambda: fleet.live_workers(r, MODEL) if len(fleet.live_workers(r, MODEL)) == 2 else None,
                 "two live workers")
    assert {x["worker"] for x in live} == names  # the heartbeats' ids
    assert r.zcard(keys.starting_key(MODEL)) == 0  # both serve: neither says "starting" any more
    assert status_cli.main(["--redis", redis_url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["models"][MODEL]
    assert {x["worker"] for x in shown["workers"]} == names and shown["starting"] == []
    r.close()
