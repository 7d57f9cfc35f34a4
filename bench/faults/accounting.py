"""The "lost" accounting: every request id a scenario sent is read back from the result store.
A stored answer is ok / error / expired (`classify`); no stored answer at all is `lost` (the suite
exits 1 on one); an answer that differs from the first value seen for its id counts as changed
(results are write-once). `lost_forensics` says where a lost request's traces are."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable
from typing import Any

import redis as redis_lib

from bench.faults.context import POLL_S, QUEUE
from stack.harness import WorkerProcess
from vela2.wire import fleet, keys
from vela2.wire.results import meta_row


def stored_row(raw: bytes | None) -> dict[str, Any]:
    """The RowResult dict of a stored result (vela2.wire.results.meta_row, either layout); {} when
    there is none (no result, a chunk's summary, a result Celery itself wrote)."""
    return (meta_row(json.loads(raw)) if raw is not None else None) or {}


def classify(raw: bytes | None) -> str | None:
    """ok / error / expired of a stored result (ours, or one Celery itself wrote), None when none."""
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return "error"
    row = meta_row(meta)
    if row is not None and row.get("status") in ("ok", "error", "expired"):
        return str(row["status"])
    return "ok" if isinstance(meta, dict) and meta.get("status") == "SUCCESS" else "error"


def error_type(raw: bytes | None) -> str | None:
    """The error type of a stored failure: ours (`error.type`) or Celery's exc_type."""
    if raw is None:
        return None
    meta = json.loads(raw)
    row = meta_row(meta)
    if row is not None and row.get("error"):
        return str(row["error"]["type"])
    result = meta.get("result")
    return str(result.get("exc_type")) if isinstance(result, dict) and "exc_type" in result else None


def error_message(raw: bytes | None) -> str | None:
    """`type: message` of a stored error (ours), Celery's result as text, None when none."""
    if raw is None:
        return None
    meta = json.loads(raw)
    err = stored_row(raw).get("error")
    if err:
        return f"{err.get('type')}: {err.get('message')}"
    result = meta.get("result")
    return str(result) if isinstance(result, dict) else None


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


def unacked(r: redis_lib.Redis) -> int:
    return int(r.hlen(keys.UNACKED_KEY))


def drained(r: redis_lib.Redis) -> bool:
    """Nothing queued and nothing held by a worker."""
    try:
        return not fleet.queue_depths(r, [QUEUE])[QUEUE] and not r.hlen(keys.UNACKED_KEY)
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

