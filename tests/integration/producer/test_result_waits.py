"""The synchronous client's result waits (producer.waiting): one pub/sub connection per client and
thread, kept between waits, never mixing one wait's channel into another's."""

from __future__ import annotations

import threading
import time

import pytest
import redis as redis_lib

from producer import Client
from producer.waiting import STALE_MAX
from vela2.api.schemas import RowResult, Status
from vela2.wire.keys import result_key
from vela2.wire.results import ResultStore, row_meta

MODEL = "vela2-demo"


def _store(r, rid: str) -> None:
    ResultStore(r).store([(rid, row_meta(rid, RowResult(id=rid, task="choice:x", status=Status.ok, answers=[])))])


def _connections(r) -> int:
    return int(r.info("stats")["total_connections_received"])


def test_waits_reuse_one_connection_and_skip_publishes_of_earlier_waits(redis_url):
    r = redis_lib.Redis.from_url(redis_url)
    c = Client(redis_url, model=MODEL)
    try:
        with pytest.raises(TimeoutError):
            c.result("late", timeout_s=0.05)
        before = _connections(r)
        for i in range(20):
            _store(r, f"r-{i}")
        r.config_resetstat()
        for i in range(20):
            assert c.result(f"r-{i}", timeout_s=5).id == f"r-{i}"
        calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}
        # each wait of an answer stored already: one MGET, no subscription
        assert (calls.get("subscribe", 0), calls["mget"], calls.get("unsubscribe", 0)) == (0, 20, 0), calls
        assert _connections(r) - before <= 1  # not one per wait (the pool's own may open once)
        _store(r, "late")  # published on a channel this connection waited on before (still subscribed)

        def answer_soon() -> None:
            time.sleep(0.2)
            _store(r, "next")

        t = threading.Thread(target=answer_soon)
        t.start()
        assert c.result("next", timeout_s=5).id == "next"  # never "late"'s publish
        t.join()
        assert _connections(r) - before <= 1
        # the channels of finished waits ("late", "next", then these) are unsubscribed STALE_MAX at once
        r.config_resetstat()
        for i in range(STALE_MAX - 2):
            with pytest.raises(TimeoutError):
                c.result(f"w-{i}", timeout_s=0.01)
        calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}
        assert (calls["subscribe"], calls["unsubscribe"]) == (STALE_MAX - 2, 1), calls
        deadline = time.monotonic() + 5
        while r.pubsub_channels(result_key("*")):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        connected = int(r.info("clients")["connected_clients"])
    finally:
        c.close()
    deadline = time.monotonic() + 5
    while int(r.info("clients")["connected_clients"]) > connected - 2:  # its pool's and its pub/sub's closed
        assert time.monotonic() < deadline
        time.sleep(0.01)
    r.close()


def test_threads_wait_at_once_each_on_its_own_connection(redis_url):
    r = redis_lib.Redis.from_url(redis_url)
    c = Client(redis_url, model=MODEL)
    got: dict[str, str] = {}

    def wait(rid: str) -> None:
        got[rid] = c.result(rid, timeout_s=10).id

    threads = [threading.Thread(target=wait, args=(f"t-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while len(r.pubsub_channels(result_key("t-*"))) < 4:  # all four subscribed
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for i in range(4):
        _store(r, f"t-{i}")
    for t in threads:
        t.join(10)
    assert got == {f"t-{i}": f"t-{i}" for i in range(4)}
    c.close()
    r.close()
