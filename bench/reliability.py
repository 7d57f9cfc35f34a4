"""The fault suite: real redis-server, real `celery -A worker.app worker` processes on the demo
checkpoint, real producers; each scenario injects one kind of fault and counts what became of every
request it sent.

    .venv/bin/python -m bench.reliability [--out bench/results/reliability.json] [--only NAME,...]
        [--scale 1.0] [--soak-minutes N] [--checkpoint DIR] [--device cpu] [--fuzz-examples 500]
        [--repeat N] [--cpu-hog K]

Every scenario is self-contained: its own redis-server on a free loopback port in a temporary
directory (AOF on where a restart must keep the queue), its own workers configured through VELA2_*
variables (plus stack.faults' test-only VELA2_TEST_* hooks where a fault is injected), its own
requests; both come from the process harness (stack.harness), and the workers' counts from the
engine's JSON stats line at shutdown. After the scenario settles, every request id is read back:

- `answered_ok` / `answered_error` / `expired`: the stored answer's status;
- `lost`: no stored answer at all (the suite exits non-zero when any scenario loses one);
- `duplicate_answers_changed`: answers that differ from the first value the suite saw for that id
  (results are write-once: this must stay 0 however often a message is delivered).

With `--broker amqp://USER:PW@HOST:PORT` (this host's RabbitMQ; `rabbitmqctl` makes a vhost per
scenario) the suite runs the RabbitMQ scenarios instead (AMQP_SCENARIOS: sigkill, sigterm,
broker_drop, broker_restart, duplicate, poison, malformed), results in a fresh redis-server each;
broker_restart stops and starts the RabbitMQ application (`rabbitmqctl stop_app` / `start_app`).

Scenarios: sigkill, sigterm, redis_restart, malformed, oversized, oom, duplicate, visibility,
poison, redis_down, redis_full, bad_id, queue_items (also over rediss:// when redis-server has
TLS), deep_body, start_failures (see each function's docstring), then the hypothesis fuzz of the
request schemas and the renderer (bench.fuzz) and, with --soak-minutes, a soak run sampling worker
RSS and GPU memory. `--scale` multiplies request counts (and the redis_down outage); the smoke test
runs a few scenarios at a tiny scale. `--repeat N` runs the selected scenarios N times and
`--cpu-hog K` runs K busy-loop processes beside them (a loaded machine); the report lists every
run's outcome (`scenarios`, each with its `run`; `runs` per scenario), never only the best. Exit
status: 0 when nothing was lost, no answer changed and every check of every run held; 1 otherwise.
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
import subprocess
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
from urllib.parse import urlsplit, urlunsplit

import redis as redis_lib

from producer.client import Client
from stack.faults import Faults
from stack.harness import READY_TIMEOUT_S, RabbitVhost, RedisServer, WorkerProcess, free_port
from vela2.errors import LimitExceeded
from vela2.wire import keys
from vela2.wire.messages import MAX_JSON_DEPTH, build_message
from vela2.wire.urls import mask_url

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
        self.amqp_server: str | None = None  # --broker amqp://...: the AMQP scenarios run on this RabbitMQ
        self.broker_url: str | None = None  # the current scenario's broker (a vhost of amqp_server), or None
        self._vhosts: list[RabbitVhost] = []

    def n(self, base: int, minimum: int = 8) -> int:
        """A request count scaled by --scale."""
        return max(minimum, round(base * self.scale))

    def redis(
        self, *, aof: bool = False, extra_args: tuple[str, ...] = (), kind: type[RedisServer] = RedisServer
    ) -> RedisServer:
        """A fresh redis-server (`kind`: a subclass such as TlsRedisServer), stopped at cleanup."""
        r = kind(self.workdir / f"redis{next(self._redis_numbers)}", aof=aof, extra_args=extra_args)
        self._procs.append(r)
        return r.start()

    def vhost(self) -> RabbitVhost:
        """A fresh vhost on the --broker RabbitMQ for one scenario; the workers it starts next use it."""
        assert self.amqp_server is not None, "an AMQP scenario needs --broker amqp://..."
        v = RabbitVhost.create(self.amqp_server)
        self._vhosts.append(v)
        self.broker_url = v.url
        return v

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
            broker_url=self.broker_url,
            **{**BASE_SETTINGS, **settings, "metrics_port": port},
        )
        self._procs.append(w)
        return w

    def visibility_for(self, max_batch_tokens: int, delay_s: float = 0.0, margin: float = 3.0) -> float:
        """A short visibility timeout that a worker with these settings accepts at start: the
        worker's own rule with the worst batch measured here (once per batch size), times `margin`
        (a worker measures its worst batch on a machine busy with other processes), at least 8 s."""
        from worker.runtime.checks import required_visibility_s

        worst = self.worst_batch_s.get(max_batch_tokens)
        if worst is None:
            worst = self.worst_batch_s[max_batch_tokens] = _measure_worst(self.checkpoint, max_batch_tokens)
        need = required_visibility_s(BASE_SETTINGS["max_wait_ms"], worst + delay_s)
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
        for v in self._vhosts:
            v.delete()
        self._vhosts.clear()
        self.broker_url = None


_MODEL_CACHE: dict[str, Any] = {}


def _model(checkpoint: Path) -> Any:
    if "model" not in _MODEL_CACHE:
        import torch

        import vela2

        _MODEL_CACHE["model"] = vela2.load(checkpoint, dtype=torch.float32)
    return _MODEL_CACHE["model"]


def _measure_worst(checkpoint: Path, max_batch_tokens: int) -> float:
    from worker.runtime.warmup import measure_worst_batch_s
    from worker.settings import EngineSettings

    settings = EngineSettings(max_batch_tokens=max_batch_tokens, precision="fp32")  # the fp32 model on this CPU
    return measure_worst_batch_s(_model(checkpoint), settings)


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
    run: int = 1  # which run of the scenario (--repeat)
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

    def skip(self, what: str, reason: str) -> None:
        """Record a claim that could not be tested here, with why (never silently)."""
        self.checks.append({"check": what, "ok": True, "skipped": reason})
        log.warning("%s: check skipped: %s (%s)", self.name, what, reason)

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


def _ids_in_item(item: bytes) -> set[str]:
    """The request ids in a queue item or an `unacked` value ([envelope, exchange, routing key])."""
    try:
        env = json.loads(item)
        env = env[0] if isinstance(env, list) else env
        body = json.loads(base64.b64decode(env["body"]))
        args = body[0]
        objs = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        return {o["id"] for o in objs if isinstance(o, dict) and isinstance(o.get("id"), str)}
    except (ValueError, KeyError, TypeError, IndexError):
        return set()


def lost_forensics(r: redis_lib.Redis, ids: list[str], workers: list[WorkerProcess]) -> dict[str, Any]:
    """Where the traces of lost requests are: the submitted marker (set with the push; the store
    turns it into "answered"), whether the message is still queued or in kombu's `unacked` hash,
    and which worker logs name the id. No marker change, no queue, no unacked entry and no log
    line: the message left the queue (BRPOP) and never reached a worker."""
    try:
        queued = set().union(*(_ids_in_item(x) for x in r.lrange(QUEUE, 0, -1)))
        held = set().union(*(_ids_in_item(x) for x in r.hvals(keys.UNACKED_KEY)))
        markers = r.mget([keys.submitted_key(i) for i in ids]) if ids else []
    except redis_lib.RedisError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    found = {}
    for rid, marker in zip(ids, markers, strict=True):
        pattern = re.compile(rf"\b{re.escape(rid)}\b(?!\d)")
        found[rid] = {
            "submitted_marker": marker.decode() if marker else None,
            "in_queue": rid in queued,
            "in_unacked": rid in held,
            "named_in_worker_logs": [w.name for w in workers if pattern.search(w.log())],
        }
    return found


def raw_message(requests: list[Any], *, chunk: bool = False, max_bytes: int = 10**9, **kw: Any) -> dict[str, Any]:
    """A built message as its envelope dict (to tamper with); size limits off unless given."""
    return json.loads(build_message(requests, QUEUE, chunk=chunk, max_message_bytes=max_bytes, **kw).payload)


def set_body(env: dict[str, Any], body: bytes) -> dict[str, Any]:
    env["body"] = base64.b64encode(body).decode("ascii")
    return env


def _retried_submit_errors() -> tuple[type[BaseException], ...]:
    import amqp.exceptions
    import kombu.exceptions

    # Redis away; RabbitMQ away (refused, forced closed, kombu's retries given up) or nacking a publish
    return (redis_lib.ConnectionError, redis_lib.TimeoutError, OSError, kombu.exceptions.OperationalError,
            amqp.exceptions.ConnectionError, amqp.exceptions.MessageNacked)


RETRIED_SUBMIT_ERRORS = _retried_submit_errors()


class Producer(threading.Thread):
    """Submits rows in small batches at a steady pace through producer.Client; on a connection
    error it records the error and retries the same batch with exponential backoff (0.1 s doubling
    to 2 s), so a Redis (or, with `broker_url`, a RabbitMQ) outage delays submissions and loses none."""

    def __init__(self, redis_url: str, rows: list[dict[str, Any]], *, per_s: float, batch: int = 10,
                 broker_url: str | None = None):
        super().__init__(daemon=True)
        self.client = Client(redis_url, model=MODEL, broker_url=broker_url)
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
                except RETRIED_SUBMIT_ERRORS as e:
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
    vis = s.visibility_for(128, delay_s=delay)
    w1 = s.worker(r.url(), faults=Faults(delay_s=delay), visibility_timeout_s=vis, **settings).wait_ready()
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
        r.url(), faults=Faults(delay_s=0.5), max_batch_tokens=128, max_buffered=12, shutdown_timeout_s=1
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
    vis = s.visibility_for(2048)
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
    if out.lost:
        out.notes["lost_forensics"] = lost_forensics(rc, out.notes.get("lost_ids", []), workers)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)
    tr.close()


def scenario_malformed(s: Suite, out: Outcome) -> None:
    """Undecodable bodies, wrong task names, schema-invalid payloads, bad headers and non-Celery
    items, mixed into good traffic. Every bad message that carries an id gets an error answer with
    the right type (a task not served here: invalid_request, refused by the worker's channel before
    Celery sees it); items without an id go to the dead-letter list with their reason; the good
    ones are all answered ok."""
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

    bad("wrongtask", "invalid_request", wrong_task)

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
    # no id to answer under: dead-lettered with the reason (not requests)
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
    dead = [json.loads(x) for x in rc.lrange(keys.dead_letter(MODEL), 0, -1)]
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
            "dead_letter_entries": len(dead),
            "dead_letter_reasons": sorted({str(d.get("reason"))[:120] for d in dead}),
            **worker_notes([w]),
        }
    )
    out.check(
        "every item without an id is on the dead-letter list with a reason (and nothing else is)",
        len(dead) == len(unanswerable) and all(d.get("reason") and "item" in d for d in dead),
        f"{len(dead)} entries for {len(unanswerable)} items",
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
    faults = Faults(oom_above_tokens=600, fail_prefix="oom-")
    w = s.worker(r.url(), faults=faults, max_wait_ms=50).wait_ready()
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
    short = s.visibility_for(2048)
    # worker 1: ~2 rows per 1 s batch and 32 buffered, so a message waits there far longer than `short`
    w1 = s.worker(
        r.url(), faults=Faults(delay_s=delay), max_batch_tokens=128, max_buffered=32, visibility_timeout_s=3600
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
    vis = s.visibility_for(768)
    faults = Faults(crash_prefix="poison-")
    tr = Tracker(r.url())
    client = Client(r.url(), model=MODEL)
    rows = good_rows("good", s.n(200))
    rows.insert(len(rows) // 3, good_row("poison-1", 1))
    tr.add(client.submit_many(rows))
    workers = [s.worker(r.url(), faults=faults, visibility_timeout_s=vis, **settings)]
    exits: list[int] = []
    t0 = time.monotonic()
    while not (tr.poll() == 0 and drained(rc)):
        if time.monotonic() - t0 > SETTLE_TIMEOUT_S + 60:
            break
        if not workers[-1].alive():
            exits.append(workers[-1].wait_exit(5))
            if len(exits) > 6:
                break  # an endless crash loop: stop here, the checks below fail
            workers.append(s.worker(r.url(), faults=faults, visibility_timeout_s=vis, **settings))
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
    vis = s.visibility_for(2048)
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
    if out.lost:
        out.notes["lost_forensics"] = lost_forensics(rc, out.notes.get("lost_ids", []), workers)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)


# --- Redis full, unusable ids, raw queue items, deep JSON, start-up failures ----------------------

FILL_VALUE_BYTES = 64 * 1024  # one fill key (SET) while filling Redis up to its maxmemory
FULL_MAXMEMORY = "16mb"  # redis_full: room for the queue and the answers, little more
DEEP = 100_000  # nesting of the deep JSON items (the wire limit is 64 levels)


FULL_MARGIN_BYTES = 2**20  # once full, maxmemory is held this far below the memory in use


def fill_redis(r: redis_lib.Redis, prefix: str, limit_bytes: int = 64 * 2**20) -> dict[str, int]:
    """SET big keys `prefix<i>` until Redis refuses with OutOfMemoryError (maxmemory, noeviction),
    then hold it full: maxmemory is lowered to FULL_MARGIN_BYTES below the memory in use, so that
    the few KiB Redis frees now and then (client buffers) never let a small write through.
    Returns the keys written and both limits; RuntimeError when `limit_bytes` went in unrefused."""
    value = b"x" * FILL_VALUE_BYTES
    configured = int(r.config_get("maxmemory")["maxmemory"])
    for i in range(limit_bytes // FILL_VALUE_BYTES + 1):
        try:
            r.set(f"{prefix}{i}", value)
        except redis_lib.exceptions.OutOfMemoryError:
            used = int(r.info("memory")["used_memory"])
            r.config_set("maxmemory", max(1, min(configured, used) - FULL_MARGIN_BYTES))
            return {"keys": i, "maxmemory": configured, "held_at": max(1, min(configured, used) - FULL_MARGIN_BYTES),
                    "used_memory": used}
    raise RuntimeError(f"Redis took {limit_bytes / 2**20:.0f} MiB of fill keys without refusing a write")


def free_redis(r: redis_lib.Redis, prefix: str, fill: dict[str, int]) -> None:
    """Delete the fill keys `prefix<0..n>` (DEL is allowed while Redis is full), then give maxmemory
    its configured value back."""
    names = [f"{prefix}{i}" for i in range(fill["keys"] + 1)]
    for k in range(0, len(names), 100):
        r.delete(*names[k : k + 100])
    r.config_set("maxmemory", fill["maxmemory"])


def refuses_writes(r: redis_lib.Redis) -> bool:
    """True while a small write is refused with OutOfMemoryError (the probe key is removed)."""
    try:
        r.set("vela2:bench:probe", b"1")
    except redis_lib.exceptions.OutOfMemoryError:
        return True
    r.delete("vela2:bench:probe")
    return False


def metric(port: int, name: str) -> float | None:
    """One unlabelled sample of a worker's /metrics (None when unreachable or absent)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


