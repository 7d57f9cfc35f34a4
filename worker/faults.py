"""Fault injection for the fault suite and the tests: a wrapper around the pipeline that the worker
applies only when one of these variables is set (it logs a warning when it does; never set them in
production):

    VELA2_TEST_BATCH_DELAY_S    sleep this long before every batch (a slow device, for SIGKILL tests)
    VELA2_TEST_FAIL_ID_PREFIX   a batch holding a request whose id starts with this raises RuntimeError
    VELA2_TEST_CRASH_ID_PREFIX  a batch holding a request whose id starts with this kills the whole
                                process (os._exit(137), as the kernel's OOM killer would): poison tests
    VELA2_TEST_OOM_ABOVE_TOKENS a batch of more padded tokens (longest x count) than this raises
                                torch.OutOfMemoryError, as a device with too little memory would

The worker's own warm-up batch (start-up) feels the delay (a slow device is slow then too) but none
of the failures, which are for requests.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

TEST_DELAY_ENV = "VELA2_TEST_BATCH_DELAY_S"
TEST_FAIL_ENV = "VELA2_TEST_FAIL_ID_PREFIX"
TEST_CRASH_ENV = "VELA2_TEST_CRASH_ID_PREFIX"
TEST_OOM_ENV = "VELA2_TEST_OOM_ABOVE_TOKENS"
TEST_CRASH_EXIT = 137
WARMUP_ID = "vela2-warmup"  # the id of the worker's start-up row (worker.startup.warmup_row)


@dataclass(frozen=True)
class Faults:
    """The faults to inject (from the VELA2_TEST_* variables)."""

    delay_s: float = 0.0
    fail_prefix: str | None = None
    crash_prefix: str | None = None
    oom_above_tokens: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Faults | None:
        """The faults the environment asks for; None when it asks for none."""
        env = os.environ if environ is None else environ
        faults = cls(
            delay_s=float(env.get(TEST_DELAY_ENV) or 0),
            fail_prefix=env.get(TEST_FAIL_ENV) or None,
            crash_prefix=env.get(TEST_CRASH_ENV) or None,
            oom_above_tokens=int(env.get(TEST_OOM_ENV) or 0),
        )
        return faults if faults != cls() else None


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
        """run_batch's first half (worker.device's process launches batches ahead), behind the same faults."""
        self._hooks(sequences)
        return self._pipeline.launch_batch(model, sequences, precision, row_tokens)

    def _hooks(self, sequences: list[Any]) -> None:
        f = self.faults
        if f.delay_s:
            time.sleep(f.delay_s)
        ids = [s.row_id for s in sequences if s.row_id != WARMUP_ID]
        if f.crash_prefix and any(i.startswith(f.crash_prefix) for i in ids):
            log.critical("test hook: a crashing request in this batch; exiting with %d", TEST_CRASH_EXIT)
            logging.shutdown()
            os._exit(TEST_CRASH_EXIT)
        if f.fail_prefix and any(i.startswith(f.fail_prefix) for i in ids):
            raise RuntimeError("test hook: simulated CUDA out of memory")
        padded = max(s.num_tokens for s in sequences) * len(sequences)
        if f.oom_above_tokens and ids and padded > f.oom_above_tokens:
            torch = sys.modules.get("torch")
            oom = getattr(torch, "OutOfMemoryError", RuntimeError) if torch is not None else RuntimeError
            raise oom(f"CUDA out of memory (test hook: a batch of {padded} padded tokens > {f.oom_above_tokens})")


def wrap(pipeline: Any, environ: Mapping[str, str] | None = None) -> Any:
    """`pipeline` behind the faults the environment asks for (the pipeline itself when none)."""
    faults = Faults.from_env(environ)
    if faults is None:
        return pipeline
    log.warning("TEST HOOKS ACTIVE: %s", faults)
    return FaultyPipeline(pipeline, faults)
