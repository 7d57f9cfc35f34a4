"""The fault suite: real redis-server, real `celery -A worker.app worker` processes on the demo
checkpoint, real producers; each scenario injects one kind of fault and counts what became of every
request it sent.

    .venv/bin/python -m bench.reliability [--out bench/results/reliability.json] [--only NAME,...]
        [--scale 1.0] [--soak-minutes N] [--checkpoint DIR] [--device cpu] [--fuzz-examples 500]

Every scenario is self-contained: its own redis-server on a free loopback port in a temporary
directory (AOF on where a restart must keep the queue), its own workers configured through VELA2_*
variables (plus worker.faults' test-only VELA2_TEST_* hooks where a fault is injected), its own
requests; both come from the process harness (stack.harness), and the workers' counts from the
engine's JSON stats line at shutdown. After the scenario settles, every request id is read back:

- `answered_ok` / `answered_error` / `expired`: the stored answer's status;
- `lost`: no stored answer at all (the suite exits non-zero when any scenario loses one);
- `duplicate_answers_changed`: answers that differ from the first value the suite saw for that id
  (results are write-once: this must stay 0 however often a message is delivered).

Scenarios: sigkill, sigterm, redis_restart, malformed, oversized, oom, duplicate, visibility,
poison, redis_down (see each function's docstring), then the hypothesis fuzz of the request schemas
and the renderer (bench.fuzz) and, with --soak-minutes, a soak run sampling worker RSS and GPU
memory. `--scale` multiplies request counts (and the redis_down outage); the smoke test runs a few
scenarios at a tiny scale. Exit status: 0 when nothing was lost, no answer changed and every
scenario's own checks held; 1 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import redis as redis_lib

from producer.client import Client
from stack.harness import READY_TIMEOUT_S, RedisServer, WorkerProcess, free_port
from vela2.errors import LimitExceeded
from vela2.wire import keys
from vela2.wire.messages import build_message
from worker.faults import TEST_CRASH_ENV, TEST_DELAY_ENV, TEST_FAIL_ENV, TEST_OOM_ENV

log = logging.getLogger("bench.reliability")

MODEL = "vela2-demo"
QUEUE = keys.online_queue(MODEL)
SETTLE_TIMEOUT_S = 240.0  # longest a scenario waits for its answers once the fault is over
POLL_S = 0.2

# Worker settings every scenario starts from (small batches: the demo model on a CPU).
BASE_SETTINGS: dict[str, Any] = {
    "max_batch_tokens": 2048,
    "max_wait_ms": 20,
    "render_threads": 1,
    "shutdown_timeout_s": 30,
}

TEXTS = [
    "Alice Smith from Acme wrote to bob@globex.com on Monday about order {i}; the refund was sent.",
    "Is the support team helpful? Carol said the reply to ticket {i} came within the hour.",
    "The shipment {i} left Berlin on Friday and should reach Lisbon next week, said Dan.",
    "Eve asked whether invoice {i} from Initech was paid, and by whom, before the deadline.",
]


def good_row(rid: str, i: int) -> dict[str, Any]:
    """A short valid row; the type cycles through choice, set, span and score."""
    text = TEXTS[i % len(TEXTS)].format(i=i)
    kind = i % 4
    if kind == 0:
        return {"id": rid, "task": "choice:boolq", "text": text, "questions": [{"options": ["yes", "no"]}]}
    if kind == 1:
        return {"id": rid, "task": "set:shield", "text": text, "questions": [{"options": ["violence", "privacy"]}]}
    if kind == 2:
        return {"id": rid, "task": "span:pii_dev", "text": text, "questions": [{"labels": ["person", "email"]}]}
    return {"id": rid, "task": "score:helpsteer2", "text": text, "questions": [{"options": ["0", "1", "2", "3"]}]}


def good_rows(prefix: str, n: int, start: int = 0) -> list[dict[str, Any]]:
    return [good_row(f"{prefix}-{i}", i) for i in range(start, start + n)]


# --- processes -----------------------------------------------------------------------------------


def worker_counts(w: WorkerProcess) -> dict[str, int] | None:
    """The engine's shutdown counts (its JSON stats line, WorkerProcess.engine_stats) under the names
    the report uses; None when it never stopped warmly."""
    stats = w.engine_stats()
    if stats is None:
        return None
    results = stats["results"]
    return {
        "answered": stats["answered"],
        "ok": results["ok"],
        "error": results["error"],
        "expired": results["expired"],
        "duplicates_skipped": stats["duplicates"],
        "acked": stats["messages_acked"],
        "returned": stats["messages_returned"],
        "batches": stats["batches"],
        "raised": stats["batches_raised"],
    }


class Suite:
    """What every scenario shares: the checkpoint, a scratch directory, the scale, started processes."""

    def __init__(self, workdir: Path, checkpoint: Path, *, scale: float = 1.0, device: str = "cpu"):
        self.workdir = workdir
        self.checkpoint = checkpoint
        self.scale = scale
        self.device = device
        self.worst_batch_s: dict[int, float] = {}
        self._procs: list[WorkerProcess | RedisServer] = []
        self._redis_numbers = count(1)
        self._worker_numbers = count(1)

    def n(self, base: int, minimum: int = 8) -> int:
        """A request count scaled by --scale."""
        return max(minimum, round(base * self.scale))

    def redis(self, *, aof: bool = False) -> RedisServer:
        r = RedisServer(self.workdir / f"redis{next(self._redis_numbers)}", aof=aof).start()
        self._procs.append(r)
        return r

    def worker(
        self, redis_url: str, *, env: dict[str, str] | None = None, metrics: bool = False, **settings: Any
    ) -> WorkerProcess:
        """Start `celery -A worker.app worker` with these settings over BASE_SETTINGS (not yet ready)."""
        name = f"w{next(self._worker_numbers)}"
        # One CPU thread per worker: two workers with a thread per core each fight over the cores of
        # a small machine, and measure their worst batch (the visibility check) many times too slow.
        extra = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
        port = free_port() if metrics else 0
        w = WorkerProcess.start(
            redis_url,
            self.checkpoint,
            self.workdir / f"{name}.log",
            name=name,
            env=extra,
            device=self.device,
            **{**BASE_SETTINGS, **settings, "metrics_port": port},
        )
        self._procs.append(w)
        return w

    def visibility_for(
        self, max_batch_tokens: int, max_buffered: int, delay_s: float = 0.0, margin: float = 3.0
    ) -> float:
        """A short visibility timeout that a worker with these settings accepts at start: the
        worker's own rule with the worst batch measured here (once per batch size), times `margin`
        (a worker measures its worst batch on a machine busy with other processes), at least 8 s."""
        from worker.startup import buffered_batches, required_visibility_s

        worst = self.worst_batch_s.get(max_batch_tokens)
        if worst is None:
            worst = self.worst_batch_s[max_batch_tokens] = _measure_worst(self.checkpoint, max_batch_tokens)
        window = _window_tokens(self.checkpoint)
        need = required_visibility_s(
            BASE_SETTINGS["max_wait_ms"], buffered_batches(max_buffered, window, max_batch_tokens), worst + delay_s
        )
        return round(max(8.0, need * margin), 1)

    def cleanup(self) -> None:
        """Stop whatever the scenario left running (workers first, then Redis)."""
        for p in reversed(self._procs):
            if isinstance(p, WorkerProcess) and p.alive():
                p.kill()
        for p in self._procs:
            if isinstance(p, RedisServer):
                p.stop()
        self._procs.clear()


_MODEL_CACHE: dict[str, Any] = {}


def _model(checkpoint: Path) -> Any:
    if "model" not in _MODEL_CACHE:
        import torch

        import vela2

        _MODEL_CACHE["model"] = vela2.load(checkpoint, dtype=torch.float32)
    return _MODEL_CACHE["model"]


def _measure_worst(checkpoint: Path, max_batch_tokens: int) -> float:
    from worker.settings import EngineSettings
    from worker.startup import measure_worst_batch_s

    settings = EngineSettings(max_batch_tokens=max_batch_tokens, precision="fp32")  # the fp32 model on this CPU
    return measure_worst_batch_s(_model(checkpoint), settings)


def _window_tokens(checkpoint: Path) -> int:
    return int(json.loads((Path(checkpoint) / "config.json").read_text())["max_window_tokens"])


# --- answers -------------------------------------------------------------------------------------


def classify(raw: bytes | None) -> str | None:
    """ok / error / expired of a stored result (ours, or one Celery itself wrote), None when none."""
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return "error"
    row = meta.get("vela2") if isinstance(meta, dict) else None
    if isinstance(row, dict) and row.get("status") in ("ok", "error", "expired"):
        return str(row["status"])
    return "ok" if isinstance(meta, dict) and meta.get("status") == "SUCCESS" else "error"


def error_type(raw: bytes | None) -> str | None:
    """The error type of a stored failure: ours (`error.type`) or Celery's exc_type."""
    if raw is None:
        return None
    meta = json.loads(raw)
    row = meta.get("vela2")
    if isinstance(row, dict) and row.get("error"):
        return str(row["error"]["type"])
    result = meta.get("result")
    return str(result.get("exc_type")) if isinstance(result, dict) and "exc_type" in result else None


