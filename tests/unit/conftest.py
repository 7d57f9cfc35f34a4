"""The unit tests (the fast lane, `make test-fast`): no process is started here. A test that starts
one (a subprocess, a multiprocessing child; torch.compile on a CPU runs g++) fails, naming
tests/integration as its place."""

from __future__ import annotations

import multiprocessing.process
import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a unit test starts no process: a test that needs one belongs in tests/integration")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    yield
