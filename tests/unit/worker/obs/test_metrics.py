"""Worker metrics without a process: the padding fraction follows the row layout, the endpoint binds
loopback unless told otherwise, every metric exported is in the docs' table (docs/operations/metrics.md)."""

from __future__ import annotations

import re
import urllib.request

from stack.harness import free_port
from vela2.wire.keys import online_queue
from worker.obs.metrics import Metrics


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_padding_fraction_follows_the_row_layout():
    assert Metrics().padded_tokens([100, 50, 50]) == 300
    assert Metrics(row_tokens=200).padded_tokens([100, 50, 50]) == 200  # one row of 200
    assert Metrics(row_tokens=120).padded_tokens([100, 50, 50]) == 2 * 120  # rows [100] and [50, 50]


def test_metrics_bind_loopback_unless_told_otherwise():
    m = Metrics()
    port = free_port()
    m.serve(port)
    try:
        assert m.server.server_address[0] == "127.0.0.1"
        assert "vela2_requests" in scrape(port)
    finally:
        m.server.shutdown()
        m.server.server_close()
    wide = Metrics()
    wide.serve(free_port(), "0.0.0.0")
    try:
        assert wide.server.server_address[0] == "0.0.0.0"
    finally:
        wide.server.shutdown()
        wide.server.server_close()


def test_every_metric_a_worker_exports_is_in_the_docs_table():
    """The metrics table of docs/operations/metrics.md names every family the registry yields (and nothing else)."""
    from pathlib import Path

    import fakeredis

    m = Metrics()
    m.describe_worker(model="vela2-demo", device="cpu", precision="fp32", redis=fakeredis.FakeRedis(),
                      queues=[online_queue("vela2-demo")])
    # as scraped: a counter family `x` is exposed as `x_total`
    exported = {f.name + "_total" if f.type == "counter" else f.name for f in m.registry.collect()}
    page = (Path(__file__).resolve().parents[4] / "docs" / "operations" / "metrics.md").read_text()
    table = page.split("<!-- metrics-table -->")[1]
    documented = set(re.findall(r"^\| `([a-z0-9_]+)", table, re.M))
    assert exported - documented == set(), "exported but not in the docs' table"
    gpu_only = {"vela2_gpu_memory_bytes"}  # its collector yields nothing on a CPU
    assert documented - exported - gpu_only == set(), "in the docs' table, not exported"
