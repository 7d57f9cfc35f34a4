"""Worker processes for the integration tests: the harness's WorkerProcess (`python -m celery -A
worker.app worker`, the plain Celery start path) on the demo checkpoint against a fixture
redis-server, configured through VELA2_* variables only."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path

import pytest

from stack.harness import WorkerProcess

# Small, fast settings for the tiny demo model on CPU.
TEST_SETTINGS = {"max_batch_tokens": 2048, "max_wait_ms": 10, "render_threads": 1, "shutdown_timeout_s": 30}


@pytest.fixture
def start_worker(tmp_path: Path, demo_dir: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """start_worker(redis_url, env={...}, faults=Faults(...), **settings) -> a started (not yet ready)
    WorkerProcess."""
    started: list[WorkerProcess] = []
    numbers = count(1)

    def start(redis_url: str, *, env: dict[str, str] | None = None, **settings: object) -> WorkerProcess:
        name = f"w{next(numbers)}"
        w = WorkerProcess.start(redis_url, demo_dir, tmp_path / f"{name}.log", name=name, env=env,
                                **{**TEST_SETTINGS, **settings})
        started.append(w)
        return w

    yield start
    for w in started:
        w.kill()
