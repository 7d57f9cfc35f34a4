"""Running the suite: each scenario in its own processes (an exception is a failed check, never a
crash), `--repeat` runs over, beside `--cpu-hog` busy-loop processes, then the fuzz and the soak;
the report lists every run's outcome, never only the best."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.faults import registry
from bench.faults.context import BASE_SETTINGS, Suite, demo_model, log
from bench.faults.report import Outcome, summarize


def run_scenario(s: Suite, name: str, run: int = 1) -> Outcome:
    """Run one scenario in its own processes; an exception becomes a failed check, never a crash."""
    out = Outcome(name, run=run)
    t0 = time.monotonic()
    log.info("scenario %s (run %d) ...", name, run)
    try:
        registry.table(bool(s.amqp_server))[name](s, out)
    except Exception as e:
        log.exception("scenario %s raised", name)
        out.check("the scenario ran to the end", False, f"{type(e).__name__}: {str(e)[:1500]}")
    finally:
        s.cleanup()
    out.seconds = round(time.monotonic() - t0, 1)
    log.info(
        "scenario %s (run %d): %d requests, ok %d, error %d, expired %d, lost %d, changed %d in %.1f s (%s)",
        name,
        run,
        out.requests,
        out.answered_ok,
        out.answered_error,
        out.expired,
        out.lost,
        out.duplicate_answers_changed,
        out.seconds,
        "passed" if out.to_json()["passed"] else "FAILED",
    )
    return out


HOG_MAX_S = 4 * 3600.0  # a CPU hog ends itself after this long, whatever happens to the suite
_HOG = "import time\nend = time.monotonic() + {max_s}\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def cpu_hogs(k: int, max_s: float = HOG_MAX_S) -> Iterator[list[Any]]:
    """`k` busy-loop processes beside the suite (each one core's worth of competition), stopped by
    their pid when the block ends; each also ends itself after `max_s` and dies with this process."""
    from stack.harness import die_with_parent

    procs = [
        subprocess.Popen([sys.executable, "-c", _HOG.format(max_s=float(max_s))], preexec_fn=die_with_parent,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(max(0, k))
    ]
    if procs:
        log.info("CPU hogs running: pids %s", [x.pid for x in procs])
    try:
        yield procs
    finally:
        for x in procs:
            if x.poll() is None:
                x.terminate()
        for x in procs:
            try:
                x.wait(10)
            except subprocess.TimeoutExpired:
                x.kill()
                x.wait(10)


@contextmanager
def suite(checkpoint: str | None, scale: float, device: str, keep: bool = False,
          settings: dict[str, Any] | None = None) -> Iterator[Suite]:
    """A scratch directory and the demo checkpoint (written once, unless one is given); `settings`
    are the workers' (Suite.settings)."""
    import vela2

    tmp = Path(tempfile.mkdtemp(prefix="vela2-faults-"))
    try:
        ckpt = Path(checkpoint) if checkpoint else vela2.init_demo(tmp / "demo")
        s = Suite(tmp, Path(ckpt), scale=scale, device=device, settings=settings)
        try:
            yield s
        finally:
            s.cleanup()
    finally:
        if keep:
            log.info("logs kept in %s", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run(
    names: list[str],
    *,
    scale: float = 1.0,
    checkpoint: str | None = None,
    device: str = "cpu",
    fuzz_examples: int = 500,
    soak_minutes: float = 0.0,
    keep: bool = False,
    repeat: int = 1,
    cpu_hog: int = 0,
    amqp_server: str | None = None,
    worker_settings: dict[str, Any] | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Run the named scenarios `repeat` times over (beside `cpu_hog` busy-loop processes), then
    fuzz and soak; returns the report, which lists every run's outcome (never only the best).
    `amqp_server` (amqp://user:pw@host:port of this host's RabbitMQ): run AMQP_SCENARIOS there.
    `worker_settings`: added to every worker's BASE_SETTINGS. `command`: how the run was asked for."""
    settings = {**BASE_SETTINGS, **(worker_settings or {})}
    report: dict[str, Any] = {
        "scale": scale,
        "device": device,
        "repeat": repeat,
        "cpu_hog": cpu_hog,
        "worker_settings": dict(settings),
        "broker": "amqp" if amqp_server else "redis",
        "command": command or "python -m bench.faults " + " ".join(sys.argv[1:]),
        "scenarios": [],
    }
    t0 = time.monotonic()
    with suite(checkpoint, scale, device, keep, settings) as s, cpu_hogs(cpu_hog):
        s.amqp_server = amqp_server
        for k in range(1, max(1, repeat) + 1):
            for name in names:
                report["scenarios"].append(run_scenario(s, name, run=k).to_json())
        if fuzz_examples > 0:
            from bench.faults.fuzz import run_fuzz

            report["fuzz"] = run_fuzz(demo_model(s.checkpoint), fuzz_examples)
        if soak_minutes > 0:
            from bench.faults.soak import run_soak

            report["soak"] = run_soak(s, soak_minutes)
    report["seconds"] = round(time.monotonic() - t0, 1)
    return summarize(report)
