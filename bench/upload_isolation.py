"""Bulk uploads apart from online requests in the HTTP route (issue 38, point 4): the open-loop
latency of POST /v1/system_one alone, then while --uploads batch uploads of --lines lines each run at
once, on the route of this checkout and (--before DIR) on the route of another checkout, same run.

    python -m bench.upload_isolation --out bench/results/cpu-upload-isolation.json
    python -m bench.upload_isolation --before .before --out bench/results/cpu-upload-isolation.json

One redis-server, the fake worker (producer.testing.FakeWorker: stub answers, thousands a second,
online before backfill) in a thread, one `python -m producer.http.app --no-auth` process per route
(`--uploads-per-tenant` = --uploads, so that every upload runs: the keyless caller is one tenant).
Latency is each request's due time to its answer (wait_s), p50 / p99 from producer.loadtest's open
loop at --rate requests/s for --duration-s; the uploads start together with the measured window.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.queue_bench import bench_redis
from bench.report import header, write_report
from producer.loadtest.openloop import Plan, Target, run_point
from producer.loadtest.report import summarize
from producer.testing.fake_worker import FakeWorker
from stack.harness import start_route

log = logging.getLogger("bench.upload_isolation")
MODEL = "vela2-demo"


def upload_body(lines: int, seed: int) -> bytes:
    """`lines` rows of a bulk upload (short texts, one question each)."""
    return "".join(json.dumps({"id": f"u{seed}-{i}", "task": "choice:boolq", "text": f"line {i} of upload {seed}",
                               "questions": [{"question": "Is it?", "options": ["yes", "no"]}]}) + "\n"
                   for i in range(lines)).encode()


def measure(base: str, tag: str, args: argparse.Namespace, bodies: list[bytes]) -> dict[str, Any]:
    """The open-loop point at --rate, with `bodies` uploaded at once as it starts (none: alone)."""
    uploads: list[dict[str, Any]] = []

    def upload(body: bytes) -> None:
        t0 = time.perf_counter()
        with httpx.Client(base_url=base, timeout=600) as http:
            r = http.post("/v1/batches", content=body)
        uploads.append({"status": r.status_code, "s": round(time.perf_counter() - t0, 2)})

    threads = [threading.Thread(target=upload, args=(b,)) for b in bodies]
    plan = Plan(Target(MODEL, http_url=base, timeout_s=120), "systemone", f"{tag}-", args.seed, args.rate, 1, 0.0,
                args.duration_s, time.time() + 1.0)
    for t in threads:
        t.start()
    point = summarize(run_point(plan, 1), args.rate, args.duration_s)
    for t in threads:
        t.join()
    return {**point, "uploads": uploads}


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    bodies = [upload_body(args.lines, k) for k in range(args.uploads)]
    out: dict[str, Any] = {"upload_mb": round(sum(map(len, bodies)) / 1e6, 1)}
    routes = [("after", None)] + ([("before", str(Path(args.before).resolve()))] if args.before else [])
    for name, before in routes:
        with bench_redis(work / f"redis-{name}") as (url, _, _):
            worker = FakeWorker(url, MODEL).start()
            extra = () if before else ("--uploads-per-tenant", str(args.uploads))  # (the old route has no such flag)
            proc, base = start_route(url, MODEL, work / f"route-{name}.log", "--no-auth", *extra, before=before)
            try:
                idle = measure(base, f"{name}-idle", args, [])
                loaded = measure(base, f"{name}-loaded", args, bodies)
            finally:
                proc.terminate()
                proc.wait(30)
                worker.stop()
        p99 = (idle["latency_ms"]["p99"], loaded["latency_ms"]["p99"])
        out[name] = {"idle": idle, "with_uploads": loaded, "p99_ratio": round(p99[1] / p99[0], 2)}
        log.info("%s: p99 %.1f ms alone, %.1f ms with %d uploads (%.2fx)", name, p99[0], p99[1], args.uploads,
                 p99[1] / p99[0])
    out["goal"] = {"p99_ratio": 2.0, "met": out["after"]["p99_ratio"] <= 2.0}
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench.upload_isolation", description=__doc__.splitlines()[0])
    ap.add_argument("--uploads", type=int, default=8)
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=20.0, help="SystemOne requests/s, open loop")
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--before", default=None, help="a checkout whose route is measured the same way")
    ap.add_argument("--out", default="bench/results/cpu-upload-isolation.json")
    args = ap.parse_args(argv)
    report = header("bench.upload_isolation", argv)
    with tempfile.TemporaryDirectory(prefix="vela2-uploads-") as tmp:
        report.update(run(args, Path(tmp)))
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
