"""The package layering, checked by import inspection.

    vela2 (model library + vela2.wire)  <-  worker   (the GPU side)
                                        <-  producer (the web / bulk side)
    worker, producer                    <-  stack    (demo, parity, the process harness)

The producer and the worker talk only through the wire package, so neither imports the other;
the model library imports neither (nor stack), and the producer and the wire load without torch.
Every import statement counts, also those inside functions.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> top-level packages of this repo it must never import
FORBIDDEN = {
    "vela2": {"worker", "producer", "stack", "bench", "tests"},
    "worker": {"producer", "stack", "bench", "tests"},
    "producer": {"worker", "stack", "bench", "tests"},
    "stack": {"bench", "tests"},
}


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement in `path` names (absolute imports; relative ones are the
    file's own package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
            "import_module",
            "__import__",
        ):
            names.update(a.value for a in node.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return names


def violations(package: str) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for module in imported_modules(path):
            if module.split(".")[0] in FORBIDDEN[package]:
                found.append(f"{path.relative_to(ROOT)} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_only_the_layers_below_it(package: str) -> None:
    assert violations(package) == []


def test_the_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from producer.client import Client\n    import importlib\n"
                 "    importlib.import_module('worker.app')\n")
    assert imported_modules(f) >= {"producer.client", "worker.app"}


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