BLOCKED_METRIC = "vela2_redis_write_blocked_seconds"
REFUSAL_LOG = re.compile(r"Redis refuses writes .* nothing is dropped")


def log_problems(w: WorkerProcess) -> list[str]:
    """Log lines of a worker's safety nets (a bug caught, a message left for the visibility timeout)."""
    marks = ("engine loop error", "opening a message failed", "Traceback (most recent call last)")
    return [x[:300] for x in w.log().splitlines() if any(m in x for m in marks)][:5]


def scenario_redis_full(s: Suite, out: Outcome) -> None:
    """Redis at its maxmemory (16 MB, noeviction: writes refused with OOM, nothing evicted), filled
    with big SET keys until it refuses, then held full (maxmemory 1 MiB below the memory in use,
    see fill_redis). (a) A worker started while Redis is full does not exit: it logs that Redis
    refuses writes and waits; once the fill keys are deleted it answers every request queued
    before. (b) A worker on a slow device scoring a queue when Redis fills up: it
    keeps what it took in memory, `vela2_redis_write_blocked_seconds` says how long it has waited,
    and after freeing every request is answered exactly once, by the same worker process."""
    r = s.redis(extra_args=("--maxmemory", FULL_MAXMEMORY))
    rc = r.client(socket_timeout=10)
    client = Client(r.url(), model=MODEL)
    tr = Tracker(r.url())
    hold_s = max(3.0, 10.0 * min(1.0, s.scale))  # how long Redis stays full once the worker waits
    # (a) start while full
    rows_a = good_rows("fullstart", s.n(40, minimum=8))
    tr.add(client.submit_many(rows_a))
    filled_a = fill_redis(rc, "fill:a:")
    full_a = refuses_writes(rc)
    wa = s.worker(r.url())
    pid_a = wa.pid
    wait_until(lambda: bool(REFUSAL_LOG.search(wa.log())) or not wa.alive(), READY_TIMEOUT_S,
               "worker (a) to log that Redis refuses writes")
    t_full = time.monotonic()
    while time.monotonic() - t_full < hold_s and wa.alive():
        time.sleep(POLL_S)
    alive_while_full = wa.alive()
    answered_while_full = len(rows_a) - tr.poll()
    full_a = full_a and refuses_writes(rc)
    line = next((x.strip() for x in wa.log().splitlines() if REFUSAL_LOG.search(x)), None)
    out.check("(a) Redis refused writes from the fill to the free", full_a)
    out.check("(a) a worker started while Redis is full stays up and says why it waits",
              alive_while_full and line is not None, line)
    out.check("(a) nothing answered while Redis was full (nothing could be stored)", answered_while_full == 0,
              answered_while_full)
    free_redis(rc, "fill:a:", filled_a)
    t_free = time.monotonic()
    done_a = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    answered_a_s = time.monotonic() - t_free
    out.check("(a) after freeing, every request queued before is answered and the queue drained", done_a,
              f"{tr.poll()} missing")
    out.check("(a) the same worker process did it (never exited)", wa.alive() and wa.pid == pid_a, wa.pid)
    stop_all([wa], out)
    ca = worker_counts(wa) or {}
    out.check("(a) answered exactly once (no duplicate, nothing returned)",
              ca.get("answered") == len(rows_a) and ca.get("duplicates_skipped") == 0, ca)
    # (b) fill while a worker scores
    delay = 0.5
    settings: dict[str, Any] = {"max_batch_tokens": 128, "max_buffered": 6}  # 2 rows per 0.5 s batch, 4 buffered
    wb = s.worker(r.url(), faults=Faults(delay_s=delay), metrics=True, **settings).wait_ready()
    pid_b = wb.pid
    rows_b = good_rows("fullrun", s.n(60, minimum=40))
    tr.add(client.submit_many(rows_b))
    wait_until(lambda: tr.poll() <= len(rows_b) - 2, 120, "worker (b) to answer a few")
    filled_b = fill_redis(rc, "fill:b:")
    t_fill = time.monotonic()
    tr.poll()
    answered_at_fill = tr.answered()
    blocked_max = 0.0
    seen = None
    while time.monotonic() - t_fill < 120 and wb.alive():  # until the metric shows the wait, then hold_s more
        blocked = metric(wb.metrics_port, BLOCKED_METRIC) or 0.0
        blocked_max = max(blocked_max, blocked)
        if seen is None and blocked > 0:
            seen = time.monotonic() - t_fill
        if seen is not None and time.monotonic() - t_fill >= seen + hold_s:
            break
        time.sleep(0.25)
    still_full = refuses_writes(rc)
    tr.poll()
    answered_while_full_b = tr.answered() - answered_at_fill
    held_b = unacked(rc)
    queued_b = int(rc.llen(QUEUE))
    alive_full_b = wb.alive()
    free_redis(rc, "fill:b:", filled_b)
    t_free_b = time.monotonic()
    done_b = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    answered_b_s = time.monotonic() - t_free_b
    back_to_zero = False
    with_deadline = time.monotonic() + 60
    while time.monotonic() < with_deadline:
        if metric(wb.metrics_port, BLOCKED_METRIC) == 0.0:
            back_to_zero = True
            break
        time.sleep(0.2)
    out.check("(b) Redis really refused writes for the whole hold", still_full)
    out.check("(b) nothing answered while Redis was full (nothing could be stored)", answered_while_full_b == 0,
              answered_while_full_b)
    out.check(f"(b) {BLOCKED_METRIC} > 0 while Redis was full", blocked_max > 0, round(blocked_max, 2))
    out.check("(b) the worker stayed up while Redis was full", alive_full_b)
    out.check("(b) after freeing, every request answered and the queue drained", done_b, f"{tr.poll()} missing")
    out.check(f"(b) {BLOCKED_METRIC} back to 0 once Redis accepts writes", back_to_zero)
    out.check("(b) the same worker process did it (never exited)", wb.alive() and wb.pid == pid_b, wb.pid)
    out.check("no safety-net log lines (engine loop errors, tracebacks)", not (log_problems(wa) + log_problems(wb)),
              log_problems(wa) + log_problems(wb))
    stop_all([wb], out)
    cb = worker_counts(wb) or {}
    out.check("(b) answered exactly once (no duplicate, nothing returned)",
              cb.get("answered") == len(rows_b) and cb.get("duplicates_skipped") == 0, cb)
    accepted = re.findall(r"Redis accepts writes again after ([\d.]+) s", wb.log())
    out.notes.update(
        {
            "injected": f"redis-server --maxmemory {FULL_MAXMEMORY} (noeviction) filled with "
            f"{FILL_VALUE_BYTES // 1024} KiB SET keys until OutOfMemoryError, then maxmemory held "
            f"{FULL_MARGIN_BYTES // 2**20} MiB below the memory in use; (a) before a worker starts, "
            f"(b) while a worker (slow device {delay} s/batch, buffer 6) scores; held full {hold_s:.0f} s",
            "a_fill": filled_a,
            "a_refusal_log_line": line,
            "a_answered_while_full": answered_while_full,
            "a_answered_all_after_free_s": round(answered_a_s, 1),
            "b_fill": filled_b,
            "b_metric_seen_after_fill_s": None if seen is None else round(seen, 1),
            "b_write_blocked_seconds_max": round(blocked_max, 2),
            "b_blocked_per_worker_log_s": [float(x) for x in accepted],
            "b_answered_while_full": answered_while_full_b,
            "b_held_unacked_while_full": held_b,
            "b_queued_while_full": queued_b,
            "b_answered_all_after_free_s": round(answered_b_s, 1),
            "a_worker": ca,
            "b_worker": cb,
        }
    )
    out.settle(tr)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)
    client.close()
    tr.close()


