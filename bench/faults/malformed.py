"""Scenarios that send messages no worker should choke on, through the producer's path and raw:
undecodable bodies, wrong task names, schema-invalid payloads, bad headers and non-Celery items
(`malformed`), requests past every documented size limit up to a 50 MB message (`oversized`),
and JSON nested 100,000 deep (`deep_body`). Every bad message that carries an id gets an error
answer of the right type, items without one go to the dead-letter list, good traffic around them
is answered ok, and the worker keeps running."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

from bench.faults.accounting import Tracker, classify, drained, error_message, error_type, stored_row
from bench.faults.context import (
    MODEL,
    QUEUE,
    SETTLE_TIMEOUT_S,
    Suite,
    log_problems,
    round1,
    stop_all,
    worker_counts,
    worker_notes,
)
from bench.faults.report import Outcome
from bench.faults.traffic import DEEP, good_row, good_rows, past, raw_message, set_body
from producer.client import Client
from vela2.errors import LimitExceeded
from vela2.wire import keys
from vela2.wire.messages import build_message
from vela2.wire.results import meta_row


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
    items, want = _bad_with_id(k)  # envelopes (JSON text) or raw strings; id -> expected error type
    chunk_good, late, unanswerable = _more_bad_items(k, items, want)
    tr.add(chunk_good)
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
    oks = [g["id"] for g in good] + chunk_good
    out.check("every good request (chunked ones too) answered ok", all(classify(raws[i]) == "ok" for i in oks))
    out.check("requests past their deadline answered expired", all(classify(raws[i]) == "expired" for i in late))
    dead = [json.loads(x) for x in rc.lrange(keys.dead_letter(MODEL), 0, -1)]
    out.notes.update(
        {
            "error_answers": _error_examples(want, raws),
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


def _bad_with_id(k: int) -> tuple[list[str], dict[str, str]]:
    """`k` messages of each bad kind that still carries an id (undecodable bodies, wrong tasks, bad
    headers, schema-invalid requests): the raw items, and id -> the error type it must get."""
    items: list[str] = []
    want: dict[str, str] = {}

    def bad(prefix: str, etype: str, make: Callable[[str, int], dict[str, Any]]) -> None:
        for i in range(k):
            rid = f"{prefix}-{i}"
            items.append(json.dumps(make(rid, i)))
            want[rid] = etype

    def with_header(name: str, value: str) -> Callable[[str, int], dict[str, Any]]:
        def make(rid: str, i: int) -> dict[str, Any]:
            env = raw_message([{**base, "id": rid}])
            env["headers"][name] = value
            return env

        return make

    base = good_row("x", 0)
    bad("notjson", "invalid_request", lambda rid, i: set_body(raw_message([{**base, "id": rid}]), b"{not json"))
    bad("notutf8", "invalid_request", lambda rid, i: set_body(raw_message([{**base, "id": rid}]), b"\xff\xfe\x00"))
    bad(
        "badargs",
        "invalid_request",
        lambda rid, i: set_body(raw_message([{**base, "id": rid}]), json.dumps([[base], {"bogus": 1}, {}]).encode()),
    )
    bad("wrongtask", "invalid_request", with_header("task", "vela2.no_such_task"))
    bad("badexpires", "invalid_request", with_header("expires", "next tuesday"))
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
    return items, want


def _more_bad_items(k: int, items: list[str], want: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """Add to `items` (and `want`) chunks mixing a good and a bad row, messages past their deadline
    and items with no id to answer under; returns the chunks' good ids, the late ids and the
    unanswerable items."""
    base = good_row("x", 0)
    chunk_good = []  # a chunk mixing good and bad rows: each row answered under its own id
    for i in range(k):
        g, b = f"chunkgood-{i}", f"chunkbad-{i}"
        items.append(json.dumps(raw_message([good_row(g, i), {**base, "id": b, "questions": [{"options": ["only"]}]}],
                                            chunk=True)))
        want[b] = "invalid_request"
        chunk_good.append(g)
    # past their deadline: answered `expired`, not scored
    late = [f"late-{i}" for i in range(k)]
    for rid in late:
        items.append(json.dumps(raw_message([{**base, "id": rid}], expires=past())))
    # no id to answer under: dead-lettered with the reason (not requests)
    garbage = ["this is not a message", json.dumps({"no": "envelope"}), "", json.dumps([1, 2, 3])]
    no_id = raw_message([{**base, "id": "noid"}])
    del no_id["headers"]["id"]
    unanswerable = [garbage[i % len(garbage)] for i in range(2 * k)] + [json.dumps(no_id)] * k
    items += unanswerable
    return chunk_good, late, unanswerable


def _error_examples(want: dict[str, str], raws: dict[str, bytes | None]) -> dict[str, str]:
    """One stored error per kind of bad message (`type: message`, ours or Celery's)."""
    examples = {}
    for rid in want:
        kind = rid.rsplit("-", 1)[0]
        if kind not in examples and raws[rid] is not None:
            meta = json.loads(raws[rid])
            err = (meta_row(meta) or {}).get("error") or {
                "type": meta["result"].get("exc_type"),
                "message": str(meta["result"].get("exc_message")),
            }
            examples[kind] = f"{err['type']}: {str(err['message'])[:200]}"
    return examples


def scenario_oversized(s: Suite, out: Outcome) -> None:
    """Texts past the documented hard limits (words, characters), thousands of labels and options,
    and a 50 MB message (the producer refuses to build it; pushed raw anyway, the worker answers
    it with limit_exceeded without decoding it), mixed into good traffic."""
    r = s.redis()
    rc = r.client()
    w = s.worker(r.url()).wait_ready()
    rss_before = w.rss_mb()
    tr = Tracker(r.url())
    payloads, want, sizes, huge = _oversized_payloads()
    producer_refusal = _producer_refusal(r.url(), huge)
    out.check("the producer refuses a 50 MB request with LimitExceeded", producer_refusal is not None, producer_refusal)
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
            messages[rid] = stored_row(raws[rid])["error"]["message"][:160]
        except (TypeError, KeyError, ValueError):
            messages[rid] = None
    out.notes.update(
        {
            "injected": {rid: f"{n / 2**20:.1f} MiB message" for rid, n in sizes.items()},
            "limits": _limits(),
            "error_messages": messages,
            "producer_refusal": producer_refusal,
            "worker_rss_mb": {"before": round1(rss_before), "after": round1(rss_after)},
            "seconds_to_answer_all": round(elapsed, 1),
            **worker_notes([w]),
        }
    )


def _oversized_payloads() -> tuple[list[str], dict[str, str], dict[str, int], dict[str, Any]]:
    """The oversized messages (size limits of the producer off): requests past each limit, a 50 MB
    one and a 50 MB chunk. Returns the payloads, id -> expected error type, the sizes by id, and
    the 50 MB request."""
    from vela2.config import LIMITS

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
    # 50 MB: a raw push of it gets a limit_exceeded answer from the worker; so does a 50 MB chunk
    huge = {**base, "id": "over-50mb", "text": "y " * (25 * 2**20)}
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
    return payloads, want, sizes, huge


def _producer_refusal(redis_url: str, huge: dict[str, Any]) -> str | None:
    """The producer's LimitExceeded message for a 50 MB request (None when it sent it)."""
    producer = Client(redis_url, model=MODEL)
    try:
        producer.submit(huge)
        return None
    except LimitExceeded as e:
        return str(e)
    finally:
        producer.close()


def _limits() -> dict[str, int]:
    from vela2.config import LIMITS

    return {
        "max_text_words": LIMITS.max_text_words,
        "max_text_chars": LIMITS.max_text_chars,
        "max_labels": LIMITS.max_labels,
        "max_options": LIMITS.max_options,
        "max_questions": LIMITS.max_questions,
        "max_tasks": LIMITS.max_tasks,
        "max_message_bytes": LIMITS.max_message_bytes,
    }


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
    msgs = {i: error_message(raws[i]) for i in ("deep-body", "deep-request")}
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

