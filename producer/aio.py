"""The asyncio client: the same API as producer.Client, every call a coroutine, no blocking wait.

    async with AsyncClient("redis://127.0.0.1:6379/0", model="vela2-demo") as client:
        rid = await client.submit(request)
        answer = await client.answer(rid, timeout_s=10)

Waiting never blocks the event loop and does not wait for a poll: a waited-on id's result key
channel is subscribed on one pub/sub connection per client (the worker PUBLISHes each result as it
stores it), so an answer resolves its future the moment it is stored. Beside it one background task
(the poller) reads the result keys and submitted markers of every id any coroutine waits on with
ONE MGET per poll (redis.asyncio): results stored before the subscription, expired answers, and a
message lost with a dropped connection. Its pause starts at `poll_min_s`, doubles up to
`poll_max_s` while nothing arrives, and drops back when a result arrives or a new waiter joins, so
a thousand concurrent `answer()` calls cost one MGET per pause, not a thousand GETs. Where the
server refuses SUBSCRIBE (an ACL user without channel rights) the client polls only.
Validation and message building are producer.prepare's (`prepare_request`,
`pack_messages`), and so are the states and terminal outcomes: submissions are tracked by default;
an id whose answer expired from the result store makes `result` / `answer` raise
`vela2.errors.ResultExpired` at once and maps to an error result of type "result_expired" in
`results_many` / `answers_many`; `status(id)` says "answered" / "pending" / "no_worker" / "expired" /
"unknown"; a wait ends with `vela2.errors.NoWorker` once no worker of the model has beaten for
`no_worker_grace_s` (producer.client says when; each waiting coroutine asks producer.liveness about
every second, which reads Redis only when no beat is young enough).
Use one client per event loop (redis.asyncio connections belong to the loop that opened them).
No celery, no torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from producer import brokers
from producer.answers import expired_answer, expired_row, result_expired_error
from producer.brokers import AmqpPublisher, check_pushed, queue_commands
from producer.client import DEFAULT_MODEL, DEFAULT_REDIS_URL, RequestStatus
from producer.liveness import DEFAULT_GRACE_S, Liveness, wait_checked
from producer.prepare import pack_messages, prepare_many, prepare_request
from producer.scope import Scope
from producer.submitting import (
    Claims,
    cancel_commands,
    check_claim_push,
    check_ttl,
    claim_commands,
    claim_push_command,
    conflict_error,
    nothing_sent,
    one_call,
    plan_submit,
    read_claims,
    refused_whole,
    store_full,
    unanswered,
)
from producer.waiting import check_timeout
from vela2.api.schemas import RowResult
from vela2.errors import NoWorker
from vela2.wire import scripts, tracing
from vela2.wire.connections import async_redis_client
from vela2.wire.keys import RESULT_PREFIX, is_amqp_url, queue_name, result_key, submitted_key
from vela2.wire.messages import Message, deadline_to_expires
from vela2.wire.results import (
    DEFAULT_SUBMITTED_TTL_S,
    State,
    parse_answer,
    parse_meta,
    split_state,
    state_keys,
    state_of,
)

POLL_MIN_S = 0.005  # first pause after a poll that found nothing
POLL_MAX_S = 0.1  # longest pause while waiting (the latency added to a late result)
LISTEN_S = 0.05  # the pub/sub listener's longest read: aclose() waits at most this for it

log = logging.getLogger(__name__)


class _Expired:
    """What the poller resolves a future with when the id's answer came and expired."""

    def __repr__(self) -> str:
        return "EXPIRED"


EXPIRED = _Expired()


class Busy(redis.exceptions.RedisError):
    """No Redis connection came free within the wait: the route is at its concurrency (HTTP 429)."""