def _lone_surrogate_message(rid: str, rows: list[dict[str, Any]] | None = None) -> str:
    """A raw queue item whose header id (and body row ids) may hold lone surrogates, written as
    JSON escapes ("\\ud800"): what a producer that never checks ids could LPUSH. `rows`: a chunk."""
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    if rows is None:
        env = raw_message([good_row("placeholder", 0)])
        body: list[Any] = [[{**good_row("x", 0), "id": rid}], {}, embed]
    else:
        env = raw_message([good_row("placeholder", 0)], chunk=True)
        body = [[rows], {"chunk": True}, embed]
        rid = env["headers"]["id"]
    env["headers"]["id"] = env["headers"]["root_id"] = env["properties"]["correlation_id"] = rid
    set_body(env, json.dumps(body, ensure_ascii=True).encode("ascii"))
    return json.dumps(env, ensure_ascii=True)


def scenario_bad_id(s: Suite, out: Outcome) -> None:
    """Request ids Redis cannot take as keys, among ~300 innocent requests on 2 workers: a raw
    message whose header id and body id hold a lone surrogate ("\\ud800", a JSON escape in a raw
    LPUSH), and a chunk with one such row. The bad item and the bad row go to the dead-letter list
    with their reason; every innocent request is answered; no worker stops storing: all done well
    within the visibility timeout, with nothing redelivered."""
    r = s.redis()
    rc = r.client()
    vis = max(120.0, s.visibility_for(2048))
    workers = start_ready(s, 2, r.url(), visibility_timeout_s=vis, max_buffered=8)
    tr = Tracker(r.url())
    n = s.n(300, minimum=20)
    innocents = good_rows("innocent", n)
    mates = good_rows("chunkmate", 4, start=n)
    bad_single = "bad-\ud800"
    bad_row = "badrow-\ud800"
    single = _lone_surrogate_message(bad_single)
    chunk = _lone_surrogate_message("", rows=[*mates[:2], {**good_row("x", 1), "id": bad_row}, *mates[2:]])
    chunk_id = json.loads(chunk)["headers"]["id"]
    chunk_body = base64.b64decode(json.loads(chunk)["body"]).decode("ascii")
    out.check("the raw items carry the surrogate as a JSON escape (header id, body ids)",
              '"bad-\\ud800"' in single and "\\ud800" in base64.b64decode(json.loads(single)["body"]).decode("ascii")
              and '"badrow-\\ud800"' in chunk_body)
    tr.add([x["id"] for x in innocents + mates])
    first = [build_message([x], QUEUE).payload for x in innocents[: n // 4]]
    rest = [build_message([x], QUEUE).payload for x in innocents[n // 4 :]]
    t0 = time.monotonic()
    rc.lpush(QUEUE, *first, single, chunk, *rest)  # BRPOP takes them in this order
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    took = time.monotonic() - t0
    out.check("all answered and the queue drained", done)
    out.check("all done well within the visibility timeout (under half of it)", took < vis / 2,
              f"{took:.1f} s of {vis:g} s")
    out.check("both workers stayed up", all(w.alive() for w in workers))
    summary = rc.get(keys.result_key(chunk_id))
    out.check("the chunk's summary is stored under its id", summary is not None and classify(summary) == "ok",
              summary[:200] if summary else None)
    dead = [json.loads(x) for x in rc.lrange(keys.dead_letter(MODEL), 0, -1)]
    item_entry = next((d for d in dead if d.get("item") and "ud800" in d["item"]), None)
    row_entry = next((d for d in dead if (d.get("request") or {}).get("id") == bad_row), None)
    out.check("the bad message is on the dead-letter list with its reason",
              item_entry is not None and "not valid Unicode" in str(item_entry.get("reason")),
              item_entry and item_entry.get("reason"))
    out.check("the chunk's bad row is on the dead-letter list with its reason",
              row_entry is not None and "not valid Unicode" in str(row_entry.get("reason"))
              and row_entry.get("message_id") == chunk_id,
              row_entry and row_entry.get("reason"))
    out.check("nothing else on the dead-letter list", len(dead) == 2, len(dead))
    problems = [p for w in workers for p in log_problems(w)]
    out.check("no safety-net log lines (engine loop errors, tracebacks)", not problems, problems)
    stop_all(workers, out)
    per_worker = [worker_counts(w) or {} for w in workers]
    notes = worker_notes(workers)
    out.check("every worker kept storing (each answered some) and nothing was redelivered",
              all(c.get("answered", 0) > 0 for c in per_worker) and notes.get("duplicates_skipped") == 0
              and notes.get("answered") == n + len(mates),
              [{k: c.get(k) for k in ("answered", "duplicates_skipped", "returned")} for c in per_worker])
    out.notes.update(
        {
            "injected": "a raw message with header id and body id 'bad-\\ud800' and a chunk with one row "
            f"'badrow-\\ud800' ({len(mates)} innocent chunk mates), pushed after {n // 4} innocent requests",
            "visibility_timeout_s": vis,
            "seconds_to_answer_all": round(took, 1),
            "dead_letter_reasons": [d.get("reason") for d in dead],
            "per_worker_answered": [c.get("answered") for c in per_worker],
            **notes,
        }
    )
    out.settle(tr)
    out.check("every innocent answer ok", out.answered_ok == out.requests, out.answered_ok)
    tr.close()


class TlsRedisServer(RedisServer):
    """A redis-server that listens on a TLS port only (`--port 0 --tls-port P`), with a CA and a
    server certificate for 127.0.0.1 made by openssl in its directory; its URL is
    rediss://127.0.0.1:P/0?ssl_cert_reqs=required&ssl_ca_certs=<ca.pem>."""

    def start(self, timeout_s: float = 20.0) -> RedisServer:
        self.ca = self.workdir / "ca.pem"
        if not self.ca.exists():
            make_certificates(self.workdir)
        return super().start(timeout_s)

    def url(self, db: int = 0) -> str:
        return f"rediss://127.0.0.1:{self.port}/{db}?ssl_cert_reqs=required&ssl_ca_certs={self.workdir / 'ca.pem'}"

    def client(self, db: int = 0, **kw: Any) -> Any:
        return redis_lib.Redis(host="127.0.0.1", port=self.port, db=db, ssl=True, ssl_cert_reqs="required",
                               ssl_ca_certs=str(self.workdir / "ca.pem"), **kw)

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("--port") + 1] = "0"
        d = self.workdir
        return [*cmd, "--tls-port", str(self.port), "--tls-cert-file", str(d / "server.pem"), "--tls-key-file",
                str(d / "server.key"), "--tls-ca-cert-file", str(d / "ca.pem"), "--tls-auth-clients", "no"]


def make_certificates(d: Path) -> None:
    """A self-signed CA (ca.pem) and a server certificate for IP 127.0.0.1 signed by it (server.pem,
    server.key), with openssl; RuntimeError naming what failed."""
    import subprocess

    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    steps = [
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
         "-days", "2", "-subj", "/CN=vela2-bench-ca"],
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
         "-subj", "/CN=127.0.0.1"],
        ["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.pem", "-days", "2", "-extfile", "san.cnf"],
    ]
    for cmd in steps:
        p = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed: {p.stderr.strip()[-300:]}")


def tls_refusal(r: RedisServer) -> str | None:
    """Why a TLS redis-server did not start, when its log says the build has no TLS (else None)."""
    text = (r.workdir / "redis.log").read_text(errors="replace") if (r.workdir / "redis.log").exists() else ""
    low = text.lower()
    if "tls" in low and ("bad directive" in low or "not supported" in low or "not compiled" in low):
        return f"this redis-server build has no TLS: {text.strip().splitlines()[-1][:200]}"
    return None


def _queue_items(prefix: str) -> tuple[list[tuple[str, bytes]], dict[str, str], dict[str, str], list[str]]:
    """The raw items of scenario_queue_items: (name, raw item) pairs, the ids that must get an
    error (id -> words its message must contain), the items that must be dead-lettered (name ->
    words of the reason), and the victim ids that only a header names."""
    p = prefix
    base = good_row("x", 0)
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    errors: dict[str, str] = {}
    dead: dict[str, str] = {}
    items: list[tuple[str, bytes]] = []

    def add(name: str, item: dict[str, Any] | str | bytes) -> None:
        raw = item if isinstance(item, bytes) else (item if isinstance(item, str) else json.dumps(item)).encode()
        items.append((name, raw))

    env = raw_message([{**base, "id": f"{p}-hlist"}])
    env["headers"] = [[k, v] for k, v in env["headers"].items()]
    add("headers_list", env)
    errors[f"{p}-hlist"] = "envelope headers must be an object; got list"  # its body still names its request

    env = raw_message([{**base, "id": f"{p}-enc"}])
    env["properties"]["body_encoding"] = "rot13"
    add("unknown_body_encoding", env)
    errors[f"{p}-enc"] = "body_encoding 'rot13' is not base64"

    head = json.dumps({"headers": {"id": f"{p}-deep", "task": keys.TASK_NAME}, "properties": {"delivery_tag": "t"},
                       "body": ""})
    deep = head[:-1] + ', "x": ' + "[" * DEEP + "]" * DEEP + "}"
    add("envelope_nested_100000", deep)
    dead["envelope_nested_100000"] = f"nested deeper than {MAX_JSON_DEPTH} levels"

    add("not_json", b"\x00\xff\xfe not JSON at all \x80\x81")
    dead["not_json"] = "not valid JSON"

    proto1 = {"task": keys.TASK_NAME, "id": f"{p}-proto1", "args": [{**base, "id": f"{p}-proto1"}], "kwargs": {}}
    add("protocol_1", {"body": base64.b64encode(json.dumps(proto1).encode()).decode(), "content-encoding": "utf-8",
                       "content-type": "application/json",
                       "properties": {"body_encoding": "base64", "delivery_tag": f"{p}-tag-proto1",
                                      "delivery_info": {"exchange": "", "routing_key": QUEUE}, "priority": 0}})
    errors[f"{p}-proto1"] = "protocol 1"

    env = raw_message([{**base, "id": f"{p}-nohead"}])
    del env["headers"]
    add("headerless", env)
    errors[f"{p}-nohead"] = "envelope headers must be an object; got NoneType"

    env = raw_message([{**base, "id": f"{p}-b64"}])
    env["body"] = "@@@ this is not base64 @@@"
    add("body_not_base64", env)
    errors[f"{p}-b64"] = "not valid base64"

    env = raw_message([{**base, "id": f"{p}-mm-body"}])
    env["headers"]["id"] = f"{p}-mm-head"
    add("header_id_differs_from_body_id", env)
    errors[f"{p}-mm-head"] = errors[f"{p}-mm-body"] = "differs from its message id"

    env = raw_message([{**base, "id": f"{p}-cleanup"}])
    env["headers"]["task"] = "celery.backend_cleanup"
    set_body(env, json.dumps([[], {}, embed]).encode())
    add("celery_backend_cleanup", env)
    errors[f"{p}-cleanup"] = "'celery.backend_cleanup' is not served here"

    victims = [f"{p}-victim-{i}" for i in range(4)]
    env = raw_message([{**base, "id": f"{p}-chunk-a"}, good_row(f"{p}-chunk-b", 1)], chunk=True)
    env["headers"]["vela2_ids"] = victims[:2]
    add("chunk_naming_other_ids", env)  # a good chunk: its own rows answered ok, the header ignored

    env = raw_message([{**base, "id": f"{p}-badchunk-a"}], chunk=True)
    env["headers"]["vela2_ids"] = victims[2:]
    set_body(env, json.dumps([[[{**base, "id": f"{p}-badchunk-a"}]], {"chunk": True, "bogus": 1}, embed]).encode())
    add("bad_chunk_naming_other_ids", env)
    errors[env["headers"]["id"]] = errors[f"{p}-badchunk-a"] = "unknown keyword arguments ['bogus']"

    env = raw_message([good_row(f"{p}-forged", 2)])
    env["headers"]["vela2_refused"] = "forged by a producer"
    env["headers"]["vela2_refused_ids"] = victims
    add("forged_refused_header", env)  # only the worker's channel may set it: answered as a normal request
    return items, errors, dead, victims


def _error_message(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    meta = json.loads(raw)
    err = (meta.get("vela2") or {}).get("error")
    if err:
        return f"{err.get('type')}: {err.get('message')}"
    result = meta.get("result")
    return str(result) if isinstance(result, dict) else None


def _run_queue_items(s: Suite, out: Outcome, r: RedisServer, label: str) -> None:
    """Push the raw items of _queue_items on `r`, with good traffic, to one worker; check them."""
    rc = r.client(socket_timeout=10)
    w = s.worker(r.url()).wait_ready()
    pid = w.pid
    tr = Tracker(r.url())
    prefix = f"qi{label}"
    items, errors, dead_want, victims = _queue_items(prefix)
    good = good_rows(f"{prefix}-good", s.n(40, minimum=10))
    oks = [x["id"] for x in good] + [f"{prefix}-chunk-a", f"{prefix}-chunk-b", f"{prefix}-forged"]
    tr.add(oks + list(errors))
    payloads = [build_message([x], QUEUE).payload.encode() for x in good]
    mixed = payloads[: len(payloads) // 2] + [raw for _, raw in items] + payloads[len(payloads) // 2 :]
    rc.lpush(QUEUE, *mixed)
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    tag = f"[{label}] "
    out.check(tag + "all answered, queue and unacked empty (everything acked)", done,
              {"missing": tr.missing()[:10], "queue": rc.llen(QUEUE), "unacked": unacked(rc)})
    out.check(tag + "the worker stayed up (same pid, never exited)", w.alive() and w.pid == pid, w.pid)
    raws = {i: rc.get(keys.result_key(i)) for i in oks + list(errors) + victims}
    wrong = {}
    for rid, words in errors.items():
        msg = _error_message(raws[rid])
        if classify(raws[rid]) != "error" or words not in str(msg):
            wrong[rid] = msg
    out.check(tag + "every id found in an item got an error naming the problem", not wrong, wrong)
    out.check(tag + "the good requests and the good chunk's rows answered ok",
              all(classify(raws[i]) == "ok" for i in oks),
              {i: classify(raws[i]) for i in oks if classify(raws[i]) != "ok"})
    touched = {v: _error_message(raws[v]) or "stored" for v in victims if raws[v] is not None}
    out.check(tag + "ids only a header named got nothing stored", not touched, touched)
    dead = [json.loads(x) for x in rc.lrange(keys.dead_letter(MODEL), 0, -1)]
    missing_dead = {name: words for name, words in dead_want.items()
                    if not any(words in str(d.get("reason")) and d.get("item") is not None for d in dead)}
    out.check(tag + "every item with no usable id is on the dead-letter list with its reason", not missing_dead,
              {"missing": missing_dead, "reasons": [str(d.get("reason"))[:100] for d in dead]})
    out.check(tag + "nothing else on the dead-letter list", len(dead) == len(dead_want), len(dead))
    problems = log_problems(w)
    out.check(tag + "no safety-net log lines (engine loop errors, tracebacks)", not problems, problems)
    # the ids only a header named are free: real requests under them get their real answers
    client = Client(r.url(), model=MODEL)
    tr.add(client.submit_many([good_row(v, i) for i, v in enumerate(victims)]))
    client.close()
    got = tr.wait(120, until=lambda: drained(rc))
    out.check(tag + "real requests under those ids afterwards get their real ok answers",
              got and all(classify(tr.first.get(v)) == "ok" for v in victims),
              {v: classify(tr.first.get(v)) for v in victims})
    out.check(tag + "the worker is still the same process at the end", w.alive() and w.pid == pid)
    stop_all([w], out)
    body_ids_unanswered = [f"{prefix}-hlist", f"{prefix}-nohead"]
    out.notes[label] = {
        "redis_url": r.url().split("?")[0],
        "items": [name for name, _ in items],
        "item_bytes": {name: len(raw) for name, raw in items},
        "error_answers": {rid: (_error_message(raws[rid]) or "")[:160] for rid in errors},
        "dead_letter_reasons": [str(d.get("reason"))[:160] for d in dead],
        "body_ids_of_dead_lettered_items_answered": {
            i: rc.get(keys.result_key(i)) is not None for i in body_ids_unanswered
        },
        **worker_notes([w]),
    }
    f = tr.final()
    for k in ("requests", "answered_ok", "answered_error", "expired", "lost", "duplicate_answers_changed"):
        setattr(out, k, getattr(out, k) + f[k])
    if f["lost_ids"]:
        out.notes.setdefault("lost_ids", []).extend(f["lost_ids"])
    tr.close()


def scenario_queue_items(s: Suite, out: Outcome) -> None:
    """Raw queue items that are no message of ours, LPUSHed among good traffic: envelope headers as
    a list, an unknown body_encoding, an envelope nested 100,000 deep, non-JSON bytes, a Celery
    protocol-1 message, a headerless envelope, a body that is not base64, a header id that differs
    from the body id, a message naming celery.backend_cleanup, chunks whose `vela2_ids` header
    names other requests' ids, a forged `vela2_refused` header. The worker's channel takes each
    apart before kombu and Celery see it: the worker stays up, every id found in an item gets an
    error naming the problem, items with no usable id go to the dead-letter list with a reason,
    ids only a header names get nothing (real requests under them later get real answers), and
    everything is acked. Run over redis:// and again over rediss:// (TLS) when this redis-server
    build has TLS."""
    _run_queue_items(s, out, s.redis(), "plain")
    if shutil.which("openssl") is None:
        out.skip("the same items over rediss:// (TLS)", "no openssl on PATH to make the certificates")
        return
    try:
        tls = s.redis(kind=TlsRedisServer)
    except RuntimeError as e:
        why = tls_refusal(s._procs[-1]) if isinstance(s._procs[-1], RedisServer) else None
        if why is None:
            raise  # TLS is built in but the server did not start: a failure, not a skip
        out.skip("the same items over rediss:// (TLS)", f"{why} ({str(e)[:200]})")
        return
    out.notes["tls"] = "redis-server --port 0 --tls-port P with a self-signed CA (openssl); the worker's URL is " \
        "rediss://127.0.0.1:P/0?ssl_cert_reqs=required&ssl_ca_certs=<ca.pem>"
    _run_queue_items(s, out, tls, "tls")


def scenario_deep_body(s: Suite, out: Outcome) -> None:
    """A message whose base64 body is JSON nested 100,000 deep (and one whose request is nested
    100 deep), submitted together with ~20 normal requests: both answered invalid_request ("nested
    deeper than 64 levels") without the worker choking on them, and the normal ones answered
    promptly, well before the visibility timeout."""
    r = s.redis()
    rc = r.client()
    vis = max(60.0, s.visibility_for(2048))
    w = s.worker(r.url(), visibility_timeout_s=vis, max_buffered=8).wait_ready()
    tr = Tracker(r.url())
    base = good_row("x", 0)
    deep1 = set_body(raw_message([{**base, "id": "deep-body"}]), ("[" * DEEP + "]" * DEEP).encode())
    nested: Any = "leaf"
    for _ in range(100):
        nested = [nested]
    deep2 = raw_message([{**base, "id": "deep-request", "text": nested}])
    normal = good_rows("normal", s.n(20, minimum=20))
    tr.add(["deep-body", "deep-request"] + [x["id"] for x in normal])
    payloads = [build_message([x], QUEUE).payload for x in normal]
    t0 = time.monotonic()
    rc.lpush(QUEUE, json.dumps(deep1), *payloads[:10], json.dumps(deep2), *payloads[10:])
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    took = time.monotonic() - t0
    out.check("all answered and the queue drained", done)
    out.check("the worker stayed up", w.alive())
    normal_s = max((tr.first_at.get(x["id"], float("inf")) for x in normal), default=0.0) - (t0 - tr.t0)
    out.check("the normal requests answered well before the visibility timeout (under a quarter of it)",
              normal_s < vis / 4, f"{normal_s:.1f} s of {vis:g} s")
    problems = log_problems(w)
    out.check("no safety-net log lines (engine loop errors, tracebacks)", not problems, problems)
    stop_all([w], out)
    raws = out.settle(tr)
    msgs = {i: _error_message(raws[i]) for i in ("deep-body", "deep-request")}
    out.check("both deep messages answered invalid_request: nested deeper than 64 levels",
              all(error_type(raws[i]) == "invalid_request" and "nested deeper than 64 levels" in str(m)
                  for i, m in msgs.items()), msgs)
    out.check("every normal request answered ok", all(classify(raws[x["id"]]) == "ok" for x in normal))
    c = worker_counts(w) or {}
    out.check("nothing redelivered or returned", c.get("duplicates_skipped") == 0 and c.get("returned") == 0, c)
    out.notes.update(
        {
            "injected": f"a body of {DEEP:,} nested lists ({len(json.dumps(deep1)) / 2**10:.0f} KiB envelope) and a "
            f"request nested 100 deep, among {len(normal)} normal requests",
            "visibility_timeout_s": vis,
            "normal_answered_within_s": round(normal_s, 2),
            "deep_answered_after_s": {i: round(tr.first_at.get(i, 0) - (t0 - tr.t0), 2)
                                      for i in ("deep-body", "deep-request")},
            "seconds_to_answer_all": round(took, 2),
            "error_messages": msgs,
            **worker_notes([w]),
        }
    )


class PasswordRedisServer(RedisServer):
    """A redis-server with `--requirepass PASSWORD` (its url() carries the password)."""

    PASSWORD = "right-password"

    def url(self, db: int = 0) -> str:
        return f"redis://:{self.PASSWORD}@127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0, **kw: Any) -> Any:
        return redis_lib.Redis(host="127.0.0.1", port=self.port, db=db, password=self.PASSWORD, **kw)


def _run_cli(argv: list[str], log_dir: Path, name: str, timeout_s: float) -> dict[str, Any]:
    """Run a command (child environment of the harness), bounded by `timeout_s`; its exit code,
    seconds, stderr lines and the `vela2 worker` lines among them."""
    import subprocess

    from stack.harness import ROOT, child_env, die_with_parent

    err_path, out_path = log_dir / f"{name}.stderr", log_dir / f"{name}.stdout"
    t0 = time.monotonic()
    with open(err_path, "wb") as err, open(out_path, "wb") as outf:
        p = subprocess.Popen(argv, stdout=outf, stderr=err, cwd=ROOT, env=child_env({"OMP_NUM_THREADS": "1"}),
                             preexec_fn=die_with_parent)
        try:
            code: int | None = p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            code = None
    seconds = time.monotonic() - t0
    lines = err_path.read_text(errors="replace").strip().splitlines()
    return {
        "exit": code,
        "seconds": round(seconds, 2),
        "stderr_lines": len(lines),
        "reason_lines": [x.strip()[:400] for x in lines if "vela2 worker:" in x],
        "traceback": any("Traceback" in x for x in lines),
    }


def scenario_start_failures(s: Suite, out: Outcome) -> None:
    """A worker that cannot start exits 2 at once with one line on stderr naming why (never 0, never
    a traceback), so a supervisor sees it: `vela2 worker` with a missing checkpoint, a wrong Redis
    password (redis-server --requirepass), a visibility timeout the worker refuses (0.001 s); and
    `celery -A worker.app worker` with VELA2_VISIBILITY_TIMEOUT_S=0.001."""
    r = s.redis()
    locked = s.redis(kind=PasswordRedisServer, extra_args=("--requirepass", PasswordRedisServer.PASSWORD))
    exe = Path(sys.executable).with_name("vela2")
    cli = [str(exe)] if exe.exists() else [sys.executable, "-m", "vela2.cli"]
    cases = {
        "missing_checkpoint": (["--checkpoint", str(s.workdir / "no-such-checkpoint"), "--redis", r.url()],
                               "config.json does not exist", 15.0),
        "wrong_password": (["--checkpoint", str(s.checkpoint), "--redis",
                            f"redis://:wrong-password@127.0.0.1:{locked.port}/0"], "refuses the credentials", 15.0),
        "visibility_0.001": (["--checkpoint", str(s.checkpoint), "--redis", r.url(), "--device", s.device,
                              "--visibility-timeout-s", "0.001"], "visibility timeout 0.001 s is too short", 60.0),
    }
    results: dict[str, Any] = {}
    for name, (args, words, limit) in cases.items():
        got = _run_cli([*cli, "worker", *args], s.workdir, name, limit + 60)
        results[name] = got
        reason = got["reason_lines"]
        out.check(f"vela2 worker, {name}: exit 2 within {limit:g} s", got["exit"] == 2 and got["seconds"] < limit,
                  {"exit": got["exit"], "seconds": got["seconds"]})
        out.check(f"vela2 worker, {name}: one line on stderr naming why, no traceback",
                  len(reason) == 1 and words in reason[0] and not got["traceback"],
                  {"reason": reason, "stderr_lines": got["stderr_lines"]})
    w = s.worker(r.url(), visibility_timeout_s=0.001)
    t0 = time.monotonic()
    code = w.wait_exit(120)
    took = time.monotonic() - t0
    line = next((x.strip() for x in w.log().splitlines() if "cannot start" in x), None)
    out.check("celery -A worker.app worker, VELA2_VISIBILITY_TIMEOUT_S=0.001: exit 2 with the reason logged",
              code == 2 and line is not None and "visibility timeout 0.001 s is too short" in line,
              {"exit": code, "line": line})
    results["celery_visibility_0.001"] = {"exit": code, "seconds": round(took, 2), "reason_line": line}
    out.notes.update({"command": " ".join(Path(c).name for c in cli) + " worker ...", "results": results})


# --- RabbitMQ as broker (--broker amqp://...) ---------------------------------------------------------
# The same faults against workers that take from quorum queues on RabbitMQ (a fresh vhost per
# scenario) and store results in a fresh redis-server. Nothing is held in Redis's `unacked` hash
# here: what a worker holds is RabbitMQ's unacked deliveries, returned when its connection closes.


def amqp_drained(v: RabbitVhost) -> bool:
    """Nothing ready in either queue (what a live worker still holds is not counted: RabbitMQ tells
    that only through rabbitmqctl, seconds per call; the trackers wait for every answer anyway)."""
    try:
        return v.ready(QUEUE) + v.ready(keys.backfill_queue(MODEL)) == 0
    except Exception:  # the broker dropped this connection: not drained yet
        return False


def amqp_sigkill(s: Suite, out: Outcome) -> None:
    """SIGKILL a worker on a slow device holding a batch and a buffer; a second worker finishes. No
    visibility timeout: RabbitMQ returns the killed worker's deliveries when its connection drops."""
    r, v = s.redis(), s.vhost()
    delay = 0.3
    settings = {"max_batch_tokens": 128, "max_buffered": 6}
    w1 = s.worker(r.url(), faults=Faults(delay_s=delay), **settings).wait_ready()
    client = Client(r.url(), model=MODEL, broker_url=v.url)
    tr = Tracker(r.url())
    n = s.n(800)
    tr.add(client.submit_many(good_rows("kill", n)))
    wait_until(lambda: tr.poll() < n - 4, 120, "worker 1 to answer a few")
    answered_before = tr.answered()
    time.sleep(delay / 2)  # inside the next batch's delay: mid-batch
    t_kill = time.monotonic()
    w1.kill()
    # one request per message, no worker left: every unanswered request must be ready again
    ready_after_kill = wait_until(lambda: v.ready(QUEUE) == tr.poll(), 30, "the killed worker's messages back")
    w2 = s.worker(r.url(), **settings).wait_ready()
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: amqp_drained(v))
    out.notes.update({"injected": f"SIGKILL worker 1 (slow device {delay} s/batch, buffer 6) mid-batch",
                      "answered_before_kill": answered_before, "held_back_in_queue_s": round(ready_after_kill, 2),
                      "recovered_after_kill_s": round(time.monotonic() - t_kill, 1), "broker": "amqp"})
    out.check("all answered and the queues drained", done)
    stop_all([w2], out)
    out.notes.update(worker_notes([w1, w2]))
    out.settle(tr)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)
    client.close()
    tr.close()


def amqp_sigterm(s: Suite, out: Outcome) -> None:
    """Warm shutdown during a batch with a full buffer and a 1 s shutdown timeout: what does not fit
    goes back to its queue (basic_reject, requeue); a second worker finishes."""
    r, v = s.redis(), s.vhost()
    client = Client(r.url(), model=MODEL, broker_url=v.url)
    tr = Tracker(r.url())
    n = s.n(400, minimum=40)
    tr.add(client.submit_many(good_rows("term", n)))
    w1 = s.worker(r.url(), faults=Faults(delay_s=0.5), max_batch_tokens=128, max_buffered=12,
                  shutdown_timeout_s=1).wait_ready()
    wait_until(lambda: 0 < n - tr.poll(), 120, "worker 1 mid-run")
    rc1 = w1.terminate()
    s1 = worker_counts(w1) or {}
    missing = tr.poll()
    back = v.ready(QUEUE)
    out.check("SIGTERM during a batch: exit 0", rc1 == 0, rc1)
    out.check("SIGTERM during a batch: what did not fit went back to the queue", s1.get("returned", 0) > 0, s1)
    out.check("nothing in limbo: every unanswered request is ready in the queue again", back == missing,
              {"ready": back, "unanswered": missing})
    w2 = s.worker(r.url()).wait_ready()
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: amqp_drained(v))
    out.check("all answered and the queues drained", done)
    stop_all([w2], out)
    out.notes.update({"injected": "SIGTERM mid-batch (shutdown timeout 1 s)", "broker": "amqp",
                      **worker_notes([w1, w2])})
    out.settle(tr)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)
    client.close()
    tr.close()


