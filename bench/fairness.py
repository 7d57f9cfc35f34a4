"""Fair share across tenants (issue 38, point 3): tenant B's single requests while tenant A keeps
--backlog requests queued, against B alone on an idle worker, same run.

    python -m bench.fairness --out bench/results/cpu-fairness.json

One redis-server and one demo worker (CPU, the worker's default settings) for the whole run. Arms:
- `idle`: B's SystemOne requests alone, open loop at --rate requests/s for --duration-s.
- `backlog`: the same while a feeder process (Client(tenant="A").submit_many) keeps A's queued
  messages at or over --backlog (read with vela2.wire.fleet.tenant_depths every 0.1 s; the process at
  nice 10, as a deployment's producers run on other machines than its workers).
- `backlog_full_batches`: the same on a worker started with --fair-batch-ms 0 (fair order only,
  batches up to max_batch_tokens): what the short batches buy, and what they cost A.
- `backlog_one_fifo`: the same backlog from a keyless A, and B keyless too: both in the queue's one
  FIFO list, as every tenant was before fair share (B's requests wait behind A's whole backlog; a
  request not answered within --timeout-s counts as lost in the p99).
Latency is each request's due time to its answer, p50 / p99 from producer.loadtest's open loop;
the goal is B's p99 under the backlog within 2x of B's p99 idle. `a_answered_per_s`: A's answers a
second over each backlog arm (the price of B's latency).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis as redis_lib

from bench.queue_bench import bench_redis, cpu_checkpoint
from bench.report import header, write_report
from producer.client import Client
from producer.loadtest.openloop import Plan, Target, run_point
from producer.loadtest.report import summarize
from producer.loadtest.workload import requests
from stack.harness import WorkerProcess
from vela2.wire import fleet, keys

log = logging.getLogger("bench.fairness")
MODEL = "vela2-demo"
TOP_UP = 250  # requests the feeder queues at once when A's queue is under the backlog (small: no CPU bursts)
FEEDER_NICE = 10  # the feeder yields the CPU to the worker: a deployment's producers run on other machines


class Feeder:
    """Keeps `tenant`'s queued messages (None: the queue's own list) at or over `backlog`, from a
    process of its own (building thousands of messages would otherwise take the measuring client's
    interpreter lock)."""

    def __init__(self, url: str, tenant: str | None, backlog: int, prefix: str):
        ctx = mp.get_context("spawn")
        self._stop, self._ready, self._out = ctx.Event(), ctx.Event(), ctx.Queue()
        self._proc = ctx.Process(target=_feed, args=(url, tenant, backlog, prefix, self._stop, self._ready,
                                                     self._out), daemon=True)
        self.url, self.tenant = url, tenant

    def fill(self) -> Feeder:
        """Queue up to the backlog (returns once it is there), then keep it there."""
        self._proc.start()
        if not self._ready.wait(300):
            raise RuntimeError("the feeder did not fill the backlog within 300 s")
        return self

    def stop(self) -> dict[str, Any]:
        """Stop feeding and drop what is still queued (the next arm starts from an empty queue)."""
        self._stop.set()
        got = self._out.get(timeout=60)
        self._proc.join(30)
        r = redis_lib.Redis.from_url(self.url)
        r.delete(keys.tenant_list(keys.online_queue(MODEL), self.tenant))
        r.close()
        return got


def _feed(url: str, tenant: str | None, backlog: int, prefix: str, stop: Any, ready: Any, out: Any) -> None:
    """The feeder process: top the queue up every 0.1 s; reports what it queued and the depths it saw."""
    os.nice(FEEDER_NICE)
    client = Client(model=MODEL, redis_url=url, tenant=tenant, track_submitted=False)
    source = requests("systemone", MODEL, prefix)
    q = keys.online_queue(MODEL)
    queued, depths = 0, []

    def depth() -> int:
        if tenant is None:
            return fleet.queue_depths(client.redis, [q])[q]
        return fleet.tenant_depths(client.redis, [q])[q].get(tenant, 0)

    first = True
    while first or not stop.wait(0.1):
        while (d := depth()) < backlog:
            n = min(TOP_UP, backlog - d + TOP_UP // 2)
            client.submit_many([next(source) for _ in range(n)], validate=False)
            queued += n
        if first:
            ready.set()
            first = False
        else:
            depths.append(d)
    out.put({"queued_total": queued, "min_depth": min(depths, default=0),
             "median_depth": sorted(depths)[len(depths) // 2] if depths else 0})


def answered(url: str, tenant: str | None) -> int:
    """Results stored under `tenant`'s ids (keyless: ids `a-*`)."""
    r = redis_lib.Redis.from_url(url)
    n = sum(1 for _ in r.scan_iter(match=keys.result_key(keys.scoped_id(tenant, "a-*")), count=10_000))
    r.close()
    return n


