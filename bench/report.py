"""What every benchmark's JSON report starts with (the exact command, the machine, when) and how it is
written, so a figure under bench/results/ always says where it came from."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.queue_bench import machine_info

log = logging.getLogger("bench.report")


def git_commit(cwd: str | Path | None = None) -> str:
    """`git describe --always --dirty` of the checkout (empty outside one)."""
    return subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                          cwd=cwd).stdout.strip()


def header(module: str, argv: list[str], **extra: Any) -> dict[str, Any]:
    """The report's first keys: the command (`python -m <module> <argv>`), the machine, its CPU count,
    `extra` (a commit, ...) and the start time (UTC)."""
    return {"command": f"python -m {module} " + " ".join(argv), "machine": machine_info(),
            "cpu_count": os.cpu_count(), **extra, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_report(report: dict[str, Any], out: str | Path, *, ensure_ascii: bool = True) -> None:
    """Write `report` as indented JSON to `out` (its folder made if missing) and log where."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=1, ensure_ascii=ensure_ascii) + "\n")
    log.info("wrote %s", out)
