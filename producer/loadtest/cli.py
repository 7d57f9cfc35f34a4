"""`vela2 loadtest`: open-loop Poisson load against a running deployment (producer.loadtest).

    vela2 loadtest --redis redis://HOST:6379/0 --model vela2-demo --loads 0.5,0.8,0.95
    vela2 loadtest --http https://scorer.example --model vela2-demo --rates 20,50 --workload systemone

prints one line per rate and writes every figure as JSON (--out)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any

from producer.client import DEFAULT_MODEL, DEFAULT_REDIS_URL
from producer.loadtest.openloop import Plan, Target, measure_capacity, run_point, run_sequential
from producer.loadtest.report import line, summarize
from producer.loadtest.workload import BUILTIN, requests
from vela2.cli import Parser
from vela2.wire.urls import add_url_arguments, mask_url, url_from_args

ENV_API_KEY = "VELA2_API_KEY"  # the key of --http (a key in argv is visible to every user of the host)
EXIT_LOST = 1  # some request got no answer within --timeout-s


def _floats(raw: str) -> list[float]:
    try:
        values = [float(v) for v in raw.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma list of numbers; got {raw!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"numbers > 0; got {raw!r}")
    return values


def _positive(kind: type) -> Any:
    def parse(raw: str) -> Any:
        try:
            value = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a number; got {raw!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0; got {raw}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The `vela2 loadtest` arguments."""
    ap = Parser(prog="vela2 loadtest", description=__doc__.splitlines()[0])
    add_url_arguments(ap, DEFAULT_REDIS_URL)
    ap.add_argument("--http", default=None, help="send to this HTTP route (POST /v1/system_one) instead of Redis; "
                                                 f"its API key in ${ENV_API_KEY}, or --api-key-file")
    ap.add_argument("--api-key-file", default=None, help="a file whose first line is the route's API key")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="the model the requests are for")
    ap.add_argument("--workload", default="rows",
                    help=f"built-in ({', '.join(BUILTIN)}) or a JSONL file of rows / SystemOne requests (cycled, "
                         "fresh ids)")
    rates = ap.add_mutually_exclusive_group(required=True)
    rates.add_argument("--rates", type=_floats, help="requests/s to offer, comma separated")
    rates.add_argument("--loads", type=_floats, help="fractions of the capacity to offer, comma separated")
    rates.add_argument("--sequential", type=_positive(int), default=None,
                       help="instead: this many requests one at a time (each sent once the last is answered)")
    ap.add_argument("--capacity", type=_positive(float), default=None,
                    help="with --loads: the capacity in requests/s (default: measured first, closed loop)")
    ap.add_argument("--capacity-s", type=_positive(float), default=20.0, help="the capacity probe's measured seconds")
    ap.add_argument("--capacity-in-flight", type=_positive(int), default=512,
                    help="requests the capacity probe keeps outstanding")
    ap.add_argument("--warmup-s", type=float, default=10.0, help="seconds of each rate before measuring")
    ap.add_argument("--duration-s", type=_positive(float), default=45.0, help="measured seconds of each rate")
    ap.add_argument("--per-message", type=_positive(int), default=1, help="requests to a message (Redis only)")
    ap.add_argument("--backfill", action="store_true", help="to the backfill queue (Redis only)")
    ap.add_argument("--tenant", default=None, help="the tenant the ids are scoped to (Redis only)")
    ap.add_argument("--processes", type=_positive(int), default=4, help="client processes (each its own loop)")
    ap.add_argument("--timeout-s", type=_positive(float), default=60.0,
                    help="a request not answered this long after it was due is lost")
    ap.add_argument("--seed", type=int, default=0, help="seed of the arrivals and the built-in workload")
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    return ap


def _target(args: argparse.Namespace, argv: list[str]) -> Target:
    if args.http:
        if args.per_message != 1 or args.backfill or args.tenant:
            raise SystemExit("vela2 loadtest: --per-message, --backfill and --tenant are for Redis, not --http")
        key = os.environ.get(ENV_API_KEY)
        if args.api_key_file:
            key = Path(args.api_key_file).read_text(encoding="utf-8").splitlines()[0].strip()
        return Target(args.model, http_url=args.http, api_key=key or None, timeout_s=args.timeout_s)
    url = url_from_args(args.redis, args.redis_url_file, argv, logging.getLogger("vela2.loadtest"))
    return Target(args.model, redis_url=url, tenant=args.tenant, backfill=args.backfill, timeout_s=args.timeout_s)


def run(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    """Every point of the run, with the capacity it was measured against."""
    run_id = f"loadtest-{int(time.time())}-{os.getpid()}-"
    capacity: dict[str, Any] | None = None
    if args.sequential:
        plan = Plan(target, args.workload, f"{run_id}seq-", args.seed, 1.0, args.per_message, 0.0, 0.0, 0.0)
        outcomes = run_sequential(plan, args.sequential)
        point = {**summarize(outcomes, 0.0, max(o.due_s for o in outcomes) or 1.0), "sequential": args.sequential}
        print(line(point), flush=True)
        return {"capacity": None, "points": [point]}
    rates = args.rates
    if args.loads:
        per_s = args.capacity
        if per_s is None:
            probe = Plan(target, args.workload, run_id + "cap-", args.seed, 1.0, args.per_message, 3.0,
                         args.capacity_s, 0.0)
            per_s = measure_capacity(probe, args.processes, args.capacity_in_flight)
            print(f"capacity (closed loop, {args.capacity_in_flight} in flight): {per_s:.1f} requests/s", flush=True)
        capacity = {"per_s": round(per_s, 3), "measured": args.capacity is None}
        rates = [load * per_s for load in args.loads]
    points = []
    for i, rate in enumerate(rates):
        plan = Plan(target, args.workload, f"{run_id}r{i}-", args.seed + i, rate, args.per_message,
                    args.warmup_s, args.duration_s, 0.0)
        point = summarize(run_point(plan, args.processes), rate, args.duration_s)
        if args.loads:
            point["load"] = args.loads[i]
        print(line(point), flush=True)
        points.append(point)
    return {"capacity": capacity, "points": points}


def main(argv: list[str] | None = None) -> int:
    """open-loop Poisson load against a running deployment; latency percentiles, throughput, lost"""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        next(requests(args.workload, args.model, "check-"))  # a bad workload fails here, not in every process
    except ValueError as e:
        print(f"vela2 loadtest: {e}", file=sys.stderr)
        return 2
    target = _target(args, argv)
    where = target.http_url or mask_url(target.redis_url or "")
    print(f"vela2 loadtest: {where}, model {target.model}, workload {args.workload}, {args.processes} processes",
          flush=True)
    report = {"command": "vela2 loadtest " + " ".join(argv), "target": where,
              "machine": {"host": socket.gethostname(), "cpus": os.cpu_count(), "python": platform.python_version()},
              "settings": {k: v for k, v in vars(args).items() if k not in ("redis", "redis_url_file", "api_key_file")},
              **run(args, target)}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    lost = sum(p["lost"] for p in report["points"])
    if lost:
        print(f"vela2 loadtest: {lost} requests got no answer within {args.timeout_s:g} s", file=sys.stderr)
        return EXIT_LOST
    return 0


if __name__ == "__main__":  # from a checkout that is not installed (no entry points): python -m ...
    sys.exit(main())
