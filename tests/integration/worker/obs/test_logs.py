"""--log-format json on a real worker: one JSON object per log line."""

from __future__ import annotations

import json


def test_a_worker_logs_json_lines(redis_url, start_worker):
    w = start_worker(redis_url, log_format="json").wait_ready()
    w.terminate()
    lines = [json.loads(x) for x in w.log().splitlines() if x.startswith("{")]
    assert any(x["msg"].startswith("vela2 engine ready: model vela2-demo") for x in lines)
    assert all({"ts", "level", "logger", "msg"} <= set(x) for x in lines)
