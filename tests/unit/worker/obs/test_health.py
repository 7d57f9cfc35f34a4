"""worker.obs.health: what /livez and /readyz answer in each state of a worker's life."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry

from worker.obs.health import Health, serve


def get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_ready_only_between_warm_up_and_shutdown_and_while_redis_takes_the_beat():
    h = Health("m", "d" * 32)
    server = serve(0, "127.0.0.1", CollectorRegistry(), h)
    port = server.server_port
    try:
        assert get(port, "/readyz") == (503, {"ready": False, "reason": "starting: loading the checkpoint and "
                                                "warming up", "model": "m", "digest": "d" * 32})
        assert get(port, "/livez")[0] == 200
        h.serving = True
        assert get(port, "/readyz")[0] == 200
        h.beat_error = lambda: "ConnectionError: refused"
        code, body = get(port, "/readyz")
        assert code == 503 and body["reason"] == "Redis does not take the heartbeat: ConnectionError: refused"
        assert get(port, "/livez")[0] == 200  # Redis away is not a reason to restart the worker
        h.beat_error = lambda: None
        h.stalled = lambda: True
        assert get(port, "/livez")[0] == 503 and get(port, "/readyz")[0] == 503
        h.stalled = lambda: False
        h.stopping = lambda: True
        assert get(port, "/readyz") == (503, {"ready": False, "reason": "shutting down", "model": "m",
                                              "digest": "d" * 32})
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert r.status == 200  # the metrics are still served beside
    finally:
        server.shutdown()
        server.server_close()


def test_readyz_names_the_stage_start_up_is_in():
    h = Health("")  # the early Health: model and digest not known yet
    server = serve(0, "127.0.0.1", CollectorRegistry(), h)
    port = server.server_port
    try:
        h.begin("hashing the checkpoint")
        assert get(port, "/readyz") == (503, {"ready": False, "reason": "starting: hashing the checkpoint",
                                              "model": "", "digest": ""})
        assert get(port, "/livez")[0] == 200  # loading is life
        h.model, h.digest = "m", "d" * 32
        h.begin("warming up")
        assert get(port, "/readyz")[1]["reason"] == "starting: warming up"
        h.serving = True
        assert get(port, "/readyz") == (200, {"ready": True, "reason": "ok", "model": "m", "digest": "d" * 32})
    finally:
        server.shutdown()
        server.server_close()
