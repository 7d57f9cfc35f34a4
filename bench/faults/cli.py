"""The command line: `python -m bench.faults [--out F] [--only NAME,...] ...` runs the suite, writes
the JSON report, prints one line per scenario run and a summary; exit 0 when nothing was lost, no
answer changed and every check of every run held, 1 otherwise (2: a usage error)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.faults import registry
from bench.faults.report import table, write_json
from bench.faults.runner import run
from vela2.wire import keys
from vela2.wire.urls import mask_url

DEFAULT_OUT = "bench/results/reliability.json"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.faults",
                                description="The fault suite: real redis-server, workers and producers; each "
                                "scenario injects one kind of fault and counts what became of every request.")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--only", help=f"comma-separated scenario names ({', '.join(registry.SCENARIOS)}); 'none' for none")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies request counts and the redis_down outage")
    p.add_argument("--soak-minutes", type=float, default=0.0, help="also run steady traffic this long")
    p.add_argument("--fuzz-examples", type=int, default=500, help="inputs per fuzz target (0: no fuzz)")
    p.add_argument("--checkpoint", help="checkpoint directory (default: a fresh demo checkpoint)")
    p.add_argument("--device", default="cpu", help="worker device (cuda:0 on a GPU host)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (worker and redis logs)")
    p.add_argument("--repeat", type=int, default=1, help="run the selected scenarios this many times (every run "
                   "is reported; exit 1 if any run lost a request or failed a check)")
    p.add_argument("--cpu-hog", type=int, default=0, metavar="K",
                   help="K busy-loop processes beside the scenarios (started and stopped by the suite)")
    p.add_argument("--device-process", type=int, default=None, choices=(0, 1),
                   help="1: every worker runs its model in a device process (worker setting device_process; "
                        "default: the worker's own, a thread on a CPU)")
    p.add_argument("--cpu-processes", type=int, default=None, metavar="N",
                   help="every worker renders and decodes in N processes (worker setting cpu_processes; "
                        "default: the worker's own, threads on a CPU)")
    p.add_argument("--broker", default=None, metavar="amqp://USER:PW@HOST:PORT",
                   help=f"run the RabbitMQ scenarios ({', '.join(registry.AMQP_SCENARIOS)}) on this host's "
                        "RabbitMQ, a fresh vhost each (made with rabbitmqctl), results in a fresh redis-server")
    return p


def scenario_names(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The scenarios to run, in the order given (all of the broker's by default, none for 'none')."""
    table_ = registry.table(bool(args.broker))
    if args.only == "none":
        return []
    if not args.only:
        return list(table_)
    names = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = [x for x in names if x not in table_]
    if unknown:
        p.error(f"unknown scenarios {unknown}; choose from {', '.join(table_)}")
    return names


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.broker and not keys.is_amqp_url(args.broker):
        p.error(f"--broker takes an amqp:// URL (the Redis scenarios run without it); got {mask_url(args.broker)}")
    if args.repeat < 1 or args.cpu_hog < 0:
        p.error("--repeat must be >= 1 and --cpu-hog >= 0")


def worker_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings every worker of the run gets over BASE_SETTINGS (only those given)."""
    settings: dict[str, Any] = {}
    if args.cpu_processes is not None:
        settings["cpu_processes"] = args.cpu_processes
    if args.device_process is not None:
        settings["device_process"] = args.device_process
    return settings


def summary_line(report: dict[str, Any]) -> str:
    runs = report["scenarios"]
    passed = sum(1 for x in runs if x["passed"])
    return (f"{len(runs)} scenario runs, {passed} passed, {sum(x['requests'] for x in runs)} requests, "
            f"lost {report['lost']}, changed {report['changed']}: {'PASSED' if report['passed'] else 'FAILED'}")


def main(argv: list[str] | None = None) -> int:
    """CLI: run, write JSON, print a table; exit 1 when a request was lost or a check failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    args = p.parse_args(argv)
    check_args(p, args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    names = scenario_names(p, args)
    report = run(
        names,
        scale=args.scale,
        checkpoint=args.checkpoint,
        device=args.device,
        fuzz_examples=args.fuzz_examples,
        soak_minutes=args.soak_minutes,
        keep=args.keep,
        repeat=args.repeat,
        cpu_hog=args.cpu_hog,
        amqp_server=urlunsplit(urlsplit(args.broker)._replace(path="")) if args.broker else None,
        worker_settings=worker_settings(args),
        command="python -m bench.faults " + " ".join(argv),
    )
    out = Path(args.out)
    write_json(out, report)
    print("\n".join(table(report)))
    print(summary_line(report))
    print(f"wrote {out} ({report['seconds']:.0f} s)")
    return 0 if report["passed"] else 1