def point(url: str, tag: str, tenant: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """B's open-loop point at --rate."""
    plan = Plan(Target(MODEL, redis_url=url, tenant=tenant, timeout_s=args.timeout_s), "systemone", f"{tag}-",
                args.seed, args.rate, 1, 0.0, args.duration_s, time.time() + 1.0)
    return summarize(run_point(plan, 1), args.rate, args.duration_s)


def backlog_arm(url: str, arm: str, tenants: tuple[str | None, str | None], args: argparse.Namespace) -> dict[str, Any]:
    """B's point while A's backlog is kept, and A's answers a second over it."""
    feeder = Feeder(url, tenants[0], args.backlog, f"a-{arm}-").fill()
    before, t0 = answered(url, tenants[0]), time.monotonic()
    got = point(url, arm, tenants[1], args)
    a_rate = (answered(url, tenants[0]) - before) / (time.monotonic() - t0)
    fed = feeder.stop()
    time.sleep(2.0)  # the worker finishes what it holds of A's before the next arm
    return {**got, "feeder": fed, "a_answered_per_s": round(a_rate, 1)}


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    checkpoint, extra = cpu_checkpoint("demo", Path(args.cache_dir))
    out: dict[str, Any] = {}
    with bench_redis(work / "redis") as (url, _, _):
        worker = WorkerProcess.start(url, checkpoint, work / "worker.log", name="fair", device="cpu", **extra)
        try:
            worker.wait_ready()
            point(url, "warm", "B", args)  # first batches of every shape
            out["idle"] = point(url, "idle", "B", args)
            for arm, tenants in (("backlog", ("A", "B")), ("backlog_one_fifo", (None, None))):
                out[arm] = backlog_arm(url, arm, tenants, args)
        finally:
            worker.terminate()
        # fair order alone, batches up to max_batch_tokens: what the short batches buy
        worker = WorkerProcess.start(url, checkpoint, work / "worker-full.log", name="full", device="cpu",
                                     fair_batch_ms=0, **extra)
        try:
            worker.wait_ready()
            out["backlog_full_batches"] = backlog_arm(url, "full", ("A", "B"), args)
        finally:
            worker.terminate()
    idle = out["idle"]["latency_ms"]["p99"]
    for arm in ("backlog", "backlog_full_batches", "backlog_one_fifo"):
        out[arm]["p99_ratio"] = round(out[arm]["latency_ms"]["p99"] / idle, 2)
        log.info("%s: B p99 %.1f ms (idle %.1f ms): %.2fx", arm, out[arm]["latency_ms"]["p99"], idle,
                 out[arm]["p99_ratio"])
    out["goal"] = {"p99_ratio": 2.0, "met": out["backlog"]["p99_ratio"] <= 2.0}
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__.splitlines()[0])
    ap.add_argument("--backlog", type=int, default=10_000, help="tenant A's queued requests, kept")
    ap.add_argument("--rate", type=float, default=5.0, help="tenant B's SystemOne requests/s, open loop")
    ap.add_argument("--duration-s", type=float, default=30.0)
    ap.add_argument("--timeout-s", type=float, default=60.0, help="B's wait for one answer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "vela2-bench"))
    ap.add_argument("--out", default="bench/results/cpu-fairness.json")
    args = ap.parse_args(argv)
    report = header("bench.fairness", argv)
    with tempfile.TemporaryDirectory(prefix="vela2-fairness-") as tmp:
        report.update(run(args, Path(tmp)))
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