class Tracker:
    """Watches the result keys of the scenario's requests: the first value seen for each id (to
    prove it never changes), and when every id has one."""

    def __init__(self, redis_url: str):
        self.r = redis_lib.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
        self.ids: list[str] = []
        self.first: dict[str, bytes] = {}
        self.first_at: dict[str, float] = {}
        self.t0 = time.monotonic()

    def add(self, ids: list[str]) -> None:
        known = set(self.ids)
        self.ids.extend(i for i in ids if i not in known)

    def missing(self) -> list[str]:
        return [i for i in self.ids if i not in self.first]

    def poll(self) -> int:
        """Read the ids without a snapshot yet (MGET in slices); returns how many are still missing."""
        missing = self.missing()
        try:
            for k in range(0, len(missing), 1000):
                part = missing[k : k + 1000]
                for rid, raw in zip(part, self.r.mget([keys.result_key(i) for i in part]), strict=True):
                    if raw is not None:
                        self.first[rid] = raw
                        self.first_at[rid] = time.monotonic() - self.t0
        except redis_lib.RedisError:
            return len(missing)  # Redis away: try again later
        return len(self.missing())

    def wait(self, timeout_s: float, until: Callable[[], bool] | None = None) -> bool:
        """Poll until every id has an answer (and `until()` holds), or timeout; True when done."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = self.poll()
            if left == 0 and (until is None or until()):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)

    def answered(self) -> int:
        return len(self.first)

    def final(self) -> dict[str, Any]:
        """Read every id once more: counts by status, lost, and answers changed since first seen."""
        self.poll()
        raws: dict[str, bytes | None] = {}
        for k in range(0, len(self.ids), 1000):
            part = self.ids[k : k + 1000]
            raws.update(zip(part, self.r.mget([keys.result_key(i) for i in part]), strict=True))
        statuses = [classify(raws[i]) for i in self.ids]
        return {
            "requests": len(self.ids),
            "answered_ok": statuses.count("ok"),
            "answered_error": statuses.count("error"),
            "expired": statuses.count("expired"),
            "lost": statuses.count(None),
            "duplicate_answers_changed": sum(1 for i in self.ids if i in self.first and raws[i] != self.first[i]),
            "lost_ids": [i for i, s in zip(self.ids, statuses, strict=True) if s is None][:20],
            "raw": raws,
        }

    def close(self) -> None:
        self.r.close()


# --- results ---------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One scenario's line in reliability.json."""

    name: str
    requests: int = 0
    answered_ok: int = 0
    answered_error: int = 0
    expired: int = 0
    lost: int = 0
    duplicate_answers_changed: int = 0
    seconds: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    passed: bool = True

    def check(self, what: str, ok: bool, detail: Any = None) -> bool:
        """Record one of the scenario's own claims (a failed one fails the suite)."""
        self.checks.append({"check": what, "ok": bool(ok), **({"detail": detail} if detail is not None else {})})
        if not ok:
            log.error("%s: check failed: %s (%s)", self.name, what, detail)
        return bool(ok)

    def settle(self, tracker: Tracker) -> dict[str, bytes | None]:
        """Fill the counts from the tracker; returns the raw stored answers by id."""
        f = tracker.final()
        for k in ("requests", "answered_ok", "answered_error", "expired", "lost", "duplicate_answers_changed"):
            setattr(self, k, f[k])
        if f["lost_ids"]:
            self.notes["lost_ids"] = f["lost_ids"]
        return f["raw"]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed = (
            self.lost == 0 and self.duplicate_answers_changed == 0 and all(c["ok"] for c in self.checks)
        )
        return d


def worker_notes(workers: list[WorkerProcess]) -> dict[str, Any]:
    """What the workers' shutdown lines say, summed (warmly stopped workers only)."""
    total: dict[str, int] = {}
    stopped = 0
    for w in workers:
        s = worker_counts(w)
        if s is None:
            continue
        stopped += 1
        for k, v in s.items():
            total[k] = total.get(k, 0) + v
    return {"workers": len(workers), "warmly_stopped": stopped, **total}


def stop_all(workers: list[WorkerProcess], outcome: Outcome) -> None:
    """Warm-stop every live worker; each must exit 0."""
    codes = {w.name: w.terminate() for w in workers if w.alive()}
    outcome.check(
        "every worker still running at the end exits 0 on SIGTERM", all(c == 0 for c in codes.values()), codes
    )