class BoundedPool(aioredis.BlockingConnectionPool):
    """At most max_connections connections; a caller waits `timeout` for one, then gets Busy (a
    full pool is load, not Redis being away: redis-py says ConnectionError for both)."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_connection(*args, **kwargs)
        except redis.exceptions.ConnectionError as e:
            if isinstance(e.__cause__, asyncio.TimeoutError | TimeoutError):
                raise Busy(f"every one of the {self.max_connections} Redis connections stayed busy for "
                           f"{self.timeout:g} s") from e
            raise


class SyncBoundedPool(redis.BlockingConnectionPool):
    """BoundedPool for a synchronous client (the HTTP route's bulk-job routes): Busy after the wait."""

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().get_connection(*args, **kwargs)
        except redis.exceptions.ConnectionError as e:
            if "No connection available" in str(e):  # redis-py's words for the pool's timeout
                raise Busy(f"every one of the {self.max_connections} Redis connections stayed busy for "
                           f"{self.timeout:g} s") from e
            raise


class _Poller:
    """Resolves futures of waited-on ids with one MGET (result + marker keys) per poll, from one
    background task: with the raw stored meta, or with EXPIRED when the marker says "answered" but
    the result is gone."""

    def __init__(self, redis: Any, min_s: float, max_s: float, subscriber: Any = None):
        self.redis = redis
        # the client whose pool the result channels' subscription takes its connection from: a pool of
        # its own where `redis`'s is bounded (the route), or the subscription could hold the last
        # connection and starve the polls that find results stored before it subscribed
        self.subscriber = redis if subscriber is None else subscriber
        self.min_s = min_s
        self.max_s = max_s
        self.polls = 0  # MGET round trips so far (tests read it)
        self.pushed = 0  # results that came as pub/sub messages (tests read it)
        self._waiting: dict[str, list[asyncio.Future]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._pubsub: Any = None  # the result channels' subscription (None: not yet, or refused)
        self._push_off = False  # SUBSCRIBE failed once: poll only from then on
        self._listener: asyncio.Task | None = None

    async def wait(self, ids: Iterable[str], timeout_s: float | None,
                   check: Callable[[], Awaitable[None]] | None = None) -> dict[str, Any]:
        """id -> raw stored meta, EXPIRED for an id whose answer expired, or None for ids with no
        result when timeout_s runs out. Raises what Redis raised if the poll fails (e.g.
        redis.ConnectionError), and what `check` raises (producer.liveness.wait_checked: NoWorker)."""
        loop = asyncio.get_running_loop()
        futures = {rid: loop.create_future() for rid in dict.fromkeys(ids)}
        fresh = [rid for rid in futures if rid not in self._waiting]
        for rid, fut in futures.items():
            self._waiting.setdefault(rid, []).append(fut)
        try:
            # subscribed before the poll below reads them: a result stored after that poll is pushed
            await self._subscribe(fresh)
            self._wake.set()
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._run(), name="vela2-result-poller")
            if futures:
                await wait_checked(list(futures.values()), timeout_s, check)
        finally:
            done = []
            for rid, fut in futures.items():
                waiters = self._waiting.get(rid)
                if waiters is not None and fut in waiters:
                    waiters.remove(fut)
                    if not waiters:
                        del self._waiting[rid]
                if not fut.done():
                    fut.cancel()
                if rid not in self._waiting:
                    done.append(rid)
            await self._unsubscribe(done)
        errors = [e for fut in futures.values() if not fut.cancelled() and (e := fut.exception()) is not None]
        if errors:
            raise errors[0]
        return {rid: None if fut.cancelled() else fut.result() for rid, fut in futures.items()}

    def _resolve(self, rid: str, value: Any) -> None:
        for fut in self._waiting.pop(rid, []):
            if not fut.done():
                fut.set_result(value)

    async def _subscribe(self, ids: list[str]) -> None:
        """Subscribe the result channels of `ids` (the first call opens the pub/sub connection and
        its listener); a refusal or an error turns pushing off, the poller still finds every result."""
        if self._push_off or not ids:
            return
        try:
            if self._pubsub is None:
                self._pubsub = self.subscriber.pubsub(ignore_subscribe_messages=True)
            await self._pubsub.subscribe(*(result_key(rid) for rid in ids))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # NOPERM (an ACL user without channel rights), a server without pub/sub
            log.debug("result channels not subscribed (%s: %s); polling only", type(e).__name__, e)
            await self._stop_push()
            return
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen(), name="vela2-result-listener")

    async def _unsubscribe(self, ids: list[str]) -> None:
        if self._pubsub is None or self._push_off or not ids:
            return
        try:
            await self._pubsub.unsubscribe(*(result_key(rid) for rid in ids))
        except asyncio.CancelledError:
            raise
        except Exception:  # the connection broke: the listener turns pushing off
            pass

    async def _listen(self) -> None:
        """Resolve each waited-on id whose result is published (the stored result itself)."""
        try:
            while (pubsub := self._pubsub) is not None:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=LISTEN_S)
                if msg is None or msg.get("type") != "message":
                    continue
                channel = msg["channel"]
                rid = (channel.decode() if isinstance(channel, bytes) else channel).removeprefix(RESULT_PREFIX)
                if rid in self._waiting:
                    self.pushed += 1
                    self._resolve(rid, msg["data"])
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the connection broke: from here the poller alone finds results
            log.debug("result listener stopped (%s: %s); polling only", type(e).__name__, e)
            await self._stop_push()

    async def _stop_push(self) -> None:
        """Poll only from now on: the subscription is closed and never opened again."""
        self._push_off = True
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def _run(self) -> None:
        pause = self.min_s
        while self._waiting:
            self._wake.clear()
            ids = list(self._waiting)
            try:
                got = split_state(ids, await self.redis.mget(state_keys(ids)))
                self.polls += 1
            except Busy:  # every pooled connection is in use: load, not an outage; poll again soon
                await asyncio.sleep(pause)
                continue
            except Exception as e:  # Redis away: every current waiter gets the error, none hangs
                for rid in ids:
                    for fut in self._waiting.pop(rid, []):
                        if not fut.done():
                            fut.set_exception(e)
                await asyncio.sleep(pause)
                continue
            found = False
            for rid, (raw, marker) in got.items():
                value = EXPIRED if state_of(raw, marker) == "expired" else raw
                if value is not None:
                    found = True
                    self._resolve(rid, value)
            pause = self.min_s if found else min(pause * 2, self.max_s)
            if self._waiting:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)
                if self._wake.is_set():
                    pause = self.min_s  # a new waiter: poll for it now

    async def aclose(self) -> None:
        """Stop polling; coroutines still waiting get None (as after a timeout)."""
        for waiters in self._waiting.values():
            for fut in waiters:
                fut.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # the listener ends by itself within LISTEN_S once the subscription is gone (a read cancelled
        # inside fakeredis's pub/sub would leave its reader behind and hang the loop's shutdown)
        self._pubsub, pubsub = None, self._pubsub
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()