def amqp_broker_drop(s: Suite, out: Outcome) -> None:
    """RabbitMQ closes every connection of the scenario's vhost (rabbitmqctl close_all_connections:
    what clients see when the broker restarts, without stopping a server other vhosts use) while a
    worker holds a batch and a buffer: the worker reconnects, the deliveries it held come back and
    are answered (or skipped, when their answer was stored before the drop); a producer that keeps
    submitting across the drop reconnects too."""
    r, v = s.redis(), s.vhost()
    client = Client(r.url(), model=MODEL, broker_url=v.url)
    tr = Tracker(r.url())
    n = s.n(400, minimum=40)
    tr.add(client.submit_many(good_rows("drop", n)))
    w = s.worker(r.url(), faults=Faults(delay_s=0.2), max_batch_tokens=128, max_buffered=12).wait_ready()
    wait_until(lambda: tr.poll() < n - 4, 120, "the worker answering")
    v.drop_connections("vela2 reliability: broker drop")
    more = good_rows("after", s.n(40, minimum=8))
    tr.add(client.submit_many(more))  # the publisher's connection was dropped too: it reconnects
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: amqp_drained(v))
    out.check("all answered (those sent before and after the drop) and the queues drained", done)
    out.check("the worker survived the drop", w.alive())
    stop_all([w], out)
    out.notes.update({"injected": "close_all_connections on the vhost mid-run", "broker": "amqp",
                      **worker_notes([w])})
    out.settle(tr)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)
    client.close()
    tr.close()


