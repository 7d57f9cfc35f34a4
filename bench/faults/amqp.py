"""The RabbitMQ scenarios (`--broker amqp://USER:PW@HOST:PORT`): the same faults against workers that
take from quorum queues on RabbitMQ (a fresh vhost per scenario, made with rabbitmqctl) and store
results in a fresh redis-server: SIGKILL, SIGTERM, the broker dropping every connection, the whole
RabbitMQ application stopped and started, duplicates, a poison request and malformed deliveries.
Nothing is held in Redis's `unacked` hash here: what a worker holds is RabbitMQ's unacked
deliveries, returned when its connection closes.

Not here: those about Redis as broker (redis_restart, redis_down, redis_full, visibility: RabbitMQ
has no visibility timeout) or that LPUSH raw Redis list items (queue_items, bad_id, deep_body,
oversized), start_failures (amqp's are tests of worker.transport.amqp) and oom (a device fault, the
same whatever the broker)."""

from __future__ import annotations

import base64
import json
import random
import subprocess
import time
from collections.abc import Callable
from typing import Any

from bench.faults.accounting import Tracker, classify, error_type, stored_row
from bench.faults.context import (
    MODEL,
    POLL_S,
    QUEUE,
    SETTLE_TIMEOUT_S,
    Suite,
    start_ready,
    stop_all,
    wait_until,
    worker_counts,
    worker_notes,
)
from bench.faults.report import Outcome
from bench.faults.traffic import Producer, good_row, good_rows, past, raw_message
from producer.client import Client
from stack.faults import Faults
from stack.harness import RabbitVhost
from vela2.wire import keys
from vela2.wire.messages import build_message

Delivery = tuple[bytes, dict[str, Any] | None, str | None]  # what RabbitMQ carries: body, headers, content type


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


def amqp_publish_raw(url: str, items: list[Delivery]) -> None:
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


def as_delivery(env: dict[str, Any]) -> Delivery:
    """A built (maybe tampered) envelope as what RabbitMQ carries: raw body, headers, content type."""
    return base64.b64decode(env["body"]), env["headers"], env["content-type"]


def _ours(rid: str, body: bytes | None = None, content_type: str = "application/json", **headers: Any) -> Delivery:
    """A message of ours for one good-looking row `rid`, with its body, content type or headers replaced."""
    env = raw_message([{**good_row("x", 0), "id": rid}])
    env["headers"].update(headers)
    return (body if body is not None else as_delivery(env)[0]), env["headers"], content_type


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
    items, want = _bad_deliveries(k)  # want: id -> expected error type
    chunk_good, late, forged, unanswerable = _more_bad_deliveries(k, items, want)
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
    out.notes.update({
        "broker": "amqp",
        "error_answers": _error_examples(want, raws),
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


def _bad_deliveries(k: int) -> tuple[list[Delivery], dict[str, str]]:
    """`k` deliveries of each bad kind that still carries an id (undecodable bodies, wrong tasks, bad
    headers, a wrong content type, protocol 1, schema-invalid requests), and id -> expected error type."""
    items: list[Delivery] = []
    want: dict[str, str] = {}
    base = good_row("x", 0)

    def bad(prefix: str, etype: str, make: Callable[[str], Delivery]) -> None:
        for i in range(k):
            rid = f"{prefix}-{i}"
            items.append(make(rid))
            want[rid] = etype

    bad("notjson", "invalid_request", lambda rid: _ours(rid, b"{not json"))
    bad("notutf8", "invalid_request", lambda rid: _ours(rid, b"\xff\xfe\x00"))
    bad("badargs", "invalid_request", lambda rid: _ours(rid, json.dumps([[base], {"bogus": 1}, {}]).encode()))
    bad("wrongtask", "invalid_request", lambda rid: _ours(rid, task="vela2.no_such_task"))
    bad("builtin", "invalid_request", lambda rid: _ours(rid, task="celery.backend_cleanup"))  # never run
    bad("badexpires", "invalid_request", lambda rid: _ours(rid, expires="next tuesday"))
    bad("pickle", "invalid_request", lambda rid: _ours(rid, content_type="application/x-python-serialize"))
    bad("gzip", "invalid_request", lambda rid: _ours(rid, compression="application/x-gzip"))  # kombu cannot decompress
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
    return items, want


def _more_bad_deliveries(k: int, items: list[Delivery],
                         want: dict[str, str]) -> tuple[list[str], list[str], list[str], list[Delivery]]:
    """Add to `items` (and `want`) chunks mixing a good and a bad row, deliveries past their
    deadline, messages forging the refusal headers and deliveries with no id to answer under;
    returns the chunks' good ids, the late ids, the forged ids and the unanswerable deliveries."""
    base = good_row("x", 0)
    # a chunk mixing good and bad rows: each row answered under its own id
    chunk_good = []
    for i in range(k):
        g, b = f"chunkgood-{i}", f"chunkbad-{i}"
        items.append(as_delivery(raw_message([good_row(g, i), {**base, "id": b, "questions": [{"options": ["only"]}]}],
                                             chunk=True)))
        want[b] = "invalid_request"
        chunk_good.append(g)
    late = [f"late-{i}" for i in range(k)]
    items += [as_delivery(raw_message([{**base, "id": rid}], expires=past())) for rid in late]
    # a message of ours forging the refusal headers: answered ok, nothing stored under the forged ids
    forged = [f"forged-{i}" for i in range(k)]
    items += [_ours(rid, vela2_refused="forged", vela2_refused_ids=[f"victim-{rid}"]) for rid in forged]
    # no id to answer under: dead-lettered with the reason
    garbage: list[Delivery] = [
        (b"this is not a message", None, "text/plain"), (json.dumps({"no": "envelope"}).encode(), None, None),
        (b"", None, "application/json"), (json.dumps([1, 2, 3]).encode(), {"task": "vela2.no_such_task"}, None)]
    no_id = raw_message([{**base, "id": "noid"}])
    del no_id["headers"]["id"]
    unanswerable = [garbage[i % len(garbage)] for i in range(2 * k)] + [as_delivery(no_id)] * k
    items += unanswerable
    return chunk_good, late, forged, unanswerable


def _error_examples(want: dict[str, str], raws: dict[str, bytes | None]) -> dict[str, str]:
    """One stored error per kind of bad delivery (`type: message`)."""
    examples = {}
    for rid in want:
        kind = rid.rsplit("-", 1)[0]
        if kind not in examples and raws[rid] is not None:
            err = stored_row(raws[rid]).get("error") or {}
            examples[kind] = f"{err.get('type')}: {str(err.get('message'))[:200]}"
    return examples


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
