"""The worker's log format: Celery's text lines (default) or one JSON object per line for log
shippers (`--log-format json`): time, level, logger, process, message, and the request id where a
line is about one request (the engine logs those with `extra={"request_id": ...}`)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (ISO 8601, UTC, ms), level, logger, process, msg, and
    request_id / exc when the record has them."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "process": record.processName,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            out["request_id"] = request_id
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def use_json(logger: logging.Logger, **_: Any) -> None:
    """Give every handler of `logger` (and of the root logger) the JSON formatter; connected to
    Celery's after_setup_logger / after_setup_task_logger signals."""
    for target in {logger, logging.getLogger()}:
        for handler in target.handlers:
            handler.setFormatter(JsonFormatter())