def amqp_duplicate(s: Suite, out: Outcome) -> None:
    """Every message published twice (again once about half were answered), to two workers: the
    duplicates are skipped or re-scored, and the first stored answer never changes."""
    from producer.brokers import AmqpPublisher

    r, v = s.redis(), s.vhost()
    workers = start_ready(s, 2, r.url(), max_buffered=16)
    tr = Tracker(r.url())
    rows = good_rows("dup", s.n(600))
    messages = [build_message([x], QUEUE) for x in rows]
    tr.add([x["id"] for x in rows])
    pub = AmqpPublisher(v.url)
    pub.publish(messages)
    wait_until(lambda: tr.poll() <= len(rows) // 2, 120, "half answered")
    pub.publish(messages)
    pub.close()
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: amqp_drained(v))
    out.check("all answered and the queues drained", done)
    stop_all(workers, out)
    notes = worker_notes(workers)
    out.notes.update({"injected": f"{len(rows)} messages published twice; 2 workers", "broker": "amqp",
                      "deliveries": 2 * len(rows), **notes})
    out.settle(tr)
    redundant = notes.get("duplicates_skipped", 0) + notes.get("answered", 0) - len(rows)
    out.check("every duplicate delivery was skipped or re-scored harmlessly (counts add up)",
              redundant == len(rows), {"skipped + re-scored": redundant})
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)


