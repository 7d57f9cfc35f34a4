"""Scenarios that attack Redis, the broker and result store: a restart under load (AOF), an outage
of 30 s with a full queue while producers keep submitting, and Redis at its maxmemory refusing
every write (a worker started while it is full, and one scoring when it fills up). Workers and
producers reconnect and wait; nothing queued or held is dropped, nothing is answered twice."""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

import redis as redis_lib

from bench.faults.accounting import Tracker, drained, lost_forensics, unacked
from bench.faults.context import (
    MODEL,
    POLL_S,
    QUEUE,
    SETTLE_TIMEOUT_S,
    Suite,
    log_problems,
    start_ready,
    stop_all,
    wait_until,
    worker_counts,
    worker_notes,
)
from bench.faults.report import Outcome
from bench.faults.traffic import Producer, good_rows
from producer.client import Client
from stack.faults import Faults
from stack.harness import READY_TIMEOUT_S, RedisServer, WorkerProcess
from vela2.wire import keys


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


# --- Redis full ------------------------------------------------------------------------------------

FILL_VALUE_BYTES = 64 * 1024  # one fill key (SET) while filling Redis up to its maxmemory
FULL_MAXMEMORY = "16mb"  # redis_full: room for the queue and the answers, little more
FULL_MARGIN_BYTES = 2**20  # once full, maxmemory is held this far below the memory in use
FULL_DELAY_S = 0.5  # redis_full (b): the slow device's delay before every batch
BLOCKED_METRIC = "vela2_redis_write_blocked_seconds"
REFUSAL_LOG = re.compile(r"Redis refuses writes .* nothing is dropped")


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
    wa, ca, notes_a = _full_at_start(s, out, r, rc, client, tr, hold_s)
    wb, rows_b, notes_b = _full_while_scoring(s, out, r, rc, client, tr, hold_s)
    problems = log_problems(wa) + log_problems(wb)
    out.check("no safety-net log lines (engine loop errors, tracebacks)", not problems, problems)
    stop_all([wb], out)
    cb = worker_counts(wb) or {}
    out.check("(b) answered exactly once (no duplicate, nothing returned)",
              cb.get("answered") == rows_b and cb.get("duplicates_skipped") == 0, cb)
    accepted = re.findall(r"Redis accepts writes again after ([\d.]+) s", wb.log())
    out.notes.update(
        {
            "injected": f"redis-server --maxmemory {FULL_MAXMEMORY} (noeviction) filled with "
            f"{FILL_VALUE_BYTES // 1024} KiB SET keys until OutOfMemoryError, then maxmemory held "
            f"{FULL_MARGIN_BYTES // 2**20} MiB below the memory in use; (a) before a worker starts, "
            f"(b) while a worker (slow device {FULL_DELAY_S} s/batch, buffer 6) scores; held full {hold_s:.0f} s",
            **notes_a,
            **notes_b,
            "b_blocked_per_worker_log_s": [float(x) for x in accepted],
            "a_worker": ca,
            "b_worker": cb,
        }
    )
    out.settle(tr)
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)
    client.close()
    tr.close()


def _full_at_start(s: Suite, out: Outcome, r: RedisServer, rc: redis_lib.Redis, client: Client, tr: Tracker,
                   hold_s: float) -> tuple[WorkerProcess, dict[str, int], dict[str, Any]]:
    """redis_full (a): requests queued, Redis filled, then a worker started; it must wait (and say
    so) while Redis is full and answer everything once freed. Returns the worker (stopped), its
    counts and the notes."""
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
    return wa, ca, {"a_fill": filled_a, "a_refusal_log_line": line, "a_answered_while_full": answered_while_full,
                    "a_answered_all_after_free_s": round(answered_a_s, 1)}


def _full_while_scoring(s: Suite, out: Outcome, r: RedisServer, rc: redis_lib.Redis, client: Client, tr: Tracker,
                        hold_s: float) -> tuple[WorkerProcess, int, dict[str, Any]]:
    """redis_full (b): a worker on a slow device scoring a queue when Redis fills up; held full
    `hold_s` after its blocked-seconds metric shows the wait, then freed. Returns the worker (still
    running), how many requests it was sent and the notes."""
    settings: dict[str, Any] = {"max_batch_tokens": 128, "max_buffered": 6}  # 2 rows per 0.5 s batch, 4 buffered
    wb = s.worker(r.url(), faults=Faults(delay_s=FULL_DELAY_S), metrics=True, **settings).wait_ready()
    pid_b = wb.pid
    rows_b = good_rows("fullrun", s.n(60, minimum=40))
    tr.add(client.submit_many(rows_b))
    wait_until(lambda: tr.poll() <= len(rows_b) - 2, 120, "worker (b) to answer a few")
    filled_b = fill_redis(rc, "fill:b:")
    t_fill = time.monotonic()
    tr.poll()
    answered_at_fill = tr.answered()
    blocked_max, seen = _watch_blocked(wb, t_fill, hold_s)
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
    back_to_zero = _metric_back_to_zero(wb, 60)
    out.check("(b) Redis really refused writes for the whole hold", still_full)
    out.check("(b) nothing answered while Redis was full (nothing could be stored)", answered_while_full_b == 0,
              answered_while_full_b)
    out.check(f"(b) {BLOCKED_METRIC} > 0 while Redis was full", blocked_max > 0, round(blocked_max, 2))
    out.check("(b) the worker stayed up while Redis was full", alive_full_b)
    out.check("(b) after freeing, every request answered and the queue drained", done_b, f"{tr.poll()} missing")
    out.check(f"(b) {BLOCKED_METRIC} back to 0 once Redis accepts writes", back_to_zero)
    out.check("(b) the same worker process did it (never exited)", wb.alive() and wb.pid == pid_b, wb.pid)
    return wb, len(rows_b), {
        "b_fill": filled_b,
        "b_metric_seen_after_fill_s": None if seen is None else round(seen, 1),
        "b_write_blocked_seconds_max": round(blocked_max, 2),
        "b_answered_while_full": answered_while_full_b,
        "b_held_unacked_while_full": held_b,
        "b_queued_while_full": queued_b,
        "b_answered_all_after_free_s": round(answered_b_s, 1),
    }


def _watch_blocked(w: WorkerProcess, t_fill: float, hold_s: float) -> tuple[float, float | None]:
    """Read the worker's blocked-seconds metric until it shows the wait, then `hold_s` more (at most
    120 s after the fill); the highest value and the seconds after the fill it first showed."""
    blocked_max = 0.0
    seen = None
    while time.monotonic() - t_fill < 120 and w.alive():
        blocked = metric(w.metrics_port, BLOCKED_METRIC) or 0.0
        blocked_max = max(blocked_max, blocked)
        if seen is None and blocked > 0:
            seen = time.monotonic() - t_fill
        if seen is not None and time.monotonic() - t_fill >= seen + hold_s:
            break
        time.sleep(0.25)
    return blocked_max, seen


def _metric_back_to_zero(w: WorkerProcess, timeout_s: float) -> bool:
    """True once the worker's blocked-seconds metric reads 0 again (within `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if metric(w.metrics_port, BLOCKED_METRIC) == 0.0:
            return True
        time.sleep(0.2)
    return False
