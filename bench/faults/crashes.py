"""Scenarios that take a worker down: SIGKILL mid-batch, warm shutdown (SIGTERM) mid-batch and while
buffering, out-of-memory errors on the device, and a poison request that kills every worker that
scores it. Nothing may be lost: what a dead worker held is delivered again, what a stopping worker
cannot finish goes back to the queue, a poison request ends on the dead-letter list."""

from __future__ import annotations

import json
import random
import time

from bench.faults.accounting import Tracker, classify, drained, error_type, stored_row, unacked
from bench.faults.context import (
    MODEL,
    POLL_S,
    SETTLE_TIMEOUT_S,
    Suite,
    stop_all,
    wait_until,
    worker_counts,
    worker_notes,
)
from bench.faults.report import Outcome
from bench.faults.traffic import good_row, good_rows
from producer.client import Client
from stack.faults import Faults
from vela2.wire import keys


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
    sample = next((stored_row(raws[b["id"]])["error"]["message"] for b in bad if raws[b["id"]]), None)
    out.notes.update(
        {
            "injected": "OutOfMemoryError for batches over 600 padded tokens (max_batch_tokens 2048); "
            "RuntimeError('simulated CUDA out of memory') for any batch holding an oom- request",
            "batches_split": splits,
            "per_request_error_example": sample,
            **notes,
        }
    )

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
    msg = stored_row(poison_raw)["error"]["message"] if poison_raw else None
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

