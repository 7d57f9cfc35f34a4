"""Bulk jobs that outlive their client: submit a JSONL file as a job, watch it, cancel it, read it back.

`vela2 jobs submit IN.jsonl` / `status JOB` / `results JOB OUT.jsonl [--errors E.jsonl]` / `cancel
JOB` / `list`: the command line over producer.jobs (the first line above is its description).
Exit codes: 0 done; 1 `results` timed out; 2 bad arguments or input; 3 Redis unreachable; 4 no such
job.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import redis.exceptions

from producer.arguments import ENV_MODEL, check_seconds
from producer.cells import CellsClient
from producer.client import DEFAULT_MODEL, DEFAULT_REDIS_URL, Client
from producer.jobs.output import DEFAULT_POLL_S, job_lines
from producer.jobs.records import cancel_job, job_info, list_jobs
from producer.jobs.submit import DEFAULT_CHUNK_SIZE, submit_job
from vela2.cli import Parser
from vela2.errors import CellUnavailable, ConfigError, InvalidRequest, JobNotFound
from vela2.progress import Progress
from vela2.wire.cells import ENV_CELLS_FILE, cells_file_from_env
from vela2.wire.jobs import DEFAULT_WINDOW_S, JobInfo
from vela2.wire.urls import add_url_arguments, url_from_args

log = logging.getLogger(__name__)


def rate_and_eta(info: JobInfo, now: float) -> tuple[float, float | None]:
    """Answers per second over the job's life so far, and the seconds left at that rate (None
    while nothing is answered, 0 once the job has ended)."""
    elapsed = max(1e-9, (info.ended_at or now) - info.created_at)
    rate = info.answered / elapsed
    if info.ended:
        return rate, 0.0
    return rate, (info.counts["queued"] / rate if rate > 0 else None)


def status_line(info: JobInfo, now: float) -> str:
    """One line for a human: status, counts, rows/s and ETA."""
    rate, eta = rate_and_eta(info, now)
    c = info.counts
    eta_text = "-" if eta is None else f"{eta:,.0f} s"
    served = "".join(f"; ok by {who}: {n:,}" for who, n in sorted(info.served.items()))
    return (f"{info.id} {info.status}: {info.total:,} lines{'' if info.input_done else ' so far'}: queued "
            f"{c['queued']:,}, ok {c['ok']:,}, error {c['error']:,}, expired {c['expired']:,}, cancelled "
            f"{c['cancelled']:,}; {rate:,.1f} rows/s, ETA {eta_text}{served}")


class _Writer:
    """JSON lines to a file, one whole line per write."""

    def __init__(self, path: str):
        self.f = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())

    def write(self, obj: dict[str, Any]) -> None:
        self.f.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self.f.close()


def write_results(client: Client | CellsClient, job_id: str, out: str, errors: str | None = None, *,
                  timeout_s: float | None = None, poll_s: float = DEFAULT_POLL_S) -> tuple[int, int]:
    """Stream a job's output lines (job_lines) to `out`, in input order; with `errors`, the lines that
    are not ok go there instead. Returns (lines written to out, lines written to errors)."""
    w_out = _Writer(out)
    w_err = _Writer(errors) if errors else None
    n_out = n_err = 0
    try:
        for line, ok in job_lines(client, job_id, timeout_s=timeout_s, poll_s=poll_s):
            if ok or w_err is None:
                w_out.write(line)
                n_out += 1
            else:
                w_err.write(line)
                n_err += 1
    finally:
        w_out.close()
        if w_err is not None:
            w_err.close()
    return n_out, n_err


def build_parser() -> argparse.ArgumentParser:
    """The `vela2 jobs` arguments."""
    ap = Parser(prog="vela2 jobs", description=__doc__.splitlines()[0])
    common = Parser(add_help=False)
    add_url_arguments(common, DEFAULT_REDIS_URL)
    common.add_argument("--model", default=os.environ.get(ENV_MODEL, DEFAULT_MODEL), help="model name (its queues)")
    common.add_argument("--tenant", default=None, help="the jobs are this tenant's (as an API key's over HTTP)")
    common.add_argument("--cells", default=cells_file_from_env(),
                        help=f"a cells file (default ${ENV_CELLS_FILE}): each job lives in its id's cell; `list` "
                             "merges every cell's (--redis is then not read)")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("submit", parents=[common], help="create a job from a JSONL file; prints its id at once")
    p.add_argument("input", metavar="IN.jsonl", help="rows, SystemOne requests or OpenAI-batch lines (custom_id, body)")
    p.add_argument("--window-s", type=float, default=DEFAULT_WINDOW_S,
                   help="completion window: requests not started by then are answered expired")
    p.add_argument("--metadata", default=None, help="free-form JSON object kept on the job")
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="requests per queue message")
    p.add_argument("--wait", action="store_true",
                   help="then follow the job until it ends: a bar on stderr, or a line every few s off a terminal")
    p = sub.add_parser("status", parents=[common], help="a job's status, counts, rows/s and ETA")
    p.add_argument("job")
    p.add_argument("--json", action="store_true", help="the record as JSON")
    p = sub.add_parser("results", parents=[common], help="stream a job's output, in input order")
    p.add_argument("job")
    p.add_argument("output", metavar="OUT.jsonl")
    p.add_argument("--errors", metavar="E.jsonl", default=None, help="lines that are not ok go here")
    p.add_argument("--timeout-s", type=float, default=None, help="give up waiting for answers after this")
    p = sub.add_parser("cancel", parents=[common], help="cancel a job (what no worker started is answered cancelled)")
    p.add_argument("job")
    p = sub.add_parser("list", parents=[common], help="the newest jobs of the model")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true", help="one JSON record per line")
    return ap


def _follow(client: Client | CellsClient, job_id: str, poll_s: float = 1.0) -> JobInfo:
    """Read the job's record every `poll_s` until it ends, its progress on stderr (vela2.progress: a
    bar on a terminal, else a line every few seconds and one when it ends); returns its last record."""
    info = job_info(client, job_id)
    with Progress(f"job {job_id}", info.total, unit="line", initial=info.answered) as bar:
        while True:
            c = info.counts
            bar.update(info.answered - bar.done, status=info.status, queued=c["queued"], ok=c["ok"], error=c["error"],
                       **{k: c[k] for k in ("expired", "cancelled") if c[k]})
            if info.ended:
                return info
            time.sleep(poll_s)
            info = job_info(client, job_id)


def main(argv: list[str] | None = None) -> int:
    """bulk jobs that outlive their client: submit / status / results / cancel / list

    Exit codes: 0 done; 1 `results` timed out; 2 bad arguments or input; 3 Redis unreachable;
    4 no such job."""
    args = build_parser().parse_args(argv)
    try:
        if args.cells:
            with CellsClient(args.cells, model=args.model, tenant=args.tenant) as cells:
                return _run(cells, args)
        url = url_from_args(args.redis, args.redis_url_file, sys.argv[1:] if argv is None else argv, log)
        with Client(url, model=args.model, tenant=args.tenant) as client:
            return _run(client, args)
    except JobNotFound as e:
        print(f"vela2 jobs: {e}", file=sys.stderr)
        return 4
    except (InvalidRequest, ConfigError) as e:
        print(f"vela2 jobs: {e}", file=sys.stderr)
        return 2
    except TimeoutError as e:
        print(f"vela2 jobs: {e}", file=sys.stderr)
        return 1
    except CellUnavailable as e:
        print(f"vela2 jobs: {e}", file=sys.stderr)
        return 3
    except redis.exceptions.RedisError as e:
        print(f"vela2 jobs: redis: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
        return 3


def _run(client: Client | CellsClient, args: argparse.Namespace) -> int:
    if args.command == "submit":
        if not Path(args.input).is_file():
            raise InvalidRequest(f"{args.input}: no such file")
        try:
            metadata = json.loads(args.metadata) if args.metadata else None
        except ValueError as e:
            raise InvalidRequest(f"--metadata is not valid JSON: {e}") from None
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidRequest(f"--metadata must be a JSON object; got {type(metadata).__name__}")
        with open(args.input, "rb") as f:
            done = submit_job(client, f, window_s=args.window_s, metadata=metadata, chunk_size=args.chunk_size,
                              on_created=lambda job: print(job, flush=True))
        print(f"vela2 jobs: {done.id}: {done.lines:,} lines: queued {done.queued:,}, invalid {done.invalid:,}, "
              f"cancelled {done.cancelled:,}; blank {done.blank:,}", file=sys.stderr)
        if args.wait:
            _follow(client, done.id)
    elif args.command == "status":
        info = job_info(client, args.job)
        print(json.dumps(info.to_dict()) if args.json else status_line(info, time.time()))
    elif args.command == "results":
        check_seconds("--timeout-s", args.timeout_s, zero_ok=True)  # NaN would wait for ever
        n_out, n_err = write_results(client, args.job, args.output, args.errors, timeout_s=args.timeout_s)
        print(f"vela2 jobs: {args.job}: wrote {n_out:,} lines to {args.output}"
              + (f" and {n_err:,} to {args.errors}" if args.errors else ""), file=sys.stderr)
    elif args.command == "cancel":
        print(status_line(cancel_job(client, args.job), time.time()))
    elif args.command == "list":
        for info in list_jobs(client, args.limit):
            print(json.dumps(info.to_dict()) if args.json else status_line(info, time.time()))
    return 0