class AsyncClient:
    """Submit requests and await results over one redis.asyncio connection pool.

    The constructor takes what `producer.Client` takes (`redis` then is a `redis.asyncio.Redis`, or
    in tests a `fakeredis.FakeAsyncRedis`; `aclose()` closes only a pool this client made), plus the
    poller's pauses `poll_min_s` / `poll_max_s` (see the module docstring). Checks at submit and the
    exceptions raised are Client's (`no_worker_grace_s` too; `liveness`: another client's, shared).
    """

    def __init__(
        self,
        redis_url: str = DEFAULT_REDIS_URL,
        *,
        model: str = DEFAULT_MODEL,
        redis: Any = None,
        track_submitted: bool = True,
        submitted_ttl_s: int = DEFAULT_SUBMITTED_TTL_S,
        poll_min_s: float = POLL_MIN_S,
        poll_max_s: float = POLL_MAX_S,
        tenant: str | None = None,
        broker_url: str | None = None,
        broker: Any = None,
        wait_replicas: int = 0,
        subscriber: Any = None,
        poller: _Poller | None = None,
        no_worker_grace_s: float | None = DEFAULT_GRACE_S,
        liveness: Liveness | None = None,
    ):
        self.wait_replicas = brokers.check_wait_replicas(wait_replicas, broker_url)  # as producer.Client's
        self._owns_redis = redis is None  # aclose closes only a connection pool this client made
        self.redis = redis if redis is not None else async_redis_client(redis_url)
        self._owns_broker = broker is None and bool(broker_url)
        # the queues' broker: the result store's Redis unless the workers take from another broker
        # (RabbitMQ: the blocking publisher, run in a thread)
        self.broker = broker if broker is not None else (
            (AmqpPublisher(broker_url) if is_amqp_url(broker_url) else async_redis_client(broker_url))
            if broker_url else self.redis)
        self.model = model
        self.track_submitted = track_submitted
        self.submitted_ttl_s = check_ttl(submitted_ttl_s)
        self.scope = Scope(tenant)  # ids of a tenant never meet another's (producer.scope.Scope)
        tracing.configure("vela2-producer")  # only when OTEL_* variables ask for traces (vela2.wire.tracing)
        self._poll = (poll_min_s, poll_max_s)
        self._owns_poller = poller is None  # aclose stops only a poller this client made
        self.poller = _Poller(self.redis, poll_min_s, poll_max_s, subscriber) if poller is None else poller
        # when waits give up (NoWorker): one per model's pool, shared by its tenants' clients
        self.liveness = Liveness(model, no_worker_grace_s) if liveness is None else liveness

    def with_tenant(self, tenant: str | None) -> AsyncClient:
        """A client for `tenant` over this one's connection pool and result waits (one poller and one
        subscription for every tenant: they wait on tenant-scoped ids); closing it leaves both open."""
        return AsyncClient(model=self.model, redis=self.redis, broker=self.broker, track_submitted=self.track_submitted,
                           submitted_ttl_s=self.submitted_ttl_s, poll_min_s=self._poll[0],
                           poll_max_s=self._poll[1], tenant=tenant, wait_replicas=self.wait_replicas,
                           poller=self.poller, liveness=self.liveness)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def queue_for(self, request: Any = None, *, backfill: bool = False) -> str:
        """The queue this client's requests go to (online, or backfill)."""
        return queue_name(self.model, backfill=backfill)

    async def _push(self, messages: list[Message], max_queued: int | None = None) -> None:
        if isinstance(self.broker, AmqpPublisher):
            await asyncio.to_thread(self.broker.publish, messages)
            return
        pipe = self.broker.pipeline(transaction=False)
        queue_commands(pipe, messages, self.wait_replicas, max_queued)
        check_pushed(await scripts.execute_async(pipe), self.wait_replicas, max_queued)

    async def _submit(self, items: list[tuple[str, Any]], queue: str, chunk_size: int,
                      expires: datetime | None, max_queued: int | None = None) -> None:
        """Claim, then push (see producer.Client.claim and IdConflict)."""
        messages = pack_messages(items, queue, chunk_size=chunk_size, expires=expires, tenant=self.scope.tenant)
        await self._submit_packed(items, messages, queue, chunk_size, expires, max_queued)

    async def _submit_packed(self, items: list[tuple[str, Any]], messages: list[Message], queue: str,
                             chunk_size: int, expires: datetime | None, max_queued: int | None) -> None:
        """Submit prepared requests whose messages are packed (producer.Client._submit_packed)."""
        if one_call(items, messages, self.broker, self.redis):  # one request: claim and push in one call
            await self._claim_push(items[0], messages[0], max_queued)
            return
        claims = await self._claim_checked(items, queue)
        await self._send(items, claims, messages, queue, chunk_size, expires, max_queued)

    async def _claim_push(self, item: tuple[str, Any], message: Message, max_queued: int | None) -> None:
        """Claim and queue one request in one round trip (producer.Client._claim_push)."""
        pipe = self.redis.pipeline(transaction=False)
        claim_push_command(pipe, item, message, self.submitted_ttl_s if self.track_submitted else None,
                           self.wait_replicas, max_queued)
        try:
            replies = await scripts.execute_async(pipe)
        except redis.exceptions.RedisError as exc:
            raise (store_full(exc) or exc) from exc
        check_claim_push(replies, self.scope.caller(item[0]), self.wait_replicas, max_queued)

    async def _claim_checked(self, items: list[tuple[str, Any]], queue: str) -> Claims:
        """Claim the ids (producer.Client._claim_checked): StoreFull, IdConflict (markers taken back)."""
        pipe = self.redis.pipeline(transaction=False)
        claim_commands(pipe, items, queue, self.submitted_ttl_s if self.track_submitted else None)
        try:
            claims = read_claims(items, await scripts.execute_async(pipe))
        except redis.exceptions.RedisError as exc:
            raise (store_full(exc) or exc) from exc
        if claims.conflicts:
            await self.release(claims.marked)
            raise conflict_error([self.scope.caller(w) for w in claims.conflicts])
        return claims

    async def release(self, ids: list[str]) -> None:
        """Take back submitted markers a claim wrote for requests that are not queued after all."""
        if ids:
            await self.redis.delete(*[submitted_key(rid) for rid in ids])

    async def _send(self, items: list[tuple[str, Any]], claims: Claims, messages: list[Message], queue: str,
                    chunk_size: int, expires: datetime | None, max_queued: int | None) -> None:
        """Push what the claims leave to queue (producer.Client._send)."""
        todo = plan_submit(items, claims, messages, queue, chunk_size, expires, self.scope.tenant)
        if not todo:
            return
        try:
            await self._push(todo, max_queued)
        except Exception as exc:
            full = store_full(exc)
            if (isinstance(exc, Busy) or refused_whole(exc) or nothing_sent(exc)) and claims.marked:
                # nothing queued: take the markers back (see producer.Client._submit)
                try:
                    await self.release(claims.marked)
                except Exception as gone:  # noqa: BLE001 - the push's error is the one to raise
                    log.warning("could not take back %d submitted marker(s) after a failed push: %s",
                                len(claims.marked), gone)
            if full is not None:
                raise full from exc
            raise

    async def submit(
        self, request: Any, *, backfill: bool = False, deadline_s: float | None = None, validate: bool = True,
        max_queued: int | None = None,
    ) -> str:
        """Validate and queue one request; returns its id (see producer.Client.submit)."""
        item = prepare_request(request, self.model, validate=validate)
        await self._submit(self.scope.wire_items([item]), self.queue_for(backfill=backfill), 1,
                           deadline_to_expires(deadline_s), max_queued)
        return item[0]

    async def submit_many(
        self,
        requests: Iterable[Any],
        *,
        backfill: bool = False,
        chunk_size: int = 1,
        deadline_s: float | None = None,
        validate: bool = True,
        max_queued: int | None = None,
    ) -> list[str]:
        """Validate all, queue all in one round trip; ids in input order (see Client.submit_many)."""
        items = prepare_many(requests, self.model, validate=validate)
        expires = deadline_to_expires(deadline_s)
        if items:
            await self._submit(self.scope.wire_items(items), self.queue_for(backfill=backfill), chunk_size, expires,
                               max_queued)
        return [rid for rid, _ in items]

    async def cancel(self, ids: Iterable[str]) -> list[str]:
        """Cancel requests, as `Client.cancel` (one round trip); returns the ids with no answer yet."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        cancel_commands(pipe, [self.scope.wire(rid) for rid in ids], self.submitted_ttl_s)
        return unanswered(ids, await pipe.execute())

    async def lookup_many(self, ids: Iterable[str]) -> dict[str, tuple[State, dict[str, Any] | None]]:
        """id -> (its state now, its stored answer or None), with ONE MGET (no waiting)."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return {}
        wire = [self.scope.wire(rid) for rid in ids]
        got = split_state(wire, await self.redis.mget(state_keys(wire)))
        return {rid: (state_of(*got[w]), self.scope.back(parse_answer(got[w][0]), w))
                for rid, w in zip(ids, wire, strict=True)}

    async def lookup(self, request_id: str) -> tuple[State, dict[str, Any] | None]:
        """(state, stored answer or None) of one id now (one MGET); the HTTP GET route's read."""
        return (await self.lookup_many([request_id]))[request_id]

    async def status(self, request_id: str) -> RequestStatus:
        """The state now: "answered", "pending", "no_worker", "expired" or "unknown" (see
        producer.client; one MGET, and for a pending id the beats when the newest known is too old)."""
        state = (await self.lookup(request_id))[0]
        if state == "pending" and await self.liveness.absent_async(self.redis) is not None:
            return "no_worker"
        return state

    async def is_submitted(self, request_id: str) -> bool:
        """True while a tracked submission is pending (submitted, not answered yet: "pending" or
        "no_worker"); False once answered or expired, and for unknown ids. See `status`."""
        return await self.status(request_id) in ("pending", "no_worker")

    async def _check(self) -> None:
        """A wait's liveness check (NoWorker); a busy pool skips it (the next one reads)."""
        try:
            await self.liveness.check_async(self.redis)
        except Busy:
            pass

    async def _wait(self, wire: list[str], timeout_s: float | None) -> dict[str, Any]:
        """The poller's wait with the liveness check; on NoWorker the ids are read once more (an
        answer stored meanwhile is returned, never NoWorker), what was read goes in its `done` (raw)."""
        try:
            return await self.poller.wait(wire, timeout_s, self._check)
        except NoWorker as e:
            got = split_state(wire, await self.redis.mget(state_keys(wire)))
            raws = {w: EXPIRED if state_of(raw, marker) == "expired" else raw for w, (raw, marker) in got.items()}
            if all(v is not None for v in raws.values()):
                return raws
            e.done = {w: v for w, v in raws.items() if v is not None}
            raise

    async def _one(self, request_id: str, timeout_s: float | None, parse: Any) -> Any:
        timeout_s = check_timeout(timeout_s)
        wire = self.scope.wire(request_id)
        raw = (await self._wait([wire], timeout_s))[wire]
        if raw is EXPIRED:
            raise result_expired_error(request_id)
        value = parse(raw)
        if value is None:
            raise TimeoutError(f"no result for {request_id!r} after {timeout_s} s")
        return self.scope.back(value, wire)

    async def _many(self, ids: Iterable[str], timeout_s: float | None, parse: Any, expired: Any) -> dict[str, Any]:
        timeout_s = check_timeout(timeout_s)
        wire = {rid: self.scope.wire(rid) for rid in ids}
        try:
            raws = await self._wait(list(wire.values()), timeout_s)
        except NoWorker as e:  # its answers read, parsed, by the caller's ids
            e.done = {rid: self.scope.back(expired(w) if e.done[w] is EXPIRED else parse(e.done[w]), w)
                      for rid, w in wire.items() if w in e.done}
            raise
        return {rid: self.scope.back(expired(w) if raws[w] is EXPIRED else parse(raws[w]), w)
                for rid, w in wire.items()}

    async def result(self, request_id: str, timeout_s: float | None = None) -> RowResult:
        """Await one RowResult; TimeoutError after timeout_s; ResultExpired (at once) when its
        answer has expired from the result store; NoWorker once no worker of the model has beaten
        for no_worker_grace_s."""
        return await self._one(request_id, timeout_s, parse_meta)

    async def answer(self, request_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Await one product answer (a SystemOne answer, else the RowResult dict); TimeoutError /
        ResultExpired as `result`."""
        return await self._one(request_id, timeout_s, parse_answer)

    async def results_many(self, ids: Iterable[str], timeout_s: float | None = None) -> dict[str, RowResult | None]:
        """Await many RowResults (shared MGET polls); an expired id maps to an error RowResult of
        type "result_expired", ids without a result after timeout_s to None."""
        return await self._many(ids, timeout_s, parse_meta, expired_row)

    async def answers_many(
        self, ids: Iterable[str], timeout_s: float | None = None
    ) -> dict[str, dict[str, Any] | None]:
        """As results_many, but the product answers (an expired id: the error RowResult dict)."""
        return await self._many(ids, timeout_s, parse_answer, expired_answer)

    async def ping(self) -> bool:
        """True when Redis answers; raises redis.ConnectionError when it does not."""
        return bool(await self.redis.ping())

    async def aclose(self) -> None:
        """Stop the poller (one this client made) and release the connection pools (those it made)."""
        if self._owns_poller:
            await self.poller.aclose()
        if self._owns_redis:
            await self.redis.aclose()
        if self._owns_broker:
            if isinstance(self.broker, AmqpPublisher):
                self.broker.close()
            else:
                await self.broker.aclose()
