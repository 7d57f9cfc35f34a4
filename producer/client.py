"""A minimal synchronous client: submit requests to the worker queues, read their results.

    client = Client("redis://127.0.0.1:6379/0", model="vela2-demo")
    rid = client.submit({"id": "r-1", "task": "choice:boolq", "text": "...", "questions": [...]})
    result = client.result(rid, timeout_s=30)          # a vela2.schemas.RowResult

Rows go to the model's online queue (or its backfill queue with `backfill=True`); a SystemOne
request goes to the queue of the model it names. Reads are pipelined: `results_many` fetches any
number of ids with one MGET per poll. No celery, no torch (the producer issue completes this:
asyncio client, backfill, HTTP).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import redis as redis_lib

from producer.messages import Message, build_message, deadline_to_expires, parse_meta, read_answers, read_results
from vela2.schemas import RowResult
from worker import keys

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
_POLL_START_S = 0.005  # first poll interval of results_many; doubles up to _POLL_MAX_S
_POLL_MAX_S = 0.2


class Client:
    """Submit requests and read results over one Redis connection pool."""

    def __init__(self, redis_url: str = DEFAULT_REDIS_URL, *, model: str = "vela2-demo", redis: Any = None):
        self.redis = redis if redis is not None else redis_lib.Redis.from_url(redis_url)
        self.model = model

    def queue_for(self, request: Any, *, backfill: bool = False) -> str:
        """The queue a request goes to: its SystemOne model's, else this client's model's."""
        model = self.model
        if isinstance(request, dict) and isinstance(request.get("model"), str) and "tasks" in request:
            model = request["model"]
        return keys.backfill_queue(model) if backfill else keys.online_queue(model)

    def _push(self, messages: list[Message]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for m in messages:
            pipe.lpush(m.queue, m.payload)
        pipe.execute()

    def submit(self, request: Any, *, backfill: bool = False, deadline_s: float | None = None) -> str:
        """Queue one request (a row or a SystemOne request); returns the id it is answered under."""
        msg = build_message(
            [request], self.queue_for(request, backfill=backfill), expires=deadline_to_expires(deadline_s)
        )
        self._push([msg])
        return msg.id

    def submit_many(
        self, requests: Iterable[Any], *, backfill: bool = False, chunk_size: int = 1, deadline_s: float | None = None
    ) -> list[str]:
        """Queue many requests in one round trip; returns their ids in input order. `chunk_size` > 1
        packs up to that many requests of one queue into each message (each still answered under
        its own id)."""
        expires = deadline_to_expires(deadline_s)
        reqs = list(requests)
        by_queue: dict[str, list[int]] = {}  # queue -> indices into reqs
        for i, r in enumerate(reqs):
            by_queue.setdefault(self.queue_for(r, backfill=backfill), []).append(i)
        ids: list[str] = [""] * len(reqs)
        messages: list[Message] = []
        step = max(1, chunk_size)
        for queue, idx in by_queue.items():
            for k in range(0, len(idx), step):
                part = idx[k : k + step]
                msg = build_message([reqs[i] for i in part], queue, chunk=chunk_size > 1, expires=expires)
                messages.append(msg)
                for i, rid in zip(part, msg.request_ids, strict=True):
                    ids[i] = rid
        if messages:
            self._push(messages)
        return ids

    def result(self, request_id: str, timeout_s: float | None = None) -> RowResult:
        """Wait for one result (pub/sub on its key, so no polling); TimeoutError after timeout_s."""
        key = keys.result_key(request_id)
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(key)  # subscribe first, then read: a result written in between is not missed
            found = parse_meta(self.redis.get(key))
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while found is None:
                left = 1.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no result for {request_id!r} after {timeout_s} s")
                msg = pubsub.get_message(timeout=min(left, 1.0))
                if msg is not None and msg.get("type") == "message":
                    found = parse_meta(msg["data"])
                elif msg is None:
                    found = parse_meta(self.redis.get(key))  # a reconnect may drop a publish
            return found
        finally:
            pubsub.close()

    def results_many(self, ids: Iterable[str], timeout_s: float | None = None) -> dict[str, RowResult | None]:
        """Wait for many results, one MGET per poll over the ids still missing; ids without a result
        when timeout_s runs out map to None."""
        return self._wait_many(list(ids), timeout_s, read_results)

    def answers_many(self, ids: Iterable[str], timeout_s: float | None = None) -> dict[str, dict[str, Any] | None]:
        """As results_many, but the product answers: a SystemOne request's answer, else the
        RowResult dict."""
        return self._wait_many(list(ids), timeout_s, read_answers)

    def _wait_many(self, ids: list[str], timeout_s: float | None, reader: Any) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(ids)
        missing = list(dict.fromkeys(ids))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pause = _POLL_START_S
        while missing:
            got = reader(self.redis, missing)
            out.update({k: v for k, v in got.items() if v is not None})
            missing = [k for k in missing if got[k] is None]
            if not missing or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(pause * 2, _POLL_MAX_S)
        return out

    def close(self) -> None:
        """Release the connection pool."""
        self.redis.close()
