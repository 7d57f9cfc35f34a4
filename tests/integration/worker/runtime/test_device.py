"""worker.runtime.device: run_batch in a spawned process of its own gives run_batch's own outputs,
reports a batch that raises as that batch's error, keeps serving after it, and takes the worker down
with its own exit code when it dies (what a crash in the worker process itself does)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import pytest

from stack.faults import CRASH_EXIT, Faults
from tests.unit.worker.runtime.test_device import _batches, _same
from vela2.config import Vela2Config
from vela2.errors import ConfigError
from vela2.scoring.pipeline import run_batch
from worker.runtime.device import ModelSpec, ProcessDevice
from worker.runtime.warmup import measure_worst_batch_s
from worker.settings import EngineSettings

ROOT = Path(__file__).resolve().parents[4]


def _spec(demo_dir: Path, **kw) -> ModelSpec:
    name = Vela2Config.read(demo_dir).name
    return ModelSpec(str(demo_dir), kw.pop("model_name", name), "cpu", "float32", "fp32", **kw)


def _worst(settings: EngineSettings | None = None):
    return partial(measure_worst_batch_s, settings=settings or EngineSettings(precision="fp32", max_batch_tokens=2048))


def test_process_device_gives_run_batch_outputs_in_order(demo_dir, demo_model):
    dev = ProcessDevice(_spec(demo_dir), None, _worst(), Faults(fail_prefix="fails-"))
    dev.start()
    try:
        assert dev.worst_s > 0
        batches = _batches(demo_model, "pd-")
        bad = _batches(demo_model, "fails-", n=2)[0]
        # queued back to back (the engine queues the next behind the running one), one that raises among them
        futures = [dev.submit(b) for b in batches[:2]] + [dev.submit(bad)] + [dev.submit(b) for b in batches[2:]]
        with pytest.raises(RuntimeError, match="simulated CUDA out of memory"):
            futures[2].result(60)
        good = [f.result(60) for i, f in enumerate(futures) if i != 2]
        for ran, batch in zip(good, batches, strict=True):
            _same(ran.outputs, run_batch(demo_model, batch, "fp32"))
            assert ran.end >= ran.start and ran.cpu_s > 0
        starts = [r.start for r in good]
        assert all(a.end <= b.start + 1e-6 for a, b in zip(good, good[1:], strict=False))  # no overlap counted
        assert starts == sorted(starts)
        assert dev.stage == "device_in_processes"
    finally:
        dev.close()
    assert not dev._proc.is_alive()


def test_a_process_that_cannot_load_the_model_refuses_to_start(demo_dir):
    dev = ProcessDevice(_spec(demo_dir, model_name="another-model"), None, _worst())
    with pytest.raises(ConfigError, match="does not match the queue model"):
        dev.start()


def test_a_device_process_that_dies_takes_the_worker_with_its_exit_code(demo_dir, tmp_path):
    """The crash hook kills the device process mid-batch; the process holding the ProcessDevice
    (a worker) exits with the same code, as when a request kills the worker itself."""
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(ROOT)!r})

        if __name__ == "__main__":  # the device process is spawned: it imports this file too
            from pathlib import Path
            import torch
            import vela2
            from stack.faults import Faults
            from tests.integration.worker.runtime.test_device import _batches, _spec, _worst
            from worker.runtime.device import ProcessDevice

            demo = Path({str(demo_dir)!r})
            model = vela2.load(demo, dtype=torch.float32)
            dev = ProcessDevice(_spec(demo), None, _worst(), Faults(crash_prefix="boom-"))
            dev.start()
            print("started", flush=True)
            dev.submit(_batches(model, "boom-", n=2)[0])
            time.sleep(120)
            print("still alive", flush=True)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert "started" in proc.stdout and "still alive" not in proc.stdout, proc.stderr[-2000:]
    assert proc.returncode == CRASH_EXIT, proc.stderr[-2000:]
    assert "the device process exited (code 137)" in proc.stderr
