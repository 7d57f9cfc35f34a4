"""A fleet over two Redis cells (vela2.wire.cells, producer.cells), each a real redis-server with a
fake worker of its own: requests land in their id's cell, a job's lines stay in its cell, status and
job listings merge, and a cell that is down stalls only its own ids."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from producer import AsyncCellsClient, CellsClient, CellUnavailable
from producer import status as status_cli
from producer.jobs import job_lines, list_jobs, submit_job
from producer.testing.fake_worker import FakeWorker
from stack.harness import RedisServer
from vela2.api.schemas import Status
from vela2.wire.cells import Cell, CellMap, save_cells
from vela2.wire.keys import job_ids_key, job_key, queue_name, result_key

MODEL = "vela2-demo"


def row(rid: str) -> dict:
    return {"id": rid, "task": "choice:boolq", "text": f"text of {rid}",
            "questions": [{"question": "Is it?", "options": ["yes", "no"]}]}


@pytest.fixture
def cells(redis_server_factory: Callable[..., RedisServer], tmp_path: Path) -> Iterator[tuple[list[RedisServer], Path]]:
    servers = [redis_server_factory(), redis_server_factory()]
    path = tmp_path / "cells.json"
    save_cells(CellMap.even([Cell(n, s.url()) for n, s in zip("ab", servers, strict=True)]), path)
    yield servers, path
    for s in servers:
        s.stop()


def _workers(servers: list[RedisServer]) -> list[FakeWorker]:
    return [FakeWorker(s.url(), model=MODEL).start() for s in servers]


def test_each_request_is_queued_and_answered_in_its_ids_cell_only(cells):
    servers, path = cells
    workers = _workers(servers)
    try:
        with CellsClient(path, model=MODEL) as client:
            ids = client.submit_many([row(f"r-{i}") for i in range(200)])
            got = client.results_many(ids, timeout_s=30)
            assert [got[i].status for i in ids] == [Status.ok] * 200
            held = [{i for i in ids if s.client().exists(result_key(i))} for s in servers]
            assert held[0] and held[1] and not held[0] & held[1] and held[0] | held[1] == set(ids)
            for k in range(len(servers)):  # the map, not chance, put each one there
                assert held[k] == {i for i in ids if client.map.cell_of(i) == k}
            assert client.result("r-7", timeout_s=5).id == "r-7" and client.status("r-7") == "answered"
            assert client.ping() == {"a": True, "b": True}
            for w in workers:
                w.pause()
            late = client.submit(row("late"))
            with pytest.raises(TimeoutError) as waited:  # a wait that runs out is a timeout, not a cell down
                client.result(late, timeout_s=0.2)
            assert not isinstance(waited.value, CellUnavailable)
            assert client.results_many([late], timeout_s=0.2) == {late: None}
    finally:
        for w in workers:
            w.stop()


def test_a_jobs_record_lines_and_results_stay_in_one_cell_and_listing_merges(cells):
    servers, path = cells
    workers = _workers(servers)
    try:
        with CellsClient(path, model=MODEL) as client:
            jobs = []
            while len({client.map.cell_of(j) for j in jobs}) < 2:  # a job in each cell
                lines = [json.dumps(row(f"j{len(jobs)}-{n}")).encode() for n in range(30)]
                jobs.append(submit_job(client, lines).id)
            for job in jobs:
                home = servers[client.map.cell_of(job)].client()
                other = servers[1 - client.map.cell_of(job)].client()
                out = list(job_lines(client, job, timeout_s=30))
                assert len(out) == 30 and all(ok for _, ok in out)
                assert home.exists(job_key(job), job_ids_key(job)) == 2
                assert other.exists(job_key(job), job_ids_key(job)) == 0
                wire = [k.decode() for k in home.scan_iter(match=f"celery-task-meta-{job}#*")]
                assert len(wire) == 30 and not list(other.scan_iter(match=f"celery-task-meta-{job}#*"))
            assert {j.id for j in list_jobs(client)} == set(jobs)
    finally:
        for w in workers:
            w.stop()


def test_a_backfill_over_cells_queues_each_row_in_its_cell_and_resumes_after_a_cell_outage(cells, tmp_path):
    from producer.backfill import RedisUnavailable, run_backfill
    from producer.backfill import main as backfill_main

    servers, path = cells
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(row(f"b-{i}")) + "\n" for i in range(60)))
    cell_map = CellsClient(path, model=MODEL).map
    servers[1].stop()  # cell b down from the start: its rows cannot be queued; the run gives up, resumable
    workers = _workers(servers[:1])
    try:
        with pytest.raises(RedisUnavailable, match=r"cell b \(redis:.*\) is unavailable"):  # ridden out, then given up
            run_backfill(inp, out, cells=path, model=MODEL, window=8, chunk_size=4, poll_s=0.01, redis_timeout_s=0.5)
        servers[1].start()
        workers += _workers(servers[1:])
        assert backfill_main([str(inp), str(out), "--cells", str(path), "--model", MODEL, "--window", "8",
                              "--chunk-size", "4", "--poll-s", "0.01"]) == 0
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        assert sorted(x["id"] for x in lines) == sorted(f"b-{i}" for i in range(60))  # each once, all answered
        assert all(x["status"] == "ok" for x in lines)
        for k, server in enumerate(servers):  # answered in the cell its id hashes to, nowhere else
            held = {i for i in (x["id"] for x in lines) if server.client().exists(result_key(i))}
            assert held == {x["id"] for x in lines if cell_map.cell_of(x["id"]) == k}
        assert backfill_main([str(inp), str(out), "--cells", str(path), "--redis", servers[0].url()]) == 2
    finally:
        for w in workers:
            w.stop()


def test_status_merges_every_cells_queues_and_names_a_cell_that_is_down(cells):
    servers, path = cells
    with CellsClient(path, model=MODEL) as client:  # no worker: everything waits in its cell
        ids = client.submit_many([row(f"q-{i}") for i in range(60)])
    per_cell = [sum(1 for i in ids if CellMap.even([Cell("a", "redis://x"), Cell("b", "redis://y")]).cell_of(i) == k)
                for k in range(2)]
    depths = [s.client().llen(queue_name(MODEL)) for s in servers]
    assert depths == per_cell and all(depths)
    out = io.StringIO()
    with redirect_stdout(out):
        assert status_cli.main(["--cells", str(path), "--json"]) == 0
    merged = json.loads(out.getvalue())
    assert merged["models"][MODEL]["queues"]["online"] == 60
    assert [c["up"] for c in merged["cells"]] == [True, True]
    servers[1].stop()
    out = io.StringIO()
    with redirect_stdout(out):
        assert status_cli.main(["--cells", str(path)]) == status_cli.EXIT_REDIS_UNAVAILABLE
    screen = out.getvalue()
    assert "cell b" in screen and "DOWN" in screen and f"online {depths[0]:,}" in screen


def test_a_cell_that_is_down_stalls_only_its_own_ids(cells):
    servers, path = cells
    workers = _workers(servers[:1])  # cell a answers; cell b will be down
    servers[1].stop()
    try:
        with CellsClient(path, model=MODEL) as client:
            rows = [row(f"d-{i}") for i in range(100)]
            in_b = [r["id"] for r in rows if client.map.cell_of(r["id"]) == 1]
            in_a = [r["id"] for r in rows if client.map.cell_of(r["id"]) == 0]
            with pytest.raises(CellUnavailable) as err:
                client.submit_many(rows)
            assert sorted(err.value.ids) == sorted(in_b) and "cell b" in str(err.value)
            assert sorted(err.value.done["queued"]) == sorted(in_a)
            with pytest.raises(CellUnavailable) as err:
                client.results_many([r["id"] for r in rows], timeout_s=30)
            assert sorted(err.value.ids) == sorted(in_b)
            assert {i: v.status for i, v in err.value.done.items()} == dict.fromkeys(in_a, Status.ok)
            assert client.result(in_a[0], timeout_s=5).status == Status.ok
            with pytest.raises(CellUnavailable, match="cell b"):
                client.result(in_b[0], timeout_s=5)
            assert client.ping() == {"a": True, "b": False}
            servers[1].start()  # back: the ids it missed are submitted again and answered there
            workers += _workers(servers[1:])
            assert client.submit_many([r for r in rows if r["id"] in in_b]) == in_b
            assert all(v.status == Status.ok for v in client.results_many(in_b, timeout_s=30).values())
    finally:
        for w in workers:
            w.stop()


def test_after_a_cell_is_added_results_written_before_stay_readable(cells, redis_server_factory, tmp_path):
    servers, path = cells
    workers = _workers(servers)
    try:
        with CellsClient(path, model=MODEL) as client:
            ids = client.submit_many([row(f"m-{i}") for i in range(150)])
            assert all(v is not None for v in client.results_many(ids, timeout_s=30).values())
            old = client.map
        third = redis_server_factory()
        workers += _workers([third])
        bigger = old.with_cell(Cell("c", third.url()))
        moved = [i for i in ids if bigger.cell_of(i) == 2]
        assert moved  # a third of the slots moved to the new, empty cell
        with CellsClient(bigger, model=MODEL) as client:
            assert client.status(moved[0]) == "answered"  # found in the cell that held it before
            got = client.results_many(ids, timeout_s=5)
            assert all(got[i] is not None and got[i].status == Status.ok for i in ids)
            new = client.submit_many([row(f"n-{i}") for i in range(60)])  # new ids go by the new map
            assert all(v is not None for v in client.results_many(new, timeout_s=30).values())
            assert any(bigger.cell_of(i) == 2 for i in new)
            assert all(third.client().exists(result_key(i)) for i in new if bigger.cell_of(i) == 2)
        third.stop()
    finally:
        for w in workers:
            w.stop()


def test_the_async_client_routes_waits_on_every_cell_at_once_and_isolates_a_down_cell(cells):
    servers, path = cells
    workers = _workers(servers[:1])

    async def go() -> None:
        async with AsyncCellsClient(path, model=MODEL) as client:
            ids = [f"x-{i}" for i in range(80)]
            in_a = [i for i in ids if client.map.cell_of(i) == 0]
            await client.submit_many([row(i) for i in in_a])
            assert all(v.status == Status.ok for v in (await client.results_many(in_a, timeout_s=30)).values())
            servers[1].stop()
            with pytest.raises(CellUnavailable) as err:
                await client.submit_many([row(i) for i in ids])
            assert sorted(err.value.ids) == sorted(set(ids) - set(in_a))
            assert (await client.answer(in_a[0], timeout_s=5))["status"] == "ok"
            assert await client.ping() == {"a": True, "b": False}
            tenant = client.with_tenant("acme")  # routed by the scoped id "acme/<id>"
            mine = next(i for i in ids if client.map.cell_of(f"acme/{i}") == 0)
            await tenant.submit(row(mine))
            assert (await tenant.result(mine, timeout_s=30)).id == mine
            assert servers[0].client().exists(result_key(f"acme/{mine}"))

    try:
        asyncio.run(go())
    finally:
        for w in workers:
            w.stop()
