"""The `vela2` command line: thin, each subcommand calls into the packages."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from typing import Any

from vela2.errors import InvalidRequest, Vela2Error


def _load(checkpoint: str, device: str, precision: str):
    from vela2.checkpoint import load, serving_dtype

    return load(checkpoint, device=device, dtype=serving_dtype(precision))


def read_jsonl(path: str) -> list[tuple[Any, Vela2Error | None]]:
    """Lines of a JSONL file (`-` = stdin), each decoded or paired with the error that names it
    (blank lines too, so that output lines stay 1:1 with input lines)."""
    out: list[tuple[Any, Vela2Error | None]] = []
    with contextlib.ExitStack() as stack:
        fh = sys.stdin if path == "-" else stack.enter_context(open(path, encoding="utf-8"))
        for n, line in enumerate(fh, 1):
            if not line.strip():
                out.append(({"id": f"line-{n}"}, InvalidRequest(f"line {n} is empty")))
                continue
            try:
                out.append((json.loads(line), None))
            except json.JSONDecodeError as e:
                out.append(({"id": f"line-{n}"}, InvalidRequest(f"line {n} is not valid JSON: {e.msg} "
                                                              f"at column {e.colno}")))
    return out


def cmd_init_demo(args: argparse.Namespace) -> int:
    from vela2.demo import init_demo

    path = init_demo(args.dir)
    print(f"demo checkpoint written to {path}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from vela2.schemas import error_result
    from vela2.systemone import predict_mixed

    model = _load(args.checkpoint, args.device, args.precision)
    lines = read_jsonl(args.input)
    objs = [dict(obj, units=True) if args.units and isinstance(obj, dict) and "text" in obj else obj
            for obj, err in lines if err is None]
    answers = iter(predict_mixed(model, objs, precision=args.precision, max_batch_tokens=args.max_batch_tokens))
    n_err = 0
    with contextlib.ExitStack() as stack:
        out = sys.stdout if args.out in (None, "-") else stack.enter_context(open(args.out, "w", encoding="utf-8"))
        for obj, err in lines:
            result = error_result(obj["id"], None, err).to_json_dict() if err else next(answers)
            n_err += result.get("status") == "error"
            out.write(json.dumps(result, ensure_ascii=False) + "\n")
    print(f"{len(lines)} lines, {n_err} errors", file=sys.stderr)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from vela2.fitting import calibrate_command

    return calibrate_command(args.checkpoint, args.dev, out=args.out, report_path=args.report,
                             device=args.device, precision=args.precision)


def cmd_worker(args: argparse.Namespace) -> int:
    from worker.app import WorkerSettings, run_worker

    settings = WorkerSettings.from_env(
        checkpoint=args.checkpoint, device=args.device, precision=args.precision, redis_url=args.redis,
        visibility_timeout_s=args.visibility_timeout_s, max_batch_tokens=args.max_batch_tokens,
        max_wait_ms=args.max_wait_ms, metrics_port=args.metrics_port, row_tokens=args.row_tokens,
        attn=args.attn, max_buffered=args.max_buffered, shutdown_timeout_s=args.shutdown_timeout_s,
    )
    return run_worker(settings, loglevel=args.loglevel)


def cmd_demo(args: argparse.Namespace) -> int:
    from worker.demo import run_demo

    return run_demo(args.checkpoint)


def cmd_parity(args: argparse.Namespace) -> int:
    from worker.parity import parity_command

    return parity_command(args.checkpoint, args.rows, json_path=args.json, redis_url=args.redis, device=args.device)


def _delegate(module: str, argv: list[str]) -> int:
    """Producer commands parse their own options (`vela2 backfill --help`): the CLI stays thin."""
    import importlib

    return int(importlib.import_module(module).main(argv) or 0)


DELEGATED = {"backfill": "producer.backfill", "http": "producer.http"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vela2", description="Vela 2 streaming scorer")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("init-demo", help="write the deterministic demo checkpoint")
    s.add_argument("dir")
    s.set_defaults(func=cmd_init_demo)

    s = sub.add_parser("predict", help="score a JSONL file of rows / SystemOne requests, no queue")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("input", help="JSONL file, '-' for stdin")
    s.add_argument("--out", help="output JSONL (default stdout)")
    s.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    s.add_argument("--device", default="cpu")
    s.add_argument("--units", action="store_true", help="span answers carry every word's units")
    s.add_argument("--max-batch-tokens", type=int, default=16_384)
    s.set_defaults(func=cmd_predict)

    s = sub.add_parser("calibrate", help="fit calibration.json from labelled rows")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("dev", help="labelled JSONL (rows with 'gold')")
    s.add_argument("--out", help="write calibration here instead of into the checkpoint")
    s.add_argument("--report", help="write the before/after report as JSON")
    s.add_argument("--device", default="cpu")
    s.add_argument("--precision", choices=["bf16", "fp32"], default="fp32")
    s.set_defaults(func=cmd_calibrate)

    s = sub.add_parser("worker", help="the Celery GPU worker (one process per device)",
                       description="Settings not given on the command line come from VELA2_* variables.")
    s.add_argument("--checkpoint", help="checkpoint directory (or VELA2_CHECKPOINT)")
    s.add_argument("--device", help="cuda:0, cpu, ... (default cpu)")
    s.add_argument("--precision", choices=["bf16", "fp32"], help="default bf16 on CUDA, fp32 on CPU")
    s.add_argument("--redis", help="broker and result backend URL (or VELA2_REDIS_URL)")
    s.add_argument("--visibility-timeout-s", type=float, help="unacked messages return after this long")
    s.add_argument("--max-batch-tokens", type=int, help="padded tokens per device batch")
    s.add_argument("--max-wait-ms", type=float, help="longest a request waits for its bucket to fill")
    s.add_argument("--max-buffered", type=int, help="messages the worker holds at once (prefetch)")
    s.add_argument("--row-tokens", type=int, help="pack short sequences into rows of this many tokens (0: off)")
    s.add_argument("--attn", choices=["sdpa", "flex"], help="attention backend")
    s.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    s.add_argument("--shutdown-timeout-s", type=float, help="warm shutdown: finish or return within this")
    s.add_argument("--loglevel", default="INFO")
    s.set_defaults(func=cmd_worker)

    s = sub.add_parser("parity", help="the seed-format parity report: worker vs predict(), bundled vs single, "
                                      "precisions, SystemOne")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("rows", help="JSONL rows to compare on")
    s.add_argument("--json", help="write the report as JSON too")
    s.add_argument("--redis", help="Redis URL (default: an embedded one)")
    s.add_argument("--device", default="cpu")
    s.set_defaults(func=cmd_parity)

    # Listed for --help only: main() hands these to their own parsers (see DELEGATED).
    sub.add_parser("backfill", help="bulk submit IN.jsonl -> OUT.jsonl: windowed, resumable "
                                    "(see `vela2 backfill --help`)")
    sub.add_parser("http", help="the HTTP route for SystemOne requests (see `vela2 http --help`)")

    s = sub.add_parser("demo", help="the main job: embedded Redis, a worker, sample requests, answers")
    s.add_argument("--checkpoint", help="demo checkpoint to use (default: written to a temporary folder)")
    s.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:
        return _delegate(DELEGATED[argv[0]], argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except Vela2Error as e:
        print(f"vela2 {args.command}: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"vela2 {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
