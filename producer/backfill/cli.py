"""`vela2 backfill IN.jsonl OUT.jsonl`: bulk scoring through the queue, bounded and resumable.

The command line over producer.backfill.run_backfill (the first line above is its description).
Exit code 0 when every input id has its line in OUT, 2 for bad arguments, 3 when Redis stayed
unreachable (EXIT_REDIS_UNAVAILABLE), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import redis.exceptions

from producer.arguments import ENV_MODEL, cells_from_args
from producer.backfill.output import RETRY_CHOICES
from producer.backfill.run import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_POLL_S,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WINDOW,
    DURATIONS,
    check_durations,
    run_backfill,
)
from producer.backfill.window import DEFAULT_STALL_WARN_S
from producer.client import DEFAULT_MODEL, DEFAULT_REDIS_URL
from vela2.cli import Parser
from vela2.errors import ConfigError, InvalidRequest, LimitExceeded
from vela2.wire.cells import ENV_CELLS_FILE, cells_file_from_env
from vela2.wire.urls import ENV_BROKER_URL, add_url_arguments, url_from_args

log = logging.getLogger(__name__)

EXIT_REDIS_UNAVAILABLE = 3


def build_parser() -> argparse.ArgumentParser:
    """The `vela2 backfill` arguments (shared with the CLI)."""
    ap = Parser(prog="vela2 backfill", description=__doc__.splitlines()[0])
    ap.add_argument("input", metavar="IN.jsonl", help="one row or SystemOne request per line")
    ap.add_argument("output", metavar="OUT.jsonl", help="results, one line per input id (appended; resumable)")
    add_url_arguments(ap, DEFAULT_REDIS_URL)
    ap.add_argument("--broker", default=os.environ.get(ENV_BROKER_URL) or None,
                    help=f"the workers' broker URL when it is not the Redis of --redis (default ${ENV_BROKER_URL})")
    ap.add_argument("--cells", default=cells_file_from_env(), metavar="FILE",
                    help=f"Redis cells (vela2.wire.cells; default ${ENV_CELLS_FILE}): each row queued and read in its "
                    "id's cell; instead of --redis / --broker")
    ap.add_argument("--model", default=os.environ.get(ENV_MODEL, DEFAULT_MODEL), help="model name (its queues)")
    ap.add_argument("--wait-replicas", type=int, default=0, metavar="N",
                    help="each push returns once N replicas of the broker's Redis hold it (Redis WAIT; Sentinel)")
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="most rows in flight (backpressure)")
    ap.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="rows per queue message")
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="per row; then an error line")
    ap.add_argument("--deadline-s", type=float, default=None, help="the worker answers 'expired' after this")
    ap.add_argument("--retry", choices=RETRY_CHOICES, default=None,
                    help="on resume, score again the rows OUT holds as timeouts (no answer came: no worker?) or as "
                    "errors (any line not ok; their stored failures are dropped from Redis first)")
    ap.add_argument("--stall-warn-s", type=float, default=DEFAULT_STALL_WARN_S,
                    help="warn when nothing is answered for this long and the queue does not shrink")
    ap.add_argument("--tenant", default=None, help="the ids are this tenant's (as with an API key's tenant over HTTP)")
    ap.add_argument("--poll-s", type=float, default=DEFAULT_POLL_S, help="pause between result polls")
    ap.add_argument(
        "--redis-timeout-s", type=float, default=None, help="longest Redis outage ridden out (default --timeout-s)"
    )
    bar = ap.add_mutually_exclusive_group()
    # progress on stderr: by default a bar on a terminal, else a line every few seconds (make, CI, logs)
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="a bar even when stderr is not a terminal")
    bar.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                     help="no progress on stderr")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON instead of a line")
    return ap


def main(argv: list[str] | None = None) -> int:
    """bulk submit IN.jsonl -> OUT.jsonl: windowed, resumable (prints the summary line)

    Exit code 0 when every input id has its line in OUT (error lines included), 2 for bad
    arguments, 3 when Redis stayed unreachable past --redis-timeout-s (or refused a write), 130
    when interrupted (rerun to resume in both cases)."""
    args = build_parser().parse_args(argv)
    if not Path(args.input).is_file():
        print(f"vela2 backfill: {args.input}: no such file", file=sys.stderr)
        return 2
    try:
        check_durations({name: getattr(args, name) for name in DURATIONS}, as_flags=True)
        given = sys.argv[1:] if argv is None else argv
        cells = cells_from_args(args, given)
        redis_url = url_from_args(args.redis, args.redis_url_file, given, log)
        summary = run_backfill(
            args.input,
            args.output,
            redis_url=redis_url,
            model=args.model,
            window=args.window,
            chunk_size=args.chunk_size,
            timeout_s=args.timeout_s,
            deadline_s=args.deadline_s,
            progress=args.progress,
            poll_s=args.poll_s,
            redis_timeout_s=args.redis_timeout_s,
            tenant=args.tenant,
            retry=args.retry,
            stall_warn_s=args.stall_warn_s,
            broker_url=args.broker,
            wait_replicas=args.wait_replicas,
            cells=cells,
        )
    except (InvalidRequest, LimitExceeded, ConfigError) as e:
        print(f"vela2 backfill: {e}", file=sys.stderr)
        return 2
    except redis.exceptions.RedisError as e:  # an outage past redis_timeout_s, or a refused write (OOM)
        msg = " ".join(str(e).split()) or type(e).__name__
        print(f"vela2 backfill: {msg}; rerun the same command to resume", file=sys.stderr)
        return EXIT_REDIS_UNAVAILABLE
    except KeyboardInterrupt:
        print("vela2 backfill: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    print(json.dumps(summary.to_dict()) if args.json else summary.line(), flush=True)
    return 0