def amqp_poison(s: Suite, out: Outcome) -> None:
    """A request that kills its worker every time; a supervisor restarts the worker. RabbitMQ
    redelivers at once; the attempt counters in the result store end it as `poison` after 3 crashes."""
    r, v = s.redis(), s.vhost()
    rc = r.client()
    settings = {"max_buffered": 2, "max_batch_tokens": 768, "max_wait_ms": 50}
    faults = Faults(crash_prefix="poison-")
    tr = Tracker(r.url())
    client = Client(r.url(), model=MODEL, broker_url=v.url)
    rows = good_rows("good", s.n(200))
    rows.insert(len(rows) // 3, good_row("poison-1", 1))
    tr.add(client.submit_many(rows))
    workers = [s.worker(r.url(), faults=faults, **settings)]
    exits: list[int] = []
    t0 = time.monotonic()
    while not (tr.poll() == 0 and amqp_drained(v)):
        if time.monotonic() - t0 > SETTLE_TIMEOUT_S + 60:
            break
        if not workers[-1].alive():
            exits.append(workers[-1].wait_exit(5))
            if len(exits) > 6:
                break  # an endless crash loop: stop here, the checks below fail
            workers.append(s.worker(r.url(), faults=faults, **settings))
        time.sleep(POLL_S)
    stop_all([w for w in workers if w.alive()], out)
    raws = out.settle(tr)
    dead = [json.loads(x) for x in rc.lrange(keys.dead_letter(MODEL), 0, -1)]
    out.check("the worker crashed exactly max_attempts (3) times, then never again", exits == [137] * 3, exits)
    out.check("the poison request got a `poison` error answer", error_type(raws.get("poison-1")) == "poison")
    out.check("it is in the dead-letter list", [d["id"] for d in dead] == ["poison-1"], [d["id"] for d in dead])
    out.check("every other request answered ok", out.answered_ok == out.requests - 1, out.answered_ok)
    out.check("no attempt counter left behind", not rc.keys(keys.attempts_key("*")))
    out.notes.update({"injected": "one request whose batch calls os._exit(137)", "broker": "amqp",
                      "worker_exits": exits, "seconds_to_dead_letter": round(time.monotonic() - t0, 1),
                      **worker_notes(workers)})


def amqp_publish_raw(url: str, items: list[tuple[bytes, dict[str, Any] | None, str | None]]) -> None:
    """Publish (body, headers, content type) to the online quorum queue exactly as given (plain kombu,
    publisher confirms): deliveries a producer of ours would never send."""
    from kombu import Connection
    from kombu import Queue as KombuQueue

    queue = KombuQueue(QUEUE, routing_key=QUEUE, durable=True, queue_arguments=keys.AMQP_QUEUE_ARGUMENTS)
    with Connection(url, connect_timeout=5, transport_options={"confirm_publish": True}) as conn:
        producer = conn.Producer()
        for body, headers, content_type in items:
            producer.publish(body, exchange="", routing_key=QUEUE, headers=headers, content_type=content_type,
                             content_encoding="binary", declare=[queue], delivery_mode=2)


def as_delivery(env: dict[str, Any]) -> tuple[bytes, dict[str, Any] | None, str | None]:
    """A built (maybe tampered) envelope as what RabbitMQ carries: raw body, headers, content type."""
    return base64.b64decode(env["body"]), env["headers"], env["content-type"]


def amqp_malformed(s: Suite, out: Outcome) -> None:
    """scenario_malformed on RabbitMQ: undecodable bodies, wrong task names (a Celery built-in too),
    schema-invalid payloads, bad headers, a wrong content type, protocol 1, a body kombu cannot
    decompress and deliveries that are no Celery message at all, published raw among good traffic.
    The worker's consumer triages every delivery before Celery dispatches it (worker.transport.amqp): every
    bad one that carries an id gets an error answer of the right type, those without go to the
    dead-letter list with their reason, each acked only after that is stored; the good ones are all
    answered ok and the worker keeps running."""
    r, v = s.redis(), s.vhost()
    rc = r.client()
    w = s.worker(r.url()).wait_ready()
    tr = Tracker(r.url())
    rng = random.Random(8)
    k = max(1, s.n(10, minimum=1))
    items: list[tuple[bytes, dict[str, Any] | None, str | None]] = []
    want: dict[str, str] = {}  # id -> expected error type
    base = good_row("x", 0)

    def bad(prefix: str, etype: str, make: Callable[[str], tuple[bytes, dict[str, Any] | None, str | None]]) -> None:
        for i in range(k):
            rid = f"{prefix}-{i}"
            items.append(make(rid))
            want[rid] = etype

    def ours(rid: str, body: bytes | None = None, content_type: str = "application/json", **headers: Any) -> Any:
        env = raw_message([{**base, "id": rid}])
        env["headers"].update(headers)
        return (body if body is not None else as_delivery(env)[0]), env["headers"], content_type

    bad("notjson", "invalid_request", lambda rid: ours(rid, b"{not json"))
    bad("notutf8", "invalid_request", lambda rid: ours(rid, b"\xff\xfe\x00"))
    bad("badargs", "invalid_request", lambda rid: ours(rid, json.dumps([[base], {"bogus": 1}, {}]).encode()))
    bad("wrongtask", "invalid_request", lambda rid: ours(rid, task="vela2.no_such_task"))
    bad("builtin", "invalid_request", lambda rid: ours(rid, task="celery.backend_cleanup"))  # never run
    bad("badexpires", "invalid_request", lambda rid: ours(rid, expires="next tuesday"))
    bad("pickle", "invalid_request", lambda rid: ours(rid, content_type="application/x-python-serialize"))
    bad("gzip", "invalid_request", lambda rid: ours(rid, compression="application/x-gzip"))  # kombu cannot decompress
    bad("proto1", "invalid_request",
        lambda rid: (json.dumps({"task": keys.TASK_NAME, "id": rid, "args": [{**base, "id": rid}]}).encode(), None,
                     "application/json"))
    invalid = [
        ("oneopt", "invalid_request", {**base, "questions": [{"options": ["yes"]}]}),
        ("notext", "invalid_request", {k_: v_ for k_, v_ in base.items() if k_ != "text"}),
        ("inttext", "invalid_request", {**base, "text": 42}),
        ("badtype", "invalid_request", {**base, "task": "regress:x"}),
        (
            "s1model",
            "model_mismatch",
            {"model": "other-model", "input": "hi", "tasks": [{"name": "t", "kind": "choice", "options": ["a", "b"]}]},
        ),
    ]
    for prefix, etype, obj in invalid:
        bad(prefix, etype, lambda rid, obj=obj: as_delivery(raw_message([{**obj, "id": rid}])))
    # a chunk mixing good and bad rows: each row answered under its own id
    chunk_good = []
    for i in range(k):
        g, b = f"chunkgood-{i}", f"chunkbad-{i}"
        items.append(as_delivery(raw_message([good_row(g, i), {**base, "id": b, "questions": [{"options": ["only"]}]}],
                                             chunk=True)))
        want[b] = "invalid_request"
        chunk_good.append(g)
    late = [f"late-{i}" for i in range(k)]
    items += [as_delivery(raw_message([{**base, "id": rid}], expires=_past())) for rid in late]
    # a message of ours forging the refusal headers: answered ok, nothing stored under the forged ids
    forged = [f"forged-{i}" for i in range(k)]
    items += [ours(rid, vela2_refused="forged", vela2_refused_ids=[f"victim-{rid}"]) for rid in forged]
    # no id to answer under: dead-lettered with the reason
    garbage: list[tuple[bytes, dict[str, Any] | None, str | None]] = [
        (b"this is not a message", None, "text/plain"), (json.dumps({"no": "envelope"}).encode(), None, None),
        (b"", None, "application/json"), (json.dumps([1, 2, 3]).encode(), {"task": "vela2.no_such_task"}, None)]
    no_id = raw_message([{**base, "id": "noid"}])
    del no_id["headers"]["id"]
    unanswerable = [garbage[i % len(garbage)] for i in range(2 * k)] + [as_delivery(no_id)] * k
    items += unanswerable
    tr.add(list(want) + late + forged)
    good = good_rows("good", s.n(600))
    tr.add([g["id"] for g in good] + chunk_good)
    mixed = [as_delivery(json.loads(build_message([g], QUEUE).payload)) for g in good] + items
    rng.shuffle(mixed)
    amqp_publish_raw(v.url, mixed)
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: amqp_drained(v))
    out.check("all answered and the queues drained", done)
    out.check("the worker survived the garbage", w.alive())
    stop_all([w], out)
    out.check("every delivery acked (none ready again once the worker's connection closed)",
              amqp_drained(v), {"ready": v.ready(QUEUE)})
    raws = out.settle(tr)
    wrong = {rid: error_type(raws[rid]) for rid, t in want.items() if error_type(raws[rid]) != t}
    out.check("every bad message with an id got an error answer of the expected type", not wrong,
              dict(list(wrong.items())[:10]))
    oks = [g["id"] for g in good] + chunk_good + forged
    out.check("every good request (chunked and forged-header ones too) answered ok",
              all(classify(raws[i]) == "ok" for i in oks))
    out.check("requests past their deadline answered expired", all(classify(raws[i]) == "expired" for i in late))
    victims = [f"victim-{rid}" for rid in forged]
    out.check("nothing stored under the ids a forged refusal header named",
              not any(rc.get(keys.result_key(x)) for x in victims))
    dead = [json.loads(x) for x in rc.lrange(keys.dead_letter(MODEL), 0, -1)]
    examples = {}
    for rid in want:
        kind = rid.rsplit("-", 1)[0]
        if kind not in examples and raws[rid] is not None:
            err = (json.loads(raws[rid]).get("vela2") or {}).get("error") or {}
            examples[kind] = f"{err.get('type')}: {str(err.get('message'))[:200]}"
    out.notes.update({
        "broker": "amqp",
        "error_answers": examples,
        "injected": {"bad_with_id": len(want), "kinds": sorted({rid.rsplit("-", 1)[0] for rid in want}),
                     "past_deadline": len(late), "forged_refusal_headers": len(forged),
                     "unanswerable_items": len(unanswerable)},
        "dead_letter_entries": len(dead),
        "dead_letter_reasons": sorted({str(d.get("reason"))[:120] for d in dead}),
        **worker_notes([w]),
    })
    out.check("every delivery without an id is on the dead-letter list with a reason (and nothing else is)",
              len(dead) == len(unanswerable) and all(d.get("reason") and "item" in d for d in dead),
              f"{len(dead)} entries for {len(unanswerable)} items")
    out.check("the worker never let Celery handle one (no NotRegistered, no decode error of Celery's)",
              "NotRegistered" not in w.log() and "Can't decode message body" not in w.log())