def start_ready(s: Suite, n: int, redis_url: str, **settings: Any) -> list[WorkerProcess]:
    """Start `n` workers one after another (each measures its worst batch on a quiet machine)."""
    return [s.worker(redis_url, **settings).wait_ready() for _ in range(n)]


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.02) -> float:
    """Wait for `cond()`; returns the seconds waited; RuntimeError naming `what` on timeout."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)
    return time.monotonic() - t0


def unacked(r: redis_lib.Redis) -> int:
    return int(r.hlen(keys.UNACKED_KEY))


def recovery(r: redis_lib.Redis, tr: Tracker, answered: int, timeout_s: float) -> tuple[float, float]:
    """Right after Redis came back: seconds until more than `answered` requests have answers, and
    until a worker takes a message from the queue again (kombu stamps every delivery in its unacked
    index with the wall time)."""
    t0, wall0 = time.monotonic(), time.time()
    answers_s = fetch_s = None
    while answers_s is None or fetch_s is None:
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(
                f"no recovery {timeout_s:.0f} s after Redis came back (answers {answers_s}, fetching {fetch_s})"
            )
        if answers_s is None and tr.poll() >= 0 and tr.answered() > answered:
            answers_s = time.monotonic() - t0
        if fetch_s is None:
            try:
                last = r.zrange(keys.UNACKED_INDEX_KEY, -1, -1, withscores=True)
            except redis_lib.RedisError:
                last = []
            if last and float(last[0][1]) > wall0:
                fetch_s = float(last[0][1]) - wall0
        time.sleep(0.05)
    return answers_s, fetch_s


def drained(r: redis_lib.Redis) -> bool:
    """Nothing queued and nothing held by a worker."""
    try:
        return not r.llen(QUEUE) and not r.hlen(keys.UNACKED_KEY)
    except redis_lib.RedisError:
        return False


def raw_message(requests: list[Any], *, chunk: bool = False, max_bytes: int = 10**9, **kw: Any) -> dict[str, Any]:
    """A built message as its envelope dict (to tamper with); size limits off unless given."""
    return json.loads(build_message(requests, QUEUE, chunk=chunk, max_message_bytes=max_bytes, **kw).payload)


def set_body(env: dict[str, Any], body: bytes) -> dict[str, Any]:
    env["body"] = base64.b64encode(body).decode("ascii")
    return env


class Producer(threading.Thread):
    """Submits rows in small batches at a steady pace through producer.Client; on a connection
    error it records the error and retries the same batch with exponential backoff (0.1 s doubling
    to 2 s), so a Redis outage delays submissions and loses none."""

    def __init__(self, redis_url: str, rows: list[dict[str, Any]], *, per_s: float, batch: int = 10):
        super().__init__(daemon=True)
        self.client = Client(redis_url, model=MODEL)
        self.rows = rows
        self.per_s = per_s
        self.batch = batch
        self.submitted: list[str] = []
        self.errors = 0
        self.first_error: str | None = None
        self.longest_backoff_s = 0.0
        self.blocked_s = 0.0  # time spent waiting on Redis

    def run(self) -> None:
        pause = self.batch / self.per_s
        for k in range(0, len(self.rows), self.batch):
            part = self.rows[k : k + self.batch]
            backoff = 0.1
            t_fail = None
            while True:
                try:
                    self.submitted += self.client.submit_many(part)
                    break
                except (redis_lib.ConnectionError, redis_lib.TimeoutError) as e:
                    self.errors += 1
                    self.first_error = self.first_error or f"{type(e).__name__}: {e}"
                    t_fail = t_fail or time.monotonic()
                    time.sleep(backoff)
                    self.longest_backoff_s = max(self.longest_backoff_s, backoff)
                    backoff = min(2.0, backoff * 2)
            if t_fail is not None:
                self.blocked_s += time.monotonic() - t_fail
            time.sleep(pause)
        self.client.close()

    def notes(self) -> dict[str, Any]:
        return {
            "producer_submitted": len(self.submitted),
            "producer_connection_errors": self.errors,
            "producer_first_error": self.first_error,
            "producer_policy": "retry the same submit_many with exponential backoff 0.1 s -> 2 s (no request dropped; "
            "a retry after a lost reply may queue a message twice, which the write-once result makes harmless)",
            "producer_longest_backoff_s": self.longest_backoff_s,
            "producer_blocked_s": round(self.blocked_s, 1),
        }


# --- scenarios -----------------------------------------------------------------------------------


def scenario_sigkill(s: Suite, out: Outcome) -> None:
    """SIGKILL a worker mid-batch while it also holds buffered requests; a second worker finishes.
    The first worker runs on a slow device (test hook: a delay before every batch) with small
    batches, so when it is killed it holds a batch in progress and more messages buffered."""
    r = s.redis()
    delay = 0.3
    settings = {"max_batch_tokens": 128, "max_buffered": 6}  # 2 short rows per batch, 4 more buffered
    vis = s.visibility_for(128, 6, delay_s=delay)
    w1 = s.worker(r.url(), env={TEST_DELAY_ENV: str(delay)}, visibility_timeout_s=vis, **settings).wait_ready()
    client = Client(r.url(), model=MODEL)
    tr = Tracker(r.url())
    n = s.n(800)
    tr.add(client.submit_many(good_rows("kill", n)))
    rc = r.client()
    wait_until(lambda: tr.poll() < n - 4 and unacked(rc) >= 5, 120, "worker 1 to answer a few and hold more")
    held, answered_before = unacked(rc), tr.answered()
    time.sleep(delay / 2)  # inside the next batch's delay: mid-batch
    t_kill = time.monotonic()
    w1.kill()
    # worker 2 runs the same settings on a normal device: its restore sweep brings worker 1's messages back
    w2 = s.worker(r.url(), visibility_timeout_s=vis, **settings).wait_ready()
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    out.notes.update(
        {
            "injected": f"SIGKILL worker 1 (slow device {delay} s/batch, buffer 6) mid-batch; worker 2 started after",
            "held_by_killed_worker": held,
            "answered_before_kill": answered_before,
            "visibility_timeout_s": vis,
            "recovered_after_kill_s": round(time.monotonic() - t_kill, 1),
            "redeliveries": held,
        }
    )
    out.check("worker 1 held requests when killed (mid-batch and buffered)", held > 1, held)
    out.check("all answered and the queue drained", done)
    stop_all([w2], out)
    out.notes.update(worker_notes([w1, w2]))
    out.settle(tr)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)
    client.close()
    tr.close()


def scenario_sigterm(s: Suite, out: Outcome) -> None:
    """Warm shutdown (SIGTERM) twice: during a batch with a full buffer and a 1 s shutdown timeout
    (finish what fits, return the rest to the queue), then while requests only wait in buffers
    (max_wait 5 s; they are flushed at once and answered); a third worker finishes the rest."""
    r = s.redis()
    rc = r.client()
    client = Client(r.url(), model=MODEL)
    tr = Tracker(r.url())
    n = s.n(400, minimum=40)
    tr.add(client.submit_many(good_rows("term", n)))
    # 1. during a batch
    w1 = s.worker(
        r.url(), env={TEST_DELAY_ENV: "0.5"}, max_batch_tokens=128, max_buffered=12, shutdown_timeout_s=1
    ).wait_ready()
    wait_until(lambda: unacked(rc) >= 12 and tr.poll() < n, 120, "worker 1 holding a full buffer mid-batch")
    t0 = time.monotonic()
    rc1 = w1.terminate()
    stop1_s = time.monotonic() - t0
    left1 = unacked(rc)
    s1 = worker_counts(w1) or {}
    out.check("SIGTERM during a batch: exit 0", rc1 == 0, rc1)
    out.check("SIGTERM during a batch: nothing left unacked", left1 == 0, left1)
    out.check(
        "SIGTERM during a batch: what did not fit the timeout went back to the queue", s1.get("returned", 0) > 0, s1
    )
    # 2. during buffering: short rows never fill a 2048-token bucket from 16 messages, and max_wait is 5 s
    missing_after_first = tr.poll()
    w2 = s.worker(r.url(), max_wait_ms=5000, max_buffered=16).wait_ready()
    wait_until(lambda: unacked(rc) >= 16, 60, "worker 2 buffering 16 messages")
    held2 = unacked(rc)
    t0 = time.monotonic()
    rc2 = w2.terminate()
    stop2_s = time.monotonic() - t0
    s2 = worker_counts(w2) or {}
    out.check("SIGTERM while buffering: exit 0", rc2 == 0, rc2)
    out.check("SIGTERM while buffering: nothing left unacked", unacked(rc) == 0, unacked(rc))
    out.check(
        "SIGTERM while buffering: the buffered requests were flushed and answered, none returned",
        s2.get("returned", -1) == 0 and s2.get("answered", 0) >= held2,
        {"held": held2, **s2},
    )
    # 3. a third worker finishes
    w3 = s.worker(r.url()).wait_ready()
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    out.check("all answered and the queue drained", done)
    stop_all([w3], out)
    out.notes.update(
        {
            "injected": "SIGTERM mid-batch (shutdown timeout 1 s), SIGTERM while buffering (max_wait 5 s)",
            "stop_mid_batch_s": round(stop1_s, 2),
            "stop_while_buffering_s": round(stop2_s, 2),
            "returned_to_queue_by_first_stop": s1.get("returned"),
            "unanswered_after_first_stop": missing_after_first,
            **worker_notes([w1, w2, w3]),
        }
    )
    out.settle(tr)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)
    client.close()
    tr.close()


def scenario_redis_restart(s: Suite, out: Outcome) -> None:
    """Restart redis-server (AOF, appendfsync everysec; SIGTERM then start on the same port and
    directory) while two workers score and a producer submits; both reconnect and carry on."""
    r = s.redis(aof=True)
    vis = s.visibility_for(2048, 8)
    workers = start_ready(s, 2, r.url(), visibility_timeout_s=vis, max_buffered=8)
    n = s.n(1000, minimum=60)
    rows = good_rows("rr", n)
    tr = Tracker(r.url())
    tr.add([x["id"] for x in rows])
    prod = Producer(r.url(), rows, per_s=max(20.0, n / 12))
    prod.start()
    wait_until(lambda: len(prod.submitted) >= n // 3 and tr.poll() < n, 120, "a third submitted")
    before = tr.answered()
    t0 = time.monotonic()
    r.stop()
    time.sleep(2.0)  # a restart that takes a moment: producers and workers see connection errors
    r.start()
    down_s = time.monotonic() - t0
    rc = r.client()
    resumed_s, fetch_s = recovery(rc, tr, before + 5, 120)
    prod.join(300)
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    out.check("all answered and the queue drained", done)
    out.check("both workers survived the restart", all(w.alive() for w in workers))
    stop_all(workers, out)
    out.notes.update(
        {
            "injected": "redis-server SIGTERM, 2 s down, start again (AOF everysec) under load, a third of the way in",
            "redis_down_s": round(down_s, 2),
            "answers_resumed_after_s": round(resumed_s, 1),
            "workers_fetching_again_after_s": round(fetch_s, 1),
            "visibility_timeout_s": vis,
            **prod.notes(),
            **worker_notes(workers),
        }
    )
    out.settle(tr)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)
    tr.close()


def scenario_malformed(s: Suite, out: Outcome) -> None:
    """Undecodable bodies, wrong task names, schema-invalid payloads, bad headers and non-Celery
    items, mixed into good traffic. Every bad message that carries an id gets an error answer with
    the right type; items without an id are dropped (logged); the good ones are all answered ok."""
    r = s.redis()
    rc = r.client()
    w = s.worker(r.url()).wait_ready()
    tr = Tracker(r.url())
    rng = random.Random(8)
    k = max(1, s.n(10, minimum=1))
    items: list[str] = []  # envelopes (JSON text) or raw strings, pushed in a shuffled order
    want: dict[str, str] = {}  # id -> expected error type

    def bad(prefix: str, etype: str, make: Callable[[str, int], dict[str, Any]]) -> None:
        for i in range(k):
            rid = f"{prefix}-{i}"
            items.append(json.dumps(make(rid, i)))
            want[rid] = etype

    base = good_row("x", 0)
    bad("notjson", "invalid_request", lambda rid, i: set_body(raw_message([{**base, "id": rid}]), b"{not json"))
    bad("notutf8", "invalid_request", lambda rid, i: set_body(raw_message([{**base, "id": rid}]), b"\xff\xfe\x00"))
    bad(
        "badargs",
        "invalid_request",
        lambda rid, i: set_body(raw_message([{**base, "id": rid}]), json.dumps([[base], {"bogus": 1}, {}]).encode()),
    )

    def wrong_task(rid: str, i: int) -> dict[str, Any]:
        env = raw_message([{**base, "id": rid}])
        env["headers"]["task"] = "vela2.no_such_task"
        return env

    bad("wrongtask", "NotRegistered", wrong_task)

    def bad_expires(rid: str, i: int) -> dict[str, Any]:
        env = raw_message([{**base, "id": rid}])
        env["headers"]["expires"] = "next tuesday"
        return env

    bad("badexpires", "invalid_request", bad_expires)
    invalid = [
        ("oneopt", "invalid_request", {**base, "questions": [{"options": ["yes"]}]}),
        ("notext", "invalid_request", {k_: v for k_, v in base.items() if k_ != "text"}),
        ("inttext", "invalid_request", {**base, "text": 42}),
        ("badtype", "invalid_request", {**base, "task": "regress:x"}),
        ("noquestions", "invalid_request", {**base, "questions": []}),
        ("labelsonchoice", "invalid_request", {**base, "questions": [{"labels": ["a", "b"]}]}),
        (
            "s1model",
            "model_mismatch",
            {"model": "other-model", "input": "hi", "tasks": [{"name": "t", "kind": "choice", "options": ["a", "b"]}]},
        ),
        ("s1kind", "invalid_request", {"model": MODEL, "input": "hi", "tasks": [{"name": "t", "kind": "regress"}]}),
    ]
    for prefix, etype, obj in invalid:
        bad(prefix, etype, lambda rid, i, obj=obj: raw_message([{**obj, "id": rid}]))
    # a chunk mixing good and bad rows: each row answered under its own id
    chunk_rows = []
    for i in range(k):
        g, b = f"chunkgood-{i}", f"chunkbad-{i}"
        chunk_rows.append(([{**good_row(g, i)}, {**base, "id": b, "questions": [{"options": ["only"]}]}], g, b))
    for rows_, g, b in chunk_rows:
        items.append(json.dumps(raw_message(rows_, chunk=True)))
        want[b] = "invalid_request"
        tr.add([g])
    # past their deadline: answered `expired`, not scored
    late = [f"late-{i}" for i in range(k)]
    for rid in late:
        items.append(json.dumps(raw_message([{**base, "id": rid}], expires=_past())))
    # no id to answer under: dropped with a log line (not requests)
    garbage = ["this is not a message", json.dumps({"no": "envelope"}), "", json.dumps([1, 2, 3])]
    no_id = raw_message([{**base, "id": "noid"}])
    del no_id["headers"]["id"]
    unanswerable = [garbage[i % len(garbage)] for i in range(2 * k)] + [json.dumps(no_id)] * k
    items += unanswerable
    tr.add(list(want))
    tr.add(late)
    good = good_rows("good", s.n(600))
    tr.add([g["id"] for g in good])
    good_payloads = [build_message([g], QUEUE).payload for g in good]
    mixed = good_payloads + items
    rng.shuffle(mixed)
    pipe = rc.pipeline(transaction=False)
    for p in mixed:
        pipe.lpush(QUEUE, p)
    pipe.execute()
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    out.check("all answered and the queue drained", done)
    out.check("the worker survived the garbage", w.alive())
    stop_all([w], out)
    raws = out.settle(tr)
    wrong = {rid: error_type(raws[rid]) for rid, t in want.items() if error_type(raws[rid]) != t}
    out.check(
        "every bad message with an id got an error answer of the expected type",
        not wrong,
        dict(list(wrong.items())[:10]),
    )
    oks = [g["id"] for g in good] + [g for _, g, _ in chunk_rows]
    out.check("every good request (chunked ones too) answered ok", all(classify(raws[i]) == "ok" for i in oks))
    out.check("requests past their deadline answered expired", all(classify(raws[i]) == "expired" for i in late))
    logged = w.log().count("dropped a queue item that is not a Celery message") + w.log().count(
        "dropping a message without a task id"
    )
    examples = {}
    for rid in want:
        kind = rid.rsplit("-", 1)[0]
        if kind not in examples and raws[rid] is not None:
            meta = json.loads(raws[rid])
            err = (meta.get("vela2") or {}).get("error") or {
                "type": meta["result"].get("exc_type"),
                "message": str(meta["result"].get("exc_message")),
            }
            examples[kind] = f"{err['type']}: {str(err['message'])[:200]}"
    out.notes.update(
        {
            "error_answers": examples,
            "injected": {
                "bad_with_id": len(want),
                "kinds": sorted({rid.rsplit("-", 1)[0] for rid in want}),
                "past_deadline": len(late),
                "unanswerable_items": len(unanswerable),
            },
            "unanswerable_items_logged_as_dropped": logged,
            **worker_notes([w]),
        }
    )
    out.check(
        "every item without an id was dropped with a log line",
        logged >= len(unanswerable),
        f"{logged} of {len(unanswerable)}",
    )


def _past() -> Any:
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC) - timedelta(seconds=5)


def scenario_oversized(s: Suite, out: Outcome) -> None:
    """Texts past the documented hard limits (words, characters), thousands of labels and options,
    and a 50 MB message (the producer refuses to build it; pushed raw anyway, the worker answers
    it with limit_exceeded without decoding it), mixed into good traffic."""
    from vela2.config import LIMITS

    r = s.redis()
    rc = r.client()
    w = s.worker(r.url()).wait_ready()
    rss_before = w.rss_mb()
    tr = Tracker(r.url())
    base = good_row("x", 0)
    want: dict[str, str] = {}
    payloads: list[str] = []
    big = {
        "words": {**base, "text": "word " * (LIMITS.max_text_words + 5000)},
        "chars": {**base, "text": "x" * (LIMITS.max_text_chars + 1000)},
        "labels": {**base, "task": "span:pii_dev", "questions": [{"labels": [f"l{i}" for i in range(5000)]}]},
        "options": {**base, "questions": [{"options": [f"o{i}" for i in range(5000)]}]},
        "questions": {**base, "questions": [{"options": ["yes", "no"]}] * 1000},
        "s1tasks": {
            "model": MODEL,
            "input": "hi",
            "tasks": [{"name": f"t{i}", "kind": "choice", "options": ["a", "b"]} for i in range(1000)],
        },
    }
    sizes: dict[str, int] = {}
    for name, obj in big.items():
        rid = f"over-{name}"
        payloads.append(build_message([{**obj, "id": rid}], QUEUE, max_message_bytes=10**9).payload)
        want[rid] = "limit_exceeded"
        sizes[rid] = len(payloads[-1])
    # 50 MB: the producer refuses it with a clear error...
    huge = {**base, "id": "over-50mb", "text": "y " * (25 * 2**20)}
    producer = Client(r.url(), model=MODEL)
    try:
        producer.submit(huge)
        producer_refusal = None
    except LimitExceeded as e:
        producer_refusal = str(e)
    finally:
        producer.close()
    out.check("the producer refuses a 50 MB request with LimitExceeded", producer_refusal is not None, producer_refusal)
    # ...and a raw push of it gets a limit_exceeded answer from the worker; so does a 50 MB chunk
    payloads.append(build_message([huge], QUEUE, max_message_bytes=10**9).payload)
    want["over-50mb"] = "limit_exceeded"
    sizes["over-50mb"] = len(payloads[-1])
    chunk_ids = ["over-chunk-a", "over-chunk-b"]
    payloads.append(
        build_message(
            [{**huge, "id": chunk_ids[0]}, {**base, "id": chunk_ids[1]}], QUEUE, chunk=True, max_message_bytes=10**9
        ).payload
    )
    want.update(dict.fromkeys(chunk_ids, "limit_exceeded"))
    sizes["over-chunk"] = len(payloads[-1])
    good = good_rows("good", s.n(400))
    tr.add([g["id"] for g in good] + list(want))
    half = len(good) // 2
    t0 = time.monotonic()
    rc.lpush(QUEUE, *[build_message([g], QUEUE).payload for g in good[:half]])
    for p in payloads:
        rc.lpush(QUEUE, p)
    rc.lpush(QUEUE, *[build_message([g], QUEUE).payload for g in good[half:]])
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    elapsed = time.monotonic() - t0
    out.check("all answered and the queue drained", done)
    rss_after = w.rss_mb()
    out.check("the worker survived", w.alive())
    stop_all([w], out)
    raws = out.settle(tr)
    wrong = {rid: error_type(raws[rid]) for rid, t in want.items() if error_type(raws[rid]) != t}
    out.check("every oversized request answered limit_exceeded", not wrong, wrong)
    out.check("every good request answered ok", all(classify(raws[g["id"]]) == "ok" for g in good))
    messages = {}
    for rid in want:
        try:
            messages[rid] = json.loads(raws[rid])["vela2"]["error"]["message"][:160]
        except (TypeError, KeyError, ValueError):
            messages[rid] = None
    out.notes.update(
        {
            "injected": {rid: f"{n / 2**20:.1f} MiB message" for rid, n in sizes.items()},
            "limits": {
                "max_text_words": LIMITS.max_text_words,
                "max_text_chars": LIMITS.max_text_chars,
                "max_labels": LIMITS.max_labels,
                "max_options": LIMITS.max_options,
                "max_questions": LIMITS.max_questions,
                "max_tasks": LIMITS.max_tasks,
                "max_message_bytes": LIMITS.max_message_bytes,
            },
            "error_messages": messages,
            "producer_refusal": producer_refusal,
            "worker_rss_mb": {"before": _r(rss_before), "after": _r(rss_after)},
            "seconds_to_answer_all": round(elapsed, 1),
            **worker_notes([w]),
        }
    )


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def scenario_oom(s: Suite, out: Outcome) -> None:
    """CUDA-OOM-like errors, injected by test hooks: every batch over 600 padded tokens raises
    torch.OutOfMemoryError (a device short of memory: splitting and retrying must answer all), and
    any batch holding an `oom-` request raises (it fails alone: a per-request model_error)."""
    r = s.redis()
    rc = r.client()
    env = {TEST_OOM_ENV: "600", TEST_FAIL_ENV: "oom-"}
    w = s.worker(r.url(), env=env, max_wait_ms=50).wait_ready()
    tr = Tracker(r.url())
    client = Client(r.url(), model=MODEL)
    good = good_rows("good", s.n(1000))
    bad = good_rows("oom", s.n(20, minimum=2), start=7)
    mixed = good + bad
    random.Random(6).shuffle(mixed)
    tr.add(client.submit_many(mixed))
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    out.check("all answered and the queue drained", done)
    stop_all([w], out)
    raws = out.settle(tr)
    out.check("every good request answered ok after splitting", all(classify(raws[g["id"]]) == "ok" for g in good))
    types = {error_type(raws[b["id"]]) for b in bad}
    out.check("every oom- request failed alone with model_error", types == {"model_error"}, sorted(map(str, types)))
    notes = worker_notes([w])
    splits = w.log().count("splitting")
    out.check(
        "batches raised and were split",
        notes.get("raised", 0) > 0 and splits > 0,
        {"raised": notes.get("raised"), "split_log_lines": splits},
    )
    sample = next((json.loads(raws[b["id"]])["vela2"]["error"]["message"] for b in bad if raws[b["id"]]), None)
    out.notes.update(
        {
            "injected": "OutOfMemoryError for batches over 600 padded tokens (max_batch_tokens 2048); "
            "RuntimeError('simulated CUDA out of memory') for any batch holding an oom- request",
            "batches_split": splits,
            "per_request_error_example": sample,
            **notes,
        }
    )


def scenario_duplicate(s: Suite, out: Outcome) -> None:
    """Every message delivered twice (again once about half were answered, some a third time inside
    a chunk), to two workers: duplicates are skipped or re-scored, and the first stored answer never
    changes."""
    r = s.redis()
    rc = r.client()
    workers = start_ready(s, 2, r.url(), max_buffered=16)
    tr = Tracker(r.url())
    rows = good_rows("dup", s.n(600))
    payloads = [build_message([x], QUEUE).payload for x in rows]
    tr.add([x["id"] for x in rows])
    rc.lpush(QUEUE, *payloads)
    wait_until(lambda: tr.poll() <= len(rows) // 2, 120, "half answered")
    rc.lpush(QUEUE, *payloads)  # every message again: answered ones and ones still queued or held
    third = rows[: max(2, len(rows) // 10)]
    for k in range(0, len(third), 5):
        rc.lpush(QUEUE, build_message(third[k : k + 5], QUEUE, chunk=True).payload)
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    out.check("all answered and the queue drained", done)
    stop_all(workers, out)
    notes = worker_notes(workers)
    deliveries = 2 * len(rows) + len(third)
    out.notes.update(
        {
            "injected": f"{len(rows)} messages pushed twice, {len(third)} requests a third time in chunks; 2 workers",
            "deliveries": deliveries,
            **notes,
        }
    )
    out.settle(tr)
    redundant = notes.get("duplicates_skipped", 0) + notes.get("answered", 0) - len(rows)
    out.check(
        "every duplicate delivery was skipped or re-scored harmlessly (counts add up)",
        redundant == deliveries - len(rows),
        {"skipped + re-scored": redundant},
    )
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)


def scenario_visibility(s: Suite, out: Outcome) -> None:
    """A batch slower than the visibility timeout. (a) The start-up check refuses a visibility
    timeout shorter than the worker's worst case: exit status and message recorded. (b) Forced
    anyway: worker 1 runs a slow device (1 s per batch) under a long timeout, worker 2 a short one
    that passes its own check; worker 2's restore sweep hands worker 1's held messages out again
    while worker 1 still scores them, so requests are scored twice; the answers never change."""
    r = s.redis()
    rc = r.client()
    w0 = s.worker(r.url(), visibility_timeout_s=0.5)
    code = w0.wait_exit(READY_TIMEOUT_S)
    line = next((x.strip() for x in w0.log().splitlines() if "visibility timeout 0.5 s is too short" in x), None)
    out.check(
        "the start-up check refuses a 0.5 s visibility timeout (non-zero exit, clear message)",
        code != 0 and line is not None,
        {"exit": code},
    )
    out.notes["refusal"] = {"exit_status": code, "message": line}
    delay = 1.0
    short = s.visibility_for(2048, 4)
    # worker 1: ~2 rows per 1 s batch and 32 buffered, so a message waits there far longer than `short`
    w1 = s.worker(
        r.url(), env={TEST_DELAY_ENV: str(delay)}, max_batch_tokens=128, max_buffered=32, visibility_timeout_s=3600
    ).wait_ready()
    tr = Tracker(r.url())
    client = Client(r.url(), model=MODEL)
    rows = good_rows("vis", s.n(300, minimum=40))
    tr.add(client.submit_many(rows[:32]))
    wait_until(lambda: unacked(rc) >= 32, 60, "worker 1 holding 32 messages")
    w2 = s.worker(r.url(), visibility_timeout_s=short, max_buffered=4).wait_ready()
    tr.add(client.submit_many(rows[32:]))
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    out.check("all answered and the queue drained", done)
    # worker 1 may still hold copies that worker 2 already answered: stop it first (it returns what it
    # cannot finish), then let worker 2 skip those as duplicates
    stop_all([w1], out)
    out.check("the queue drained again after worker 1 stopped", tr.wait(60, until=lambda: drained(rc)))
    stop_all([w2], out)
    notes = worker_notes([w1, w2])
    out.settle(tr)
    redundant = notes.get("duplicates_skipped", 0) + notes.get("answered", 0) - len(rows)
    out.notes.update(
        {
            "injected": f"worker 1: {delay} s per batch, 32 buffered, visibility 3600 s; worker 2: visibility "
            f"{short} s (its restore sweep redelivers worker 1's held messages)",
            "short_visibility_s": short,
            "redeliveries": redundant,
            **notes,
        }
    )
    out.check("duplicates happened (redelivered while held) and were harmless", redundant > 0, redundant)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)


def scenario_poison(s: Suite, out: Outcome) -> None:
    """A request that kills its worker process every time (test hook: os._exit(137) in its batch).
    A supervisor restarts the worker after each crash; after max_attempts (3) deliveries the request
    is answered with a `poison` error and moved to the dead-letter list; the rest are answered."""
    r = s.redis()
    rc = r.client()
    settings = {"max_buffered": 2, "max_batch_tokens": 768, "max_wait_ms": 50}
    vis = s.visibility_for(768, 2)
    env = {TEST_CRASH_ENV: "poison-"}
    tr = Tracker(r.url())
    client = Client(r.url(), model=MODEL)
    rows = good_rows("good", s.n(200))
    rows.insert(len(rows) // 3, good_row("poison-1", 1))
    tr.add(client.submit_many(rows))
    workers = [s.worker(r.url(), env=env, visibility_timeout_s=vis, **settings)]
    exits: list[int] = []
    t0 = time.monotonic()
    while not (tr.poll() == 0 and drained(rc)):
        if time.monotonic() - t0 > SETTLE_TIMEOUT_S + 60:
            break
        if not workers[-1].alive():
            exits.append(workers[-1].wait_exit(5))
            if len(exits) > 6:
                break  # an endless crash loop: stop here, the checks below fail
            workers.append(s.worker(r.url(), env=env, visibility_timeout_s=vis, **settings))
        time.sleep(POLL_S)
    stop_all([w for w in workers if w.alive()], out)
    raws = out.settle(tr)
    dead = [json.loads(x) for x in rc.lrange(keys.dead_letter(MODEL), 0, -1)]
    poison_raw = raws.get("poison-1")
    msg = json.loads(poison_raw)["vela2"]["error"]["message"] if poison_raw else None
    out.check("the worker crashed exactly max_attempts (3) times, then never again", exits == [137] * 3, exits)
    out.check("the poison request got a `poison` error answer", error_type(poison_raw) == "poison", msg)
    out.check("it is in the dead-letter list", [d["id"] for d in dead] == ["poison-1"], [d["id"] for d in dead])
    out.check("every other request answered ok", out.answered_ok == out.requests - 1, out.answered_ok)
    out.check("no attempt counter left behind", not rc.keys(keys.attempts_key("*")))
    out.notes.update(
        {
            "injected": "one request whose batch calls os._exit(137); supervisor restarts the worker after each crash",
            "worker_exits": exits,
            "visibility_timeout_s": vis,
            "poison_answer": msg,
            "dead_letter_list": keys.dead_letter(MODEL),
            "dead_letter_entries": len(dead),
            "seconds_to_dead_letter": round(time.monotonic() - t0, 1),
            **worker_notes(workers),
        }
    )


def scenario_redis_down(s: Suite, out: Outcome) -> None:
    """Redis unreachable for 30 s (x scale) with a full queue: redis-server (AOF) stopped right after
    the requests were queued, started again on the same port. Producers submitting meanwhile get
    connection errors and retry with backoff; workers reconnect (Celery's broker connection retry)
    and everything already queued is answered."""
    r = s.redis(aof=True)
    rc = r.client(socket_timeout=5)
    vis = s.visibility_for(2048, 8)
    workers = start_ready(s, 2, r.url(), visibility_timeout_s=vis, max_buffered=8)
    tr = Tracker(r.url())
    client = Client(r.url(), model=MODEL)
    queued = good_rows("queued", s.n(1000, minimum=40))
    tr.add(client.submit_many(queued))
    client.close()
    wait_until(lambda: tr.poll() < len(queued) - 2, 60, "the first answers")
    outage = max(2.0, 30.0 * min(1.0, s.scale))
    in_queue = rc.llen(QUEUE)
    r.stop()
    t_down = time.monotonic()
    late = good_rows("during", s.n(200, minimum=10))
    tr.add([x["id"] for x in late])
    prod = Producer(r.url(), late, per_s=max(10.0, len(late) / 10), batch=5)
    prod.start()
    time.sleep(max(0.0, outage - (time.monotonic() - t_down)))
    alive_during = [w.alive() for w in workers]
    r.start()
    down_s = time.monotonic() - t_down
    resumed_s, fetch_s = recovery(rc, tr, tr.answered(), 180)
    prod.join(300)
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    out.check("all answered and the queue drained", done)
    out.check("workers stayed up through the outage and after", all(alive_during) and all(w.alive() for w in workers))
    out.check("producers saw clear connection errors during the outage", prod.errors > 0, prod.first_error)
    stop_all(workers, out)
    reconnects = sum(
        w.log().count("Cannot connect to redis") + w.log().count("Connection to broker lost") for w in workers
    )
    out.notes.update(
        {
            "injected": f"redis-server stopped for {down_s:.1f} s with {in_queue} messages queued",
            "queued_at_outage": in_queue,
            "answers_resumed_after_s": round(resumed_s, 1),
            "workers_fetching_again_after_s": round(fetch_s, 1),
            "worker_reconnect_log_lines": reconnects,
            "visibility_timeout_s": vis,
            **prod.notes(),
            **worker_notes(workers),
        }
    )
    out.settle(tr)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)


SCENARIOS: dict[str, Callable[[Suite, Outcome], None]] = {
    "sigkill": scenario_sigkill,
    "sigterm": scenario_sigterm,
    "redis_restart": scenario_redis_restart,
    "malformed": scenario_malformed,
    "oversized": scenario_oversized,
    "oom": scenario_oom,
    "duplicate": scenario_duplicate,
    "visibility": scenario_visibility,
    "poison": scenario_poison,
    "redis_down": scenario_redis_down,
}


def run_scenario(s: Suite, name: str) -> Outcome:
    """Run one scenario in its own processes; an exception becomes a failed check, never a crash."""
    out = Outcome(name)
    t0 = time.monotonic()
    log.info("scenario %s ...", name)
    try:
        SCENARIOS[name](s, out)
    except Exception as e:
        log.exception("scenario %s raised", name)
        out.check("the scenario ran to the end", False, f"{type(e).__name__}: {str(e)[:1500]}")
    finally:
        s.cleanup()
    out.seconds = round(time.monotonic() - t0, 1)
    log.info(
        "scenario %s: %d requests, ok %d, error %d, expired %d, lost %d, changed %d in %.1f s (%s)",
        name,
        out.requests,
        out.answered_ok,
        out.answered_error,
        out.expired,
        out.lost,
        out.duplicate_answers_changed,
        out.seconds,
        "passed" if out.to_json()["passed"] else "FAILED",
    )
    return out


# --- soak ------------------------------------------------------------------------------------------


def _gpu_memory(port: int) -> dict[str, float] | None:
    """vela2_gpu_memory_bytes by kind (MiB) from the worker's /metrics; None on a CPU worker."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    found = {
        m.group(1): float(m.group(2)) / 2**20
        for m in re.finditer(r'^vela2_gpu_memory_bytes\{[^}]*kind="(\w+)"[^}]*\} (\S+)$', text, re.M)
    }
    return found or None


