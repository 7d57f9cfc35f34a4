"""Clients over many Redis cells (vela2.wire.cells): each request goes to the cell its id hashes to.

    client = CellsClient("cells.json", model="vela2-demo")   # or CellsClient(load_cells(path))
    ids = client.submit_many(rows)                            # each row to its id's cell
    results = client.results_many(ids, timeout_s=30)          # each read from its id's cell

`CellsClient` and `AsyncCellsClient` take and answer what producer.Client / AsyncClient do, over
one such client per cell (each with its own connection pool). Reads follow the slot map's
`previous` assignment: an id its current cell does not know is read from the cell that held its slot
before the last move, so results written before a cell was added stay readable for their TTL.

A cell that does not answer (connection refused, or no connection within CONNECT_TIMEOUT_S) stalls
only the ids it holds: a submit queues the requests of the other cells, then raises
vela2.errors.CellUnavailable naming the cell and the ids it did not queue (submit them again: a
submit is idempotent by id); a many-read raises it with the other cells' answers in `done`. Across
cells, a submit first claims every id in every cell, so an IdConflict in one queues nothing anywhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import redis.exceptions

from producer.aio import AsyncClient
from producer.client import DEFAULT_MODEL, Client, RequestStatus
from producer.prepare import pack_messages, prepare_many, prepare_request
from producer.scope import Scope
from producer.submitting import Claims, release_quietly
from vela2.api.schemas import RowResult
from vela2.errors import CellUnavailable
from vela2.wire.cells import CellMap, load_cells
from vela2.wire.connections import async_redis_client, redis_client
from vela2.wire.keys import queue_name
from vela2.wire.messages import Message, deadline_to_expires
from vela2.wire.results import State

CONNECT_TIMEOUT_S = 2.0  # a cell whose Redis does not accept a connection this fast counts as down
# What "a cell is down" raises: redis-py's connection and socket-timeout errors. Not OSError: a wait's
# own TimeoutError (an OSError) is the caller's answer, never a cell that is down.
DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def _map(cells: CellMap | str | Path) -> CellMap:
    return cells if isinstance(cells, CellMap) else load_cells(cells)


class _Routing:
    """What both clients share: the map, the tenant's scope and which cell holds which ids."""

    map: CellMap
    scope: Scope

    @staticmethod
    def _home(by_cell: dict[int, list[str]]) -> tuple[int, list[str]]:
        """The cell of a one-id read plan (`_read_cells`) and its ids: a moved id leaves an empty list
        behind in the cell it moved to."""
        (index, rids), = ((i, rids) for i, rids in by_cell.items() if rids)
        return index, rids

    def _down(self, failed: dict[int, BaseException], ids_of: dict[int, list[str]],
              done: dict[str, Any] | None = None) -> CellUnavailable:
        """One CellUnavailable for every cell in `failed` (named: the first; ids: all theirs)."""
        first = min(failed)
        ids = [self.scope.caller(w) for i in sorted(failed) for w in ids_of.get(i, [])]
        names = ", ".join(str(self.map.cells[i]) for i in sorted(failed))
        return CellUnavailable(names, ids, failed[first], done)

    def _plan(self, items: list[tuple[str, Any]], queue: str, chunk_size: int,
              expires: datetime | None) -> tuple[dict[int, list[tuple[str, Any]]], dict[int, list[Message]]]:
        """Prepared (wire id, request) items by cell, and each cell's messages (sizes checked here, first)."""
        groups: dict[int, list[tuple[str, Any]]] = {}
        for item in items:
            groups.setdefault(self.map.cell_of(item[0]), []).append(item)
        messages = {i: pack_messages(g, queue, chunk_size=chunk_size, expires=expires, tenant=self.scope.tenant)
                    for i, g in groups.items()}
        return groups, messages

    def _not_queued(self, failed: dict[int, BaseException],
                    groups: dict[int, list[tuple[str, Any]]]) -> CellUnavailable:
        """The CellUnavailable of a submit: the failed cells' ids, and in `done["queued"]` the others'."""
        queued = [self.scope.caller(w) for i, g in groups.items() if i not in failed for w, _ in g]
        return self._down(failed, {i: [w for w, _ in g] for i, g in groups.items()}, {"queued": queued})


