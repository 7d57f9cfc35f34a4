"""Fault injection for the fault suite and the tests (test-only; the worker never reads it from the
environment): a `Faults` value wraps the scoring pipeline's `run_batch` / `launch_batch`, and is
passed to the worker as its `pipeline_wrapper` (worker.app.create_app / worker.cli.main), which
hands it on to the device process.

    python -m stack.faults --delay-s 0.5 --fail-prefix bad- -- [celery worker options]

starts a worker configured by its VELA2_* variables, as `celery -A worker.app worker` does, with
these faults (stack.harness.WorkerProcess.start(faults=Faults(...)) builds that command line):

    delay_s           sleep this long before every batch (a slow device, for SIGKILL tests)
    fail_prefix       a batch holding a request whose id starts with this raises RuntimeError
    crash_prefix      a batch holding a request whose id starts with this kills the whole process
                      (os._exit(137), as the kernel's OOM killer would): poison tests
    oom_above_tokens  a batch of more padded tokens (longest x count) than this raises
                      torch.OutOfMemoryError, as a device with too little memory would

The worker's own warm-up batches (start-up) feel the delay (a slow device is slow then too) but none
of the failures, which are for requests.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from worker.runtime.warmup import WARMUP_ID

log = logging.getLogger(__name__)

CRASH_EXIT = 137  # the exit code of a process killed by the crash fault (the kernel's OOM kill's)


@dataclass(frozen=True)
class Faults:
    """The faults to inject; a callable that wraps a pipeline (picklable: it crosses into the device
    process)."""

    delay_s: float = 0.0
    fail_prefix: str | None = None
    crash_prefix: str | None = None
    oom_above_tokens: int = 0

    def __call__(self, pipeline: Any) -> Any:
        """`pipeline` behind these faults (the pipeline itself when there are none)."""
        if self == Faults():
            return pipeline
        log.warning("TEST FAULTS ACTIVE: %s", self)
        return FaultyPipeline(pipeline, self)

    def argv(self) -> list[str]:
        """These faults as `python -m stack.faults` options."""
        out = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out += [f"--{f.name.replace('_', '-')}", str(value)]
        return out


class FaultyPipeline:
    """The pipeline with `run_batch` behind the faults; every other step is the pipeline's own."""

    def __init__(self, pipeline: Any, faults: Faults):
        self._pipeline = pipeline
        self.faults = faults

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipeline, name)

    def run_batch(self, model: Any, sequences: list[Any], precision: str, row_tokens: int | None = None) -> Any:
        self._hooks(sequences)
        return self._pipeline.run_batch(model, sequences, precision, row_tokens)

    def launch_batch(self, model: Any, sequences: list[Any], precision: str, row_tokens: int | None = None) -> Any:
        """run_batch's first half (the device process launches batches ahead), behind the same faults."""
        self._hooks(sequences)
        return self._pipeline.launch_batch(model, sequences, precision, row_tokens)

    def _hooks(self, sequences: list[Any]) -> None:
        f = self.faults
        if f.delay_s:
            time.sleep(f.delay_s)
        ids = [s.row_id for s in sequences if s.row_id != WARMUP_ID]
        if f.crash_prefix and any(i.startswith(f.crash_prefix) for i in ids):
            log.critical("test fault: a crashing request in this batch; exiting with %d", CRASH_EXIT)
            logging.shutdown()
            os._exit(CRASH_EXIT)
        if f.fail_prefix and any(i.startswith(f.fail_prefix) for i in ids):
            raise RuntimeError("test fault: simulated CUDA out of memory")
        padded = max(s.num_tokens for s in sequences) * len(sequences)
        if f.oom_above_tokens and ids and padded > f.oom_above_tokens:
            torch = sys.modules.get("torch")
            oom = getattr(torch, "OutOfMemoryError", RuntimeError) if torch is not None else RuntimeError
            raise oom(f"CUDA out of memory (test fault: a batch of {padded} padded tokens > {f.oom_above_tokens})")


def parse_argv(argv: list[str]) -> tuple[Faults, list[str]]:
    """(the faults, the celery worker options after `--`) from `python -m stack.faults` options."""
    ap = argparse.ArgumentParser(prog="python -m stack.faults", description="a worker with injected faults")
    for f in dataclasses.fields(Faults):
        ap.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, default=f.default,
                        type=str if f.default is None else type(f.default))
    cut = argv.index("--") if "--" in argv else len(argv)
    return Faults(**vars(ap.parse_args(argv[:cut]))), argv[cut + 1:]


def main(argv: list[str]) -> int:
    """Run a worker (VELA2_* settings, as `celery -A worker.app worker`) with the faults of `argv`."""
    from worker.app import create_app
    from worker.settings import WorkerSettings

    faults, celery_argv = parse_argv(argv)
    app = create_app(WorkerSettings.from_env(), pipeline_wrapper=faults)
    app.worker_main(["worker", *celery_argv])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
