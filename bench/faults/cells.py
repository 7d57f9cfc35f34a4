"""A fleet over two Redis cells (vela2.wire.cells) while one cell goes down: producers submit through
producer.CellsClient, one real worker serves each cell. Cell b's redis-server (AOF) is stopped for
10 s (x scale) under load, then started again. Cell a keeps answering throughout; the producer
re-submits exactly the ids CellUnavailable names (a submit is idempotent by id) until b is back; every
request of both cells is answered, none twice."""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.faults.accounting import Tracker, drained
from bench.faults.context import MODEL, SETTLE_TIMEOUT_S, Suite, start_ready, stop_all, wait_until, worker_notes
from bench.faults.report import Outcome
from bench.faults.traffic import good_rows
from producer.cells import CellsClient
from vela2.errors import CellUnavailable
from vela2.wire.cells import Cell, CellMap


class CellsProducer(threading.Thread):
    """Submits rows in batches at a steady pace through a CellsClient; what CellUnavailable names as
    not queued is submitted again (backoff 0.1 s doubling to 2 s), the rest of the batch is done."""

    def __init__(self, cell_map: CellMap, rows: list[dict[str, Any]], *, per_s: float, batch: int = 10):
        super().__init__(daemon=True)
        self.client = CellsClient(cell_map, model=MODEL)
        self.rows, self.per_s, self.batch = rows, per_s, batch
        self.submitted: list[str] = []
        self.unavailable = 0  # CellUnavailable raised (each re-submitted what it named)
        self.first_error: str | None = None

    def run(self) -> None:
        for k in range(0, len(self.rows), self.batch):
            todo = self.rows[k : k + self.batch]
            backoff = 0.1
            while todo:
                try:
                    self.submitted += self.client.submit_many(todo)
                    todo = []
                except CellUnavailable as e:
                    self.unavailable += 1
                    self.first_error = self.first_error or str(e)[:300]
                    self.submitted += e.done.get("queued", [])
                    todo = [r for r in todo if r["id"] in set(e.ids)]
                    time.sleep(backoff)
                    backoff = min(2.0, backoff * 2)
            time.sleep(self.batch / self.per_s)
        self.client.close()


def scenario_cell_down(s: Suite, out: Outcome) -> None:
    """Two cells, a worker each; cell b down for 10 s (x scale) under load (module docstring)."""
    servers = [s.redis(aof=True), s.redis(aof=True)]
    cell_map = CellMap.even([Cell(name, r.url()) for name, r in zip("ab", servers, strict=True)])
    vis = s.visibility_for(2048)
    workers = [w for r in servers for w in start_ready(s, 1, r.url(), visibility_timeout_s=vis, max_buffered=8)]
    n = s.n(800, minimum=60)
    rows = good_rows("cell", n)
    trackers = [Tracker(r.url()) for r in servers]
    for k, tr in enumerate(trackers):
        tr.add([x["id"] for x in rows if cell_map.cell_of(x["id"]) == k])
    prod = CellsProducer(cell_map, rows, per_s=max(20.0, n / 15))
    prod.start()
    wait_until(lambda: len(prod.submitted) >= n // 4 and trackers[1].poll() < len(trackers[1].ids), 120,
               "a quarter submitted and cell b answering")
    outage = max(2.0, 10.0 * min(1.0, s.scale))
    servers[1].stop()
    t_down = time.monotonic()
    a_before = (trackers[0].poll(), trackers[0].answered())[1]
    time.sleep(outage)
    a_during = (trackers[0].poll(), trackers[0].answered())[1] - a_before
    servers[1].start()
    down_s = time.monotonic() - t_down
    prod.join(600)
    rcs = [r.client() for r in servers]
    done = [tr.wait(SETTLE_TIMEOUT_S, until=lambda rc=rc: drained(rc)) for tr, rc in zip(trackers, rcs, strict=True)]
    out.check("both cells answered everything and drained", all(done))
    out.check("cell a kept answering while cell b was down", a_during > 0, a_during)
    out.check("the producer was told which ids cell b could not take", prod.unavailable > 0, prod.first_error)
    out.check("both workers survived", all(w.alive() for w in workers))
    stop_all(workers, out)
    out.notes.update({
        "injected": f"cell b's redis-server stopped for {down_s:.1f} s under load; cell a untouched",
        "cells": cell_map.describe(),
        "requests_per_cell": [len(tr.ids) for tr in trackers],
        "cell_a_answers_while_b_down": a_during,
        "producer_submitted": len(set(prod.submitted)),
        "producer_cell_unavailable_errors": prod.unavailable,
        "producer_first_error": prod.first_error,
        "producer_policy": "re-submit exactly the ids CellUnavailable names, backoff 0.1 s -> 2 s",
        "visibility_timeout_s": vis,
        **worker_notes(workers),
    })
    for tr in trackers:
        out.add(tr)
        tr.close()
    out.check("every answer ok", out.answered_ok == out.requests, out.answered_ok)
