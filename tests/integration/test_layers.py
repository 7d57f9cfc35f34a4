"""The packages' import cost, checked in a fresh Python process: the producer imports neither torch
nor celery, the clients and the wire not even numpy, the worker's settings and the harness no
celery or torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _heavy_after(imports: str, heavy: tuple[str, ...]) -> None:
    code = f"import sys\n{imports}\nfound = [m for m in {heavy!r} if m in sys.modules]\nassert not found, found\n"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.integration  # a python subprocess
def test_the_producer_imports_without_torch_or_celery() -> None:
    _heavy_after("import producer, producer.aio, producer.http.app, producer.backfill, producer.client, "
                 "producer.testing, producer.testing.pytest_plugin",
                 ("torch", "celery", "kombu", "transformers"))


@pytest.mark.integration  # a python subprocess
def test_the_clients_and_the_wire_import_without_numpy() -> None:
    _heavy_after("import producer.client, producer.aio, vela2.wire.keys, vela2.wire.messages, vela2.wire.results",
                 ("torch", "celery", "kombu", "transformers", "numpy"))


@pytest.mark.integration  # a python subprocess
def test_the_worker_settings_and_the_harness_import_without_celery_or_torch() -> None:
    _heavy_after("import worker.settings, worker.cli, stack.harness", ("torch", "celery", "kombu", "transformers"))
