"""Fixtures of the producer tests: the shipped fake worker (producer.testing.FakeWorker, in a
thread) on a real redis-server, a real worker process on the demo checkpoint, and a real
`vela2 http` server process.

The fake worker decodes messages with the real decoder and writes results with the real result
writer, so clients and backfill see exactly what a worker would leave in Redis, thousands of rows a
second; in a thread it rides out a Redis restart (a failed take is retried, and the results of a
message it holds are written once Redis is back).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from producer.testing import FakeWorker
from stack.harness import ROOT, WorkerProcess, child_env, free_port

MODEL = "vela2-demo"
WORKER_SETTINGS = {"max_batch_tokens": 2048, "max_wait_ms": 10, "render_threads": 1, "shutdown_timeout_s": 30}


@pytest.fixture
def fake_worker(redis_url: str) -> Iterator[Callable[..., FakeWorker]]:
    """fake_worker(**kw) -> a FakeWorker answering from a thread on the test's Redis, or on `url=`
    (keywords as FakeWorker's; stopped after the test)."""
    started: list[FakeWorker] = []

    def start(url: str | None = None, **kw: Any) -> FakeWorker:
        w = FakeWorker(url or redis_url, model=kw.pop("model", MODEL), **kw).start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.fixture
def real_worker(tmp_path: Path, demo_dir: Path) -> Iterator[Callable[[str], WorkerProcess]]:
    """real_worker(redis_url) -> a ready `celery -A worker.app worker` process on the demo checkpoint."""
    started: list[WorkerProcess] = []

    def start(redis_url: str) -> WorkerProcess:
        w = WorkerProcess.start(redis_url, demo_dir, tmp_path / f"worker{len(started)}.log", **WORKER_SETTINGS)
        started.append(w)
        return w.wait_ready()

    yield start
    WorkerProcess.stop_all(started, 30)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """http_server(redis_url, *args) -> base URL of a running `python -m producer.http.app` process
    (on loopback with --no-auth unless `args` name API keys)."""
    procs: list[subprocess.Popen] = []

    def start(redis_url: str, *args: str) -> str:
        port = free_port()
        log_path = tmp_path / f"http{len(procs)}.log"
        cmd = [sys.executable, "-m", "producer.http.app", "--redis", redis_url, "--port", str(port), "--model", MODEL]
        if "--api-keys-file" not in args:
            cmd.append("--no-auth")
        with open(log_path, "wb") as out:
            proc = subprocess.Popen([*cmd, *args], env=child_env(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/openapi.json", timeout=1)
                return base
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the http server did not start:\n{log_path.read_text()[-3000:]}") from None
                time.sleep(0.05)

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
