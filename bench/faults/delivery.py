"""Scenarios where one message is delivered more than once: every message pushed twice (some a
third time inside a chunk) to two workers, and a batch slower than the visibility timeout (the
start-up check that refuses a too short one, and, forced anyway, redeliveries of held messages).
Results are write-once: duplicates are skipped or scored again, and no stored answer changes."""

from __future__ import annotations

from bench.faults.accounting import Tracker, drained, unacked
from bench.faults.context import MODEL, QUEUE, SETTLE_TIMEOUT_S, Suite, start_ready, stop_all, wait_until, worker_notes
from bench.faults.report import Outcome
from bench.faults.traffic import good_rows
from producer.client import Client
from stack.faults import Faults
from stack.harness import READY_TIMEOUT_S
from vela2.wire.messages import build_message


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

