"""What an engine counts over its life: results by status, duplicates, acks, batches, CPU seconds by
stage, the device's busy time and its last batches; logged as one summary line and one JSON line at
stop (`STATS_LOG_PREFIX`, which tools read)."""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

STATS_LOG_PREFIX = "vela2 engine stats: "  # then one JSON object (EngineStats.to_dict), logged at stop
RECENT_BATCHES = 256  # batches EngineStats.recent keeps
RECENT_FIELDS = ("launched", "device_start", "device_end", "sequences", "tokens", "waiting", "rendering", "held",
                 "launch_s")


@dataclass
class EngineStats:
    """Counts over an engine's life; `summary()` is the shutdown log line."""

    results: Counter = field(default_factory=Counter)  # by status: ok / error / expired / cancelled
    duplicates: int = 0
    messages_acked: int = 0
    messages_returned: int = 0
    acks_deferred: int = 0  # WAITs that came back short (settings.wait_replicas): the acks waited a retry
    batches: int = 0
    batches_raised: int = 0
    retried_alone: int = 0  # requests run alone because an earlier attempt died with its worker
    dead_lettered: int = 0
    # CPU seconds by stage (each thread's own clock: time.thread_time), and the whole process's
    # since the engine started; the process figure less the stages is the consumer thread (kombu,
    # Celery, triage), the leases and the metrics
    cpu_s: dict[str, float] = field(default_factory=dict)
    process_cpu_s: float = 0.0
    device_s: float = 0.0  # wall seconds the device spent running batches (its busy time)
    # the last batches, oldest first: (launched, device start, device end) on time.monotonic (shared
    # by every process of a host, so a benchmark can place them in its own timeline), sequences,
    # tokens, and at launch the sequences left waiting, the rows in render and the messages held;
    # last, how long the runner took to launch it (None: a runner that does not time it apart)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))
    _cpu_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def charge(self, stage: str, seconds: float) -> None:
        """Add `seconds` of CPU to `stage` (any thread)."""
        with self._cpu_lock:
            self.cpu_s[stage] = self.cpu_s.get(stage, 0.0) + seconds

    def ran(self, record: list[float | int | None], start: float, end: float, launch_s: float | None = None) -> None:
        """(the device runner's thread) the batch of `record` (see `recent`) ran from start to end."""
        with self._cpu_lock:
            self.device_s += end - start
            record[1:3] = [round(start, 4), round(end, 4)]
            record.append(None if launch_s is None else round(launch_s, 4))
            self.recent.append(record)

    def to_dict(self) -> dict[str, Any]:
        """The counts as JSON-able data (the `vela2 engine stats` log line that tools read)."""
        return {
            "answered": sum(self.results.values()),
            "results": {k: self.results[k] for k in ("ok", "error", "expired", "cancelled")},
            "duplicates": self.duplicates,
            "messages_acked": self.messages_acked,
            "messages_returned": self.messages_returned,
            "acks_deferred": self.acks_deferred,
            "batches": self.batches,
            "batches_raised": self.batches_raised,
            "retried_alone": self.retried_alone,
            "dead_lettered": self.dead_lettered,
            "cpu_s": {k: round(v, 4) for k, v in sorted(self.cpu_s.items())},
            "process_cpu_s": round(self.process_cpu_s, 4),
            "device_s": round(self.device_s, 4),
            "recent_batches": {"fields": list(RECENT_FIELDS), "rows": [list(r) for r in self.recent]},
        }

    def summary(self) -> str:
        r = self.results
        return (
            f"answered {sum(r.values())} requests (ok {r['ok']}, error {r['error']}, expired "
            f"{r['expired']}, cancelled {r['cancelled']}), skipped {self.duplicates} duplicates; "
            f"acked {self.messages_acked} messages, returned {self.messages_returned} to the queue; "
            f"{self.batches} batches "
            f"({self.batches_raised} raised); {self.retried_alone} retried alone, {self.dead_lettered} dead-lettered"
        )