RABBITMQ_DOWN_S = 3.0  # how long broker_restart keeps the RabbitMQ application stopped


def _rabbitmqctl(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=timeout_s)


def other_rabbitmq_clients(vhost: str) -> list[str]:
    """The vhosts of connections on this host's RabbitMQ that are not the scenario's (other users
    of a shared server: the restart would cut them off too)."""
    got = _rabbitmqctl("list_connections", "vhost", "--no-table-headers")
    return [x.strip() for x in got.stdout.splitlines() if x.strip() and x.strip() != vhost]


def restart_rabbitmq(down_s: float) -> dict[str, Any]:
    """Stop the RabbitMQ application of this host's node (every connection closes, nothing is served;
    quorum queues keep their messages on disk), keep it down `down_s`, start it again. The node's
    Erlang VM keeps running, and start_app runs whatever happened (finally), then await_startup, so
    a server other users share is always left running. Returns timings and whether it answers."""
    t0 = time.monotonic()
    stopped = None
    try:
        got = _rabbitmqctl("stop_app")
        if got.returncode != 0:
            raise RuntimeError(f"rabbitmqctl stop_app failed: {got.stderr.strip()[:500]}")
        stopped = time.monotonic()
        time.sleep(down_s)  # the outage itself
    finally:
        t_start = time.monotonic()
        started = _rabbitmqctl("start_app", timeout_s=300)
        _rabbitmqctl("await_startup", "--timeout", "120", timeout_s=180)
    return {"stop_app_s": round((stopped or t_start) - t0, 1), "down_s": round(time.monotonic() - (stopped or t0), 1),
            "start_app_s": round(time.monotonic() - t_start, 1), "start_app_exit": started.returncode,
            "answers_after": RabbitVhost.unavailable() is None}


