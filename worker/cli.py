"""`vela2 worker`: the Celery GPU worker, one process per device. Every flag is a worker setting
(worker.settings); a setting not given on the command line comes from its VELA2_* variable."""

from __future__ import annotations

import sys

from vela2.cli import Parser
from worker import settings as worker_settings


def main(argv: list[str]) -> int:
    """the Celery GPU worker (one process per device)"""
    ap = Parser(prog="vela2 worker", description=__doc__)
    worker_settings.add_arguments(ap)
    ap.add_argument("--loglevel", default="INFO")
    args = ap.parse_args(argv)
    settings = worker_settings.from_arguments(args)
    from worker.runtime.early import serve_early  # /livez and /readyz before celery and torch load

    early = serve_early(settings)
    from worker.app import run_worker  # celery and the model stack load only to run

    return run_worker(settings, loglevel=args.loglevel, early=early)


if __name__ == "__main__":  # from a checkout that is not installed (no entry points): python -m ...
    sys.exit(main(sys.argv[1:]))