def run_soak(s: Suite, minutes: float, sample_s: float = 5.0) -> dict[str, Any]:
    """Steady traffic for `minutes` on one worker; samples its RSS and GPU memory every `sample_s`."""
    r = s.redis()
    rc = r.client()
    w = s.worker(r.url(), metrics=True).wait_ready()
    tr = Tracker(r.url())
    client = Client(r.url(), model=MODEL)
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    end = t0 + minutes * 60
    next_sample = t0
    i = 0
    try:
        while time.monotonic() < end:
            if len(tr.ids) - tr.answered() < 64:  # keep ~64 in flight: steady, not a growing backlog
                rows = good_rows("soak", 16, start=i)
                i += 16
                tr.add(client.submit_many(rows))
            tr.poll()
            if time.monotonic() >= next_sample:
                samples.append(
                    {
                        "t_s": round(time.monotonic() - t0, 1),
                        "rss_mb": _r(w.rss_mb()),
                        "gpu_mb": _gpu_memory(w.metrics_port),
                        "answered": tr.answered(),
                        "queue": int(rc.llen(QUEUE)),
                    }
                )
                next_sample += sample_s
            time.sleep(0.05)
        done = tr.wait(120, until=lambda: drained(rc))
        code = w.terminate()
        f = tr.final()
        rss = [x["rss_mb"] for x in samples if x["rss_mb"] is not None]
        third = max(1, len(rss) // 3)
        return {
            "minutes": minutes,
            "requests": f["requests"],
            "answered_ok": f["answered_ok"],
            "answered_error": f["answered_error"],
            "lost": f["lost"],
            "drained": done,
            "worker_exit": code,
            "requests_per_s": round(f["requests"] / max(1e-9, minutes * 60), 1),
            "rss_mb": {
                "first": rss[0] if rss else None,
                "last": rss[-1] if rss else None,
                "max": max(rss) if rss else None,
                "growth_last_third_vs_first_third": round(sum(rss[-third:]) / third - sum(rss[:third]) / third, 1)
                if rss
                else None,
            },
            "gpu": "from /metrics vela2_gpu_memory_bytes" if any(x["gpu_mb"] for x in samples) else None,
            "samples": samples,
        }
    finally:
        client.close()
        tr.close()
        s.cleanup()


# --- the suite -------------------------------------------------------------------------------------


@contextmanager
def suite(checkpoint: str | None, scale: float, device: str, keep: bool = False) -> Iterator[Suite]:
    """A scratch directory and the demo checkpoint (written once, unless one is given)."""
    import vela2

    tmp = Path(tempfile.mkdtemp(prefix="vela2-reliability-"))
    try:
        ckpt = Path(checkpoint) if checkpoint else vela2.init_demo(tmp / "demo")
        s = Suite(tmp, Path(ckpt), scale=scale, device=device)
        try:
            yield s
        finally:
            s.cleanup()
    finally:
        if keep:
            log.info("logs kept in %s", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run(
    names: list[str],
    *,
    scale: float = 1.0,
    checkpoint: str | None = None,
    device: str = "cpu",
    fuzz_examples: int = 500,
    soak_minutes: float = 0.0,
    keep: bool = False,
) -> dict[str, Any]:
    """Run the named scenarios (then fuzz and soak); returns the report."""
    report: dict[str, Any] = {"scale": scale, "device": device, "scenarios": []}
    t0 = time.monotonic()
    with suite(checkpoint, scale, device, keep) as s:
        for name in names:
            report["scenarios"].append(run_scenario(s, name).to_json())
        if fuzz_examples > 0:
            from bench.fuzz import run_fuzz

            report["fuzz"] = run_fuzz(_model(s.checkpoint), fuzz_examples)
        if soak_minutes > 0:
            report["soak"] = run_soak(s, soak_minutes)
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["lost"] = sum(x["lost"] for x in report["scenarios"])
    report["passed"] = all(x["passed"] for x in report["scenarios"]) and not report.get("fuzz", {}).get("crashes")
    if "soak" in report:
        report["passed"] = report["passed"] and report["soak"]["lost"] == 0
    return report


def main(argv: list[str] | None = None) -> int:
    """CLI: run, write JSON, print a table; exit 1 when a request was lost or a check failed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results/reliability.json")
    p.add_argument("--only", help=f"comma-separated scenario names ({', '.join(SCENARIOS)}); 'none' for none")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies request counts and the redis_down outage")
    p.add_argument("--soak-minutes", type=float, default=0.0, help="also run steady traffic this long")
    p.add_argument("--fuzz-examples", type=int, default=500, help="inputs per fuzz target (0: no fuzz)")
    p.add_argument("--checkpoint", help="checkpoint directory (default: a fresh demo checkpoint)")
    p.add_argument("--device", default="cpu", help="worker device (cuda:0 on a GPU host)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (worker and redis logs)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.only == "none":
        names: list[str] = []
    elif args.only:
        names = [x.strip() for x in args.only.split(",") if x.strip()]
        unknown = [x for x in names if x not in SCENARIOS]
        if unknown:
            p.error(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    else:
        names = list(SCENARIOS)
    report = run(
        names,
        scale=args.scale,
        checkpoint=args.checkpoint,
        device=args.device,
        fuzz_examples=args.fuzz_examples,
        soak_minutes=args.soak_minutes,
        keep=args.keep,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")
    print(
        f"{'scenario':15s} {'requests':>8s} {'ok':>6s} {'error':>6s} {'expired':>7s} {'lost':>5s} {'changed':>7s} "
        f"{'seconds':>7s}  result"
    )
    for x in report["scenarios"]:
        print(
            f"{x['name']:15s} {x['requests']:8d} {x['answered_ok']:6d} {x['answered_error']:6d} {x['expired']:7d} "
            f"{x['lost']:5d} {x['duplicate_answers_changed']:7d} {x['seconds']:7.1f}  "
            f"{'passed' if x['passed'] else 'FAILED: ' + '; '.join(c['check'] for c in x['checks'] if not c['ok'])}"
        )
    if "fuzz" in report:
        f = report["fuzz"]
        print(f"fuzz: {f['inputs_tried']} inputs tried, {f['crashes']} crashes")
    if "soak" in report:
        k = report["soak"]
        print(f"soak: {k['requests']} requests in {k['minutes']} min, lost {k['lost']}, RSS {k['rss_mb']}")
    print(f"wrote {out} ({report['seconds']:.0f} s)")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
