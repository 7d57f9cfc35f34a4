"""--log-format json: a record about a request carries its id."""

from __future__ import annotations

import json
import logging

from worker.obs.logs import JsonFormatter


def test_a_record_about_a_request_carries_its_id():
    record = logging.LogRecord("worker.engine.loop", logging.WARNING, __file__, 1, "request %s fails alone: %s",
                               ("r-1", "boom"), None)
    record.request_id = "r-1"
    out = json.loads(JsonFormatter().format(record))
    assert out["msg"] == "request r-1 fails alone: boom" and out["request_id"] == "r-1"
    assert out["level"] == "WARNING" and out["logger"] == "worker.engine.loop" and out["ts"].endswith("+00:00")