class CellsClient(_Routing):
    """producer.Client over the cells of `cells` (a CellMap, or the path of its JSON file). The
    keywords are Client's (model, track_submitted, submitted_ttl_s, tenant, wait_replicas), applied
    to every cell's client; each cell's broker is the one its map entry names. `clients`: one Client
    per cell, in the map's order, made by the caller (over pools of its own) instead."""

    def __init__(self, cells: CellMap | str | Path, *, model: str = DEFAULT_MODEL,
                 clients: list[Client] | None = None, **client_kw: Any):
        self.map = _map(cells)
        self.model = model
        self.clients = clients if clients is not None else [
            Client(c.url, model=model, broker_url=c.broker_url,
                   redis=redis_client(c.url, socket_connect_timeout=CONNECT_TIMEOUT_S), **client_kw)
            for c in self.map.cells]
        if len(self.clients) != len(self.map.cells):
            raise ValueError(f"{len(self.clients)} clients for {len(self.map.cells)} cells")
        self.scope = self.clients[0].scope

    def __enter__(self) -> CellsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def queue_for(self, request: Any = None, *, backfill: bool = False) -> str:
        """The queue this client's requests go to in every cell (online, or backfill)."""
        return queue_name(self.model, backfill=backfill)

    def for_job(self, job_id: str) -> Client:
        """The client of the cell that holds bulk job `job_id` (its record, lines and results)."""
        return self.clients[self.map.cell_of(job_id)]

    def _submit(self, items: list[tuple[str, Any]], queue: str, chunk_size: int, expires: datetime | None,
                max_queued: int | None) -> None:
        """Claim every id in its cell (an IdConflict anywhere: nothing queued), then push per cell;
        requests of one cell go as that cell's client sends them (one request: one round trip)."""
        groups, messages = self._plan(items, queue, chunk_size, expires)
        if len(groups) == 1:
            (i, group), = groups.items()
            try:
                return self.clients[i]._submit_packed(group, messages[i], queue, chunk_size, expires, max_queued)
            except DOWN as exc:
                raise self._not_queued({i: exc}, groups) from exc
        claims: dict[int, Claims] = {}
        failed: dict[int, BaseException] = {}
        try:
            for i, group in groups.items():
                try:
                    claims[i] = self.clients[i]._claim_checked(group, queue)
                except DOWN as exc:
                    failed[i] = exc
        except Exception:
            for i, c in claims.items():
                release_quietly(self.clients[i].release, c.marked)
            raise
        for i, c in claims.items():
            try:
                self.clients[i]._send(groups[i], c, messages[i], queue, chunk_size, expires, max_queued)
            except DOWN as exc:
                failed[i] = exc
        if failed:
            raise self._not_queued(failed, groups)

    def submit(self, request: Any, *, backfill: bool = False, deadline_s: float | None = None, validate: bool = True,
               max_queued: int | None = None) -> str:
        """Validate and queue one request in its id's cell; returns its id (producer.Client.submit)."""
        item = prepare_request(request, self.model, validate=validate)
        self._submit(self.scope.wire_items([item]), self.queue_for(backfill=backfill), 1,
                     deadline_to_expires(deadline_s), max_queued)
        return item[0]

    def submit_many(self, requests: Iterable[Any], *, backfill: bool = False, chunk_size: int = 1,
                    deadline_s: float | None = None, validate: bool = True, max_queued: int | None = None) -> list[str]:
        """Validate all, then queue each in its id's cell (one round trip per cell); ids in input
        order (producer.Client.submit_many; `chunk_size` packs requests of one cell together)."""
        items = prepare_many(requests, self.model, validate=validate)
        if items:
            self._submit(self.scope.wire_items(items), self.queue_for(backfill=backfill), chunk_size,
                         deadline_to_expires(deadline_s), max_queued)
        return [rid for rid, _ in items]

    def _read_cells(self, ids: list[str], keep_down: bool = False) -> dict[int, list[str]]:
        """Cell -> the caller ids to read there: each id's cell, or the cell that held its slot before
        the last move when the current one does not know the id. A cell that is down: CellUnavailable,
        or with `keep_down` its ids stay with it (their read then fails alone)."""
        out: dict[int, list[str]] = {}
        moved: dict[int, list[str]] = {}
        for rid in ids:
            wire = self.scope.wire(rid)
            out.setdefault(self.map.cell_of(wire), []).append(rid)
            if self.map.previous_of(wire) is not None:
                moved.setdefault(self.map.cell_of(wire), []).append(rid)
        for i, rids in moved.items():
            try:
                states = self.clients[i].lookup_many(rids)
            except DOWN as exc:
                if keep_down:
                    continue
                raise CellUnavailable(str(self.map.cells[i]), rids, exc) from exc
            for rid, (state, _) in states.items():
                before = self.map.previous_of(self.scope.wire(rid))
                if state == "unknown" and before is not None:
                    out[i].remove(rid)
                    out.setdefault(before, []).append(rid)
        return out

    def _call(self, index: int, rids: list[str], method: str, *args: Any, **kw: Any) -> Any:
        """clients[index].method(*args, **kw); CellUnavailable (for `rids`) when the cell is down."""
        try:
            return getattr(self.clients[index], method)(*args, **kw)
        except DOWN as exc:
            raise CellUnavailable(str(self.map.cells[index]), rids, exc) from exc

    def _many(self, ids: Iterable[str], method: str, timeout_s: float | None) -> dict[str, Any]:
        """`method` (a many-read of Client) per cell in turn, timeout_s shared; CellUnavailable with
        the other cells' answers in `done` when a cell is down."""
        ids = list(dict.fromkeys(ids))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        got: dict[str, Any] = {}
        failed: dict[int, BaseException] = {}
        by_cell = self._read_cells(ids, keep_down=True)
        for i, rids in by_cell.items():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                got.update(getattr(self.clients[i], method)(rids, timeout_s=left))
            except DOWN as exc:
                failed[i] = exc
        if failed:
            raise self._down(failed, {i: [self.scope.wire(r) for r in rids] for i, rids in by_cell.items()}, got)
        return {rid: got[rid] for rid in ids}

    def _one(self, request_id: str, method: str, timeout_s: float | None) -> Any:
        index, rids = self._home(self._read_cells([request_id]))
        return self._call(index, rids, method, request_id, timeout_s)

    def cancel(self, ids: Iterable[str]) -> list[str]:
        """Cancel requests (producer.Client.cancel) in their cells; the ids with no answer yet."""
        ids = list(dict.fromkeys(ids))
        out: set[str] = set()
        for i, rids in self._read_cells(ids).items():
            out.update(self._call(i, rids, "cancel", rids))
        return [rid for rid in ids if rid in out]

    def lookup_many(self, ids: Iterable[str]) -> dict[str, tuple[State, dict[str, Any] | None]]:
        """id -> (state, stored answer or None) now, one MGET per cell (producer.Client.lookup_many)."""
        ids = list(dict.fromkeys(ids))
        got: dict[str, Any] = {}
        for i, rids in self._read_cells(ids).items():
            got.update(self._call(i, rids, "lookup_many", rids))
        return {rid: got[rid] for rid in ids}

    def lookup(self, request_id: str) -> tuple[State, dict[str, Any] | None]:
        """(state, stored answer or None) of one id now."""
        return self.lookup_many([request_id])[request_id]

    def status(self, request_id: str) -> RequestStatus:
        """"answered", "pending", "no_worker", "expired" or "unknown" in its cell (producer.Client.status:
        "no_worker" when no worker of that cell beats)."""
        index, rids = self._home(self._read_cells([request_id]))
        return self._call(index, rids, "status", request_id)

    def result(self, request_id: str, timeout_s: float | None = None) -> RowResult:
        """Wait for one RowResult in its cell (producer.Client.result)."""
        return self._one(request_id, "result", timeout_s)

    def answer(self, request_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for one product answer in its cell (producer.Client.answer)."""
        return self._one(request_id, "answer", timeout_s)

    def results_many(self, ids: Iterable[str], timeout_s: float | None = None) -> dict[str, RowResult | None]:
        """Wait for many results, each in its cell, timeout_s shared (producer.Client.results_many)."""
        return self._many(ids, "results_many", timeout_s)

    def answers_many(self, ids: Iterable[str], timeout_s: float | None = None) -> dict[str, dict[str, Any] | None]:
        """As results_many, the product answers (producer.Client.answers_many)."""
        return self._many(ids, "answers_many", timeout_s)

    def ping(self) -> dict[str, bool]:
        """Cell name -> whether its Redis answers now (never raises for a cell that is down)."""
        out = {}
        for cell, client in zip(self.map.cells, self.clients, strict=True):
            try:
                out[cell.name] = client.ping()
            except DOWN:
                out[cell.name] = False
        return out

    def close(self) -> None:
        """Close every cell's client."""
        for client in self.clients:
            client.close()


class AsyncCellsClient(_Routing):
    """producer.AsyncClient over the cells of `cells` (CellsClient's routing and errors, awaited;
    many-reads wait on every cell at once)."""

    def __init__(self, cells: CellMap | str | Path, *, model: str = DEFAULT_MODEL,
                 clients: list[AsyncClient] | None = None, **client_kw: Any):
        self.map = _map(cells)
        self.model = model
        self._owns = clients is None
        self.clients = clients if clients is not None else [
            AsyncClient(c.url, model=model, broker_url=c.broker_url,
                        redis=async_redis_client(c.url, socket_connect_timeout=CONNECT_TIMEOUT_S), **client_kw)
            for c in self.map.cells]
        self.scope = self.clients[0].scope

    def with_tenant(self, tenant: str | None) -> AsyncCellsClient:
        """The same cells' pools for `tenant` (AsyncClient.with_tenant per cell)."""
        return AsyncCellsClient(self.map, model=self.model, clients=[c.with_tenant(tenant) for c in self.clients])

    async def __aenter__(self) -> AsyncCellsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def queue_for(self, request: Any = None, *, backfill: bool = False) -> str:
        """The queue this client's requests go to in every cell (online, or backfill)."""
        return queue_name(self.model, backfill=backfill)

    async def _submit(self, items: list[tuple[str, Any]], queue: str, chunk_size: int, expires: datetime | None,
                      max_queued: int | None) -> None:
        """CellsClient._submit, awaited: claims everywhere first, then pushes; the cells at once."""
        groups, messages = self._plan(items, queue, chunk_size, expires)
        if len(groups) == 1:
            (i, group), = groups.items()
            try:
                return await self.clients[i]._submit_packed(group, messages[i], queue, chunk_size, expires,
                                                            max_queued)
            except DOWN as exc:
                raise self._not_queued({i: exc}, groups) from exc
        order = list(groups)
        got = await asyncio.gather(*(self.clients[i]._claim_checked(groups[i], queue) for i in order),
                                   return_exceptions=True)
        claims = {i: c for i, c in zip(order, got, strict=True) if isinstance(c, Claims)}
        failed: dict[int, BaseException] = {i: e for i, e in zip(order, got, strict=True) if isinstance(e, DOWN)}
        other = [e for e in got if isinstance(e, BaseException) and not isinstance(e, DOWN)]
        if other:
            await asyncio.gather(*(self.clients[i].release(c.marked) for i, c in claims.items()),
                                 return_exceptions=True)
            raise other[0]
        sent = await asyncio.gather(*(self.clients[i]._send(groups[i], c, messages[i], queue, chunk_size, expires,
                                                           max_queued) for i, c in claims.items()),
                                    return_exceptions=True)
        for i, e in zip(claims, sent, strict=True):
            if isinstance(e, DOWN):
                failed[i] = e
            elif isinstance(e, BaseException):
                raise e
        if failed:
            raise self._not_queued(failed, groups)

    async def submit(self, request: Any, *, backfill: bool = False, deadline_s: float | None = None,
                     validate: bool = True, max_queued: int | None = None) -> str:
        """Validate and queue one request in its id's cell; returns its id."""
        item = prepare_request(request, self.model, validate=validate)
        await self._submit(self.scope.wire_items([item]), self.queue_for(backfill=backfill), 1,
                           deadline_to_expires(deadline_s), max_queued)
        return item[0]

    async def submit_many(self, requests: Iterable[Any], *, backfill: bool = False, chunk_size: int = 1,
                          deadline_s: float | None = None, validate: bool = True,
                          max_queued: int | None = None) -> list[str]:
        """Validate all, then queue each in its id's cell; ids in input order."""
        items = prepare_many(requests, self.model, validate=validate)
        if items:
            await self._submit(self.scope.wire_items(items), self.queue_for(backfill=backfill), chunk_size,
                               deadline_to_expires(deadline_s), max_queued)
        return [rid for rid, _ in items]

    async def _read_cells(self, ids: list[str]) -> dict[int, list[str]]:
        """CellsClient._read_cells, awaited (a down cell's ids stay with it)."""
        out: dict[int, list[str]] = {}
        for rid in ids:
            out.setdefault(self.map.cell_of(self.scope.wire(rid)), []).append(rid)
        for i in list(out):
            moved = [rid for rid in out[i] if self.map.previous_of(self.scope.wire(rid)) is not None]
            if not moved:
                continue
            try:
                states = await self.clients[i].lookup_many(moved)
            except DOWN:
                continue
            for rid, (state, _) in states.items():
                before = self.map.previous_of(self.scope.wire(rid))
                if state == "unknown" and before is not None:
                    out[i].remove(rid)
                    out.setdefault(before, []).append(rid)
        return out

    async def _fan(self, ids: Iterable[str], method: str, *args: Any) -> dict[str, Any]:
        """`method(rids, *args)` of every cell's client at once, merged; CellUnavailable (with the
        others' answers in `done`) when a cell is down."""
        ids = list(dict.fromkeys(ids))
        by_cell = await self._read_cells(ids)
        order = list(by_cell)
        got = await asyncio.gather(*(getattr(self.clients[i], method)(by_cell[i], *args) for i in order),
                                   return_exceptions=True)
        merged: dict[str, Any] = {}
        failed: dict[int, BaseException] = {}
        for i, g in zip(order, got, strict=True):
            if isinstance(g, DOWN):
                failed[i] = g
            elif isinstance(g, BaseException):
                raise g
            else:
                merged.update(g if isinstance(g, dict) else dict.fromkeys(g, True))
        if failed:
            raise self._down(failed, {i: [self.scope.wire(r) for r in by_cell[i]] for i in failed}, merged)
        return merged

    async def cancel(self, ids: Iterable[str]) -> list[str]:
        """Cancel requests in their cells; the ids with no answer yet."""
        ids = list(dict.fromkeys(ids))
        left = await self._fan(ids, "cancel")
        return [rid for rid in ids if rid in left]

    async def lookup_many(self, ids: Iterable[str]) -> dict[str, tuple[State, dict[str, Any] | None]]:
        """id -> (state, stored answer or None) now, one MGET per cell."""
        ids = list(dict.fromkeys(ids))
        got = await self._fan(ids, "lookup_many")
        return {rid: got[rid] for rid in ids}

    async def lookup(self, request_id: str) -> tuple[State, dict[str, Any] | None]:
        """(state, stored answer or None) of one id now."""
        return (await self.lookup_many([request_id]))[request_id]

    async def status(self, request_id: str) -> RequestStatus:
        """"answered", "pending", "no_worker", "expired" or "unknown" in its cell."""
        index, rids = self._home(await self._read_cells([request_id]))
        try:
            return await self.clients[index].status(request_id)
        except DOWN as exc:
            raise CellUnavailable(str(self.map.cells[index]), rids, exc) from exc

    async def _one(self, request_id: str, method: str, timeout_s: float | None) -> Any:
        index, rids = self._home(await self._read_cells([request_id]))
        try:
            return await getattr(self.clients[index], method)(request_id, timeout_s)
        except DOWN as exc:
            raise CellUnavailable(str(self.map.cells[index]), rids, exc) from exc

    async def result(self, request_id: str, timeout_s: float | None = None) -> RowResult:
        """Await one RowResult in its cell."""
        return await self._one(request_id, "result", timeout_s)

    async def answer(self, request_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Await one product answer in its cell."""
        return await self._one(request_id, "answer", timeout_s)

    async def results_many(self, ids: Iterable[str], timeout_s: float | None = None) -> dict[str, RowResult | None]:
        """Await many RowResults, every cell at once; ids in the order given."""
        ids = list(dict.fromkeys(ids))
        got = await self._fan(ids, "results_many", timeout_s)
        return {rid: got[rid] for rid in ids}

    async def answers_many(self, ids: Iterable[str],
                           timeout_s: float | None = None) -> dict[str, dict[str, Any] | None]:
        """As results_many, the product answers."""
        ids = list(dict.fromkeys(ids))
        got = await self._fan(ids, "answers_many", timeout_s)
        return {rid: got[rid] for rid in ids}

    async def ping(self) -> dict[str, bool]:
        """Cell name -> whether its Redis answers now."""
        got = await asyncio.gather(*(c.ping() for c in self.clients), return_exceptions=True)
        return {cell.name: g is True for cell, g in zip(self.map.cells, got, strict=True)}

    async def aclose(self) -> None:
        """Close the cells' clients (their pools only when this client made them)."""
        for client in self.clients:
            await client.aclose()


def job_client(client: Client | CellsClient, job_id: str) -> Client:
    """The Client that holds bulk job `job_id`: `client` itself, or for a CellsClient its job's cell's."""
    return client.for_job(job_id) if isinstance(client, CellsClient) else client
