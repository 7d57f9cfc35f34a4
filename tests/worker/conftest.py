"""Worker processes for the integration tests: `python -m celery -A worker.app worker` on the demo
checkpoint against a fixture redis-server, configured through VELA2_* variables only (the plain
Celery start path)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import pytest

from worker.app import ENV
from worker.demo import worker_command

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 120.0  # import + model load + warm-up batches on a busy 2-core runner

# Small, fast settings for the tiny demo model on CPU.
TEST_SETTINGS = {"max_batch_tokens": 2048, "max_wait_ms": 10, "render_threads": 1, "shutdown_timeout_s": 30}


@dataclass
class WorkerProcess:
    """One worker subprocess and its log file."""

    name: str
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> WorkerProcess:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if " ready." in self.log():
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"worker {self.name} exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            time.sleep(0.05)
        raise AssertionError(f"worker {self.name} not ready after {timeout_s} s:\n{self.log()[-4000:]}")

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {self.name} still running:\n{self.log()[-4000:]}") from None

    def terminate(self, timeout_s: float = 60.0) -> int:
        """Warm shutdown (SIGTERM); returns the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout_s)

    def kill(self) -> None:
        """SIGKILL: nothing is finished, acked or returned."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


@pytest.fixture
def start_worker(tmp_path: Path, demo_dir: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """start_worker(redis_url, env={...}, **settings) -> a started (not yet ready) WorkerProcess."""
    started: list[WorkerProcess] = []
    numbers = count(1)

    def start(redis_url: str, *, env: dict[str, str] | None = None, **settings: object) -> WorkerProcess:
        name = f"w{next(numbers)}"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("VELA2_")}
        environ.update({ENV["redis_url"]: redis_url, ENV["checkpoint"]: str(demo_dir)})
        for key, value in {**TEST_SETTINGS, **settings}.items():
            environ[ENV[key]] = str(value)
        environ.update(env or {})
        environ["PYTHONPATH"] = str(ROOT)
        log_path = tmp_path / f"{name}.log"
        cmd = worker_command(f"{name}@%h")
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(cmd, env=environ, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        w = WorkerProcess(name, proc, log_path)
        started.append(w)
        return w

    yield start
    for w in started:
        if w.proc.poll() is None:
            w.kill()
