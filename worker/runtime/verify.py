"""The background check of a checkpoint whose identity came from its manifest (vela2.model.manifest):
once the worker serves, one low-priority thread hashes every weight file at a capped read rate and
compares it with the manifest. A file that disagrees means the answers' digest may not name the
weights served: the worker logs it, /readyz answers 503 naming the file, and the worker stops taking
work (a Celery worker finishes what it holds and exits with CHECKPOINT_CHANGED_EXIT).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vela2.model import manifest

log = logging.getLogger(__name__)

CHECKPOINT_CHANGED_EXIT = 3  # the exit status of a worker whose weights disagree with the manifest


def _lower_priority() -> None:
    """This thread at the lowest CPU priority (Linux: a thread has its own nice value)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux, or not allowed: the read-rate cap still bounds it
        pass


def start_background_verify(path: str | Path, recorded: dict[str, Any], rate_mb_s: float,
                            on_mismatch: Callable[[str], None]) -> threading.Thread:
    """Hash the weight files of `path` against `recorded` (its manifest) on a daemon thread at the
    lowest priority, at most `rate_mb_s` MB/s; `on_mismatch(reason)` is called once if a file
    disagrees (or the check cannot run). Returns the started thread."""
    thread = threading.Thread(target=_verify, args=(Path(path), recorded, rate_mb_s, on_mismatch),
                              name="vela2-verify", daemon=True)
    thread.start()
    return thread


def _verify(path: Path, recorded: dict[str, Any], rate_mb_s: float, on_mismatch: Callable[[str], None]) -> None:
    _lower_priority()
    t0 = time.monotonic()
    size = sum(int(e.get("size", 0)) for e in recorded.get("files", {}).values())
    try:
        problem = manifest.verify(path, recorded, limit_bps=rate_mb_s * 1e6 or None)
    except Exception as e:  # noqa: BLE001 (a check that cannot run must say so, not kill a thread silently)
        problem = f"the check failed: {type(e).__name__}: {e}"
    if problem is None:
        log.info("checkpoint %s: every byte agrees with its manifest (%.1f GB hashed in %.1f s)",
                 path, size / 1e9, time.monotonic() - t0)
        return
    log.error("checkpoint %s DIFFERS from its manifest.json: %s. The answers' digest may not name the "
              "weights served: this worker stops taking work. Restore the files, or rewrite the manifest "
              "with `vela2 manifest %s` if the change was meant", path, problem, path)
    on_mismatch(problem)