def amqp_broker_restart(s: Suite, out: Outcome) -> None:
    """The whole RabbitMQ goes away mid-run and comes back (rabbitmqctl stop_app, RABBITMQ_DOWN_S
    down, start_app; not only close_all_connections as in broker_drop): a worker holding a batch
    and a buffer, and a producer submitting at a steady pace, both reconnect; the quorum queues
    keep every message; what the worker held is delivered again and answered (or skipped, when its
    answer was stored before the outage). The node is shared: the scenario waits up to a minute for
    other vhosts' clients to go and does not restart it while any remain (a failed check), and it
    always starts the application again (see restart_rabbitmq)."""
    r, v = s.redis(), s.vhost()
    others: list[str] = []
    deadline = time.monotonic() + 60
    while True:
        others = other_rabbitmq_clients(v.name)
        if not others or time.monotonic() > deadline:
            break
        time.sleep(1)
    out.check("no other clients on the shared RabbitMQ (else it is not restarted)", not others,
              sorted(set(others))[:10])
    if others:
        return
    client = Client(r.url(), model=MODEL, broker_url=v.url)
    tr = Tracker(r.url())
    n = s.n(400, minimum=40)
    tr.add(client.submit_many(good_rows("restart", n)))
    client.close()
    w = s.worker(r.url(), faults=Faults(delay_s=0.2), max_batch_tokens=128, max_buffered=12).wait_ready()
    wait_until(lambda: tr.poll() < n - 4, 120, "the worker answering")
    prod = Producer(r.url(), good_rows("during", s.n(200, minimum=30)), per_s=10, broker_url=v.url)
    prod.start()
    wait_until(lambda: len(prod.submitted) >= 10, 60, "the producer submitting")
    answered_before = tr.answered()
    timing = restart_rabbitmq(RABBITMQ_DOWN_S)
    out.check("RabbitMQ started again and answers", timing["start_app_exit"] == 0 and timing["answers_after"], timing)
    t_up = time.monotonic()
    prod.join(300)
    out.check("the producer submitted every row, retrying across the outage", not prod.is_alive()
              and len(prod.submitted) == len(prod.rows), {"submitted": len(prod.submitted), "rows": len(prod.rows)})
    tr.add(prod.submitted)
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: amqp_drained(v))
    settled_s = time.monotonic() - t_up
    out.check("all answered (those queued before and sent across the outage) and the queues drained", done)
    out.check("the worker survived the outage", w.alive())
    stop_all([w], out)
    queues = v.queues()
    out.check("the queues are still quorum queues, nothing left in them",
              all(queues.get(q, {}).get("type") == "quorum" for q in (QUEUE, keys.backfill_queue(MODEL)))
              and amqp_drained(v), queues)
    out.notes.update({"injected": f"rabbitmqctl stop_app, {RABBITMQ_DOWN_S:g} s down, start_app, mid-run",
                      "broker": "amqp", "restart": timing, "answered_before_outage": answered_before,
                      "all_answered_after_start_app_s": round(settled_s, 1),
                      **prod.notes(), **worker_notes([w])})
    out.settle(tr)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)
    tr.close()


# Run instead of SCENARIOS with --broker amqp://... `malformed` publishes its bad deliveries raw to
# the quorum queue (the worker's consumer triages them, worker.transport.amqp); `broker_restart` stops and
# starts the RabbitMQ application of this host's node (left running whatever happens; not while
# other vhosts have clients). Not here: those about Redis as broker (redis_restart, redis_down,
# redis_full, visibility: RabbitMQ has no visibility timeout) or that LPUSH raw Redis list items
# (queue_items, bad_id, deep_body, oversized), start_failures (amqp's are tests/worker/test_amqp.py)
# and oom (a device fault, the same whatever the broker).
AMQP_SCENARIOS: dict[str, Callable[[Suite, Outcome], None]] = {
    "sigkill": amqp_sigkill,
    "sigterm": amqp_sigterm,
    "broker_drop": amqp_broker_drop,
    "broker_restart": amqp_broker_restart,
    "duplicate": amqp_duplicate,
    "poison": amqp_poison,
    "malformed": amqp_malformed,
}


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
    "redis_full": scenario_redis_full,
    "bad_id": scenario_bad_id,
    "queue_items": scenario_queue_items,
    "deep_body": scenario_deep_body,
    "start_failures": scenario_start_failures,
}


def run_scenario(s: Suite, name: str, run: int = 1) -> Outcome:
    """Run one scenario in its own processes; an exception becomes a failed check, never a crash."""
    out = Outcome(name, run=run)
    t0 = time.monotonic()
    log.info("scenario %s (run %d) ...", name, run)
    try:
        (AMQP_SCENARIOS if s.amqp_server else SCENARIOS)[name](s, out)
    except Exception as e:
        log.exception("scenario %s raised", name)
        out.check("the scenario ran to the end", False, f"{type(e).__name__}: {str(e)[:1500]}")
    finally:
        s.cleanup()
    out.seconds = round(time.monotonic() - t0, 1)
    log.info(
        "scenario %s (run %d): %d requests, ok %d, error %d, expired %d, lost %d, changed %d in %.1f s (%s)",
        name,
        run,
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


HOG_MAX_S = 4 * 3600.0  # a CPU hog ends itself after this long, whatever happens to the suite
_HOG = "import time\nend = time.monotonic() + {max_s}\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def cpu_hogs(k: int, max_s: float = HOG_MAX_S) -> Iterator[list[Any]]:
    """`k` busy-loop processes beside the suite (each one core's worth of competition), stopped by
    their pid when the block ends; each also ends itself after `max_s` and dies with this process."""
    import subprocess

    from stack.harness import die_with_parent

    procs = [
        subprocess.Popen([sys.executable, "-c", _HOG.format(max_s=float(max_s))], preexec_fn=die_with_parent,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(max(0, k))
    ]
    if procs:
        log.info("CPU hogs running: pids %s", [x.pid for x in procs])
    try:
        yield procs
    finally:
        for x in procs:
            if x.poll() is None:
                x.terminate()
        for x in procs:
            try:
                x.wait(10)
            except subprocess.TimeoutExpired:
                x.kill()
                x.wait(10)


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
    repeat: int = 1,
    cpu_hog: int = 0,
    amqp_server: str | None = None,
) -> dict[str, Any]:
    """Run the named scenarios `repeat` times over (beside `cpu_hog` busy-loop processes), then
    fuzz and soak; returns the report, which lists every run's outcome (never only the best).
    `amqp_server` (amqp://user:pw@host:port of this host's RabbitMQ): run AMQP_SCENARIOS there."""
    report: dict[str, Any] = {
        "scale": scale,
        "device": device,
        "repeat": repeat,
        "cpu_hog": cpu_hog,
        "worker_settings": dict(BASE_SETTINGS),
        "broker": "amqp" if amqp_server else "redis",
        "command": "python -m bench.reliability " + " ".join(sys.argv[1:]),
        "scenarios": [],
    }
    t0 = time.monotonic()
    with suite(checkpoint, scale, device, keep) as s, cpu_hogs(cpu_hog):
        s.amqp_server = amqp_server
        for k in range(1, max(1, repeat) + 1):
            for name in names:
                report["scenarios"].append(run_scenario(s, name, run=k).to_json())
        if fuzz_examples > 0:
            from bench.fuzz import run_fuzz

            report["fuzz"] = run_fuzz(_model(s.checkpoint), fuzz_examples)
        if soak_minutes > 0:
            report["soak"] = run_soak(s, soak_minutes)
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["lost"] = sum(x["lost"] for x in report["scenarios"])
    report["changed"] = sum(x["duplicate_answers_changed"] for x in report["scenarios"])
    runs: dict[str, dict[str, list[Any]]] = {}
    for x in report["scenarios"]:
        per = runs.setdefault(x["name"], {"lost": [], "changed": [], "passed": [], "seconds": []})
        per["lost"].append(x["lost"])
        per["changed"].append(x["duplicate_answers_changed"])
        per["passed"].append(x["passed"])
        per["seconds"].append(x["seconds"])
    report["runs"] = runs  # per scenario, one entry per run, in order
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
    p.add_argument("--repeat", type=int, default=1, help="run the selected scenarios this many times (every run "
                   "is reported; exit 1 if any run lost a request or failed a check)")
    p.add_argument("--cpu-hog", type=int, default=0, metavar="K",
                   help="K busy-loop processes beside the scenarios (started and stopped by the suite)")
    p.add_argument("--device-process", type=int, default=None, choices=(0, 1),
                   help="1: every worker runs its model in a device process (worker setting device_process; "
                        "default: the worker's own, a thread on a CPU)")
    p.add_argument("--cpu-processes", type=int, default=None, metavar="N",
                   help="every worker renders and decodes in N processes (worker setting cpu_processes; "
                        "default: the worker's own, threads on a CPU)")
    p.add_argument("--broker", default=None, metavar="amqp://USER:PW@HOST:PORT",
                   help=f"run the RabbitMQ scenarios ({', '.join(AMQP_SCENARIOS)}) on this host's RabbitMQ, a "
                        "fresh vhost each (made with rabbitmqctl), results in a fresh redis-server")
    args = p.parse_args(argv)
    table = SCENARIOS
    if args.broker:
        if not keys.is_amqp_url(args.broker):
            p.error(f"--broker takes an amqp:// URL (the Redis scenarios run without it); got {mask_url(args.broker)}")
        table = AMQP_SCENARIOS
    if args.cpu_processes is not None:
        BASE_SETTINGS["cpu_processes"] = args.cpu_processes
    if args.device_process is not None:
        BASE_SETTINGS["device_process"] = args.device_process
    if args.repeat < 1 or args.cpu_hog < 0:
        p.error("--repeat must be >= 1 and --cpu-hog >= 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.only == "none":
        names: list[str] = []
    elif args.only:
        names = [x.strip() for x in args.only.split(",") if x.strip()]
        unknown = [x for x in names if x not in table]
        if unknown:
            p.error(f"unknown scenarios {unknown}; choose from {', '.join(table)}")
    else:
        names = list(table)
    report = run(
        names,
        scale=args.scale,
        checkpoint=args.checkpoint,
        device=args.device,
        fuzz_examples=args.fuzz_examples,
        soak_minutes=args.soak_minutes,
        keep=args.keep,
        repeat=args.repeat,
        cpu_hog=args.cpu_hog,
        amqp_server=urlunsplit(urlsplit(args.broker)._replace(path="")) if args.broker else None,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")
    print(
        f"{'scenario':15s} {'run':>3s} {'requests':>8s} {'ok':>6s} {'error':>6s} {'expired':>7s} {'lost':>5s} "
        f"{'changed':>7s} {'seconds':>7s}  result"
    )
    for x in report["scenarios"]:
        print(
            f"{x['name']:15s} {x['run']:3d} {x['requests']:8d} {x['answered_ok']:6d} {x['answered_error']:6d} "
            f"{x['expired']:7d} {x['lost']:5d} {x['duplicate_answers_changed']:7d} {x['seconds']:7.1f}  "
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
