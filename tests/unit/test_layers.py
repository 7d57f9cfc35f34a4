"""The package layering and the import graph, checked by import inspection.

    vela2 (model library + vela2.wire)  <-  worker   (the GPU side)
                                        <-  producer (the web / bulk side)
    worker, producer                    <-  stack    (demo, parity, the process harness, faults)

The producer and the worker talk only through the wire package, so neither imports the other;
the model library imports neither (nor stack). Inside vela2, `api`, `text` and `wire` import no
torch (the producer loads them), and `model` and `scoring` no Redis; `api` and `text` sit below the
model: of `model`, `scoring` and `train` they import only the calibration (`vela2.model.calibration`,
numpy only). No module imports itself back
through others: no import cycle. Every import statement counts, also those inside functions and
those made with importlib.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("vela2", "worker", "producer", "stack")

# package -> top-level packages of this repo it must never import
FORBIDDEN = {
    "vela2": {"worker", "producer", "stack", "bench", "tests"},
    "worker": {"producer", "stack", "bench", "tests"},
    "producer": {"worker", "stack", "bench", "tests"},
    "stack": {"bench", "tests"},
}
# sub-package -> third-party packages it must never import
FORBIDDEN_LIBS = {
    "vela2/api": {"torch", "transformers", "safetensors", "celery", "kombu"},
    "vela2/text": {"torch", "transformers", "safetensors", "celery", "kombu"},
    "vela2/wire": {"torch", "transformers", "safetensors", "celery"},
    "vela2/model": {"redis", "celery", "kombu"},
    "vela2/scoring": {"redis", "celery", "kombu"},
}
# sub-package -> modules of vela2 it must never import (a module, or any module under it) ...
FORBIDDEN_INTERNAL = {
    "vela2/api": {"vela2.model", "vela2.scoring", "vela2.train"},
    "vela2/text": {"vela2.model", "vela2.scoring", "vela2.train"},
}
# ... but these (and what is under them): the request API and the text layer read calibration.json
ALLOWED_INTERNAL = {"vela2.model.calibration"}


def imported_modules(path: Path, modules: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """Every module an import statement in `path` names (absolute imports; relative ones are the
    file's own package); `from p import m` names p.m too, in case m is a module, and only p.m
    where every name it imports is one of `modules` (p itself then runs as their parent, not as
    the one imported)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{alias.name}" for alias in node.names}
            names.update(subs if subs <= modules else {node.module, *subs})
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
            "import_module",
            "__import__",
        ):
            names.update(a.value for a in node.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return names


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PRODUCT) -> dict[str, set[str]]:
    """module -> the modules of `packages` it imports (anywhere in it)."""
    files = {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    known = frozenset(files)
    return {m: {i for i in imported_modules(p, known) if i in files and i != m} for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: its strongly connected components of more than one module
    (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


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


@pytest.mark.parametrize("package", sorted(FORBIDDEN_LIBS))
def test_a_sub_package_keeps_off_the_libraries_it_must_not_load(package: str) -> None:
    found = [f"{path.relative_to(ROOT)} imports {module}" for path in sorted((ROOT / package).rglob("*.py"))
             for module in sorted(imported_modules(path)) if module.split(".")[0] in FORBIDDEN_LIBS[package]]
    assert found == []


def _under(module: str, prefixes: set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def internal_violations(package: str, root: Path = ROOT) -> list[str]:
    """What the files of `package` (a folder of vela2) import of the modules FORBIDDEN_INTERNAL keeps
    it off, outside ALLOWED_INTERNAL."""
    files = sorted((root / package).rglob("*.py"))
    known = frozenset(module_name(p, root) for p in sorted((root / "vela2").rglob("*.py")))
    return [f"{path.relative_to(root)} imports {module}" for path in files
            for module in sorted(imported_modules(path, known))
            if _under(module, FORBIDDEN_INTERNAL[package]) and not _under(module, ALLOWED_INTERNAL)]


@pytest.mark.parametrize("package", sorted(FORBIDDEN_INTERNAL))
def test_the_request_api_and_text_import_only_the_calibration_of_the_model(package: str) -> None:
    assert internal_violations(package) == []


def test_the_internal_rule_allows_the_calibration_only(tmp_path: Path) -> None:
    (tmp_path / "vela2" / "api").mkdir(parents=True)
    (tmp_path / "vela2" / "model").mkdir()
    for name in ("__init__", "api/__init__", "model/__init__", "model/calibration"):
        (tmp_path / "vela2" / f"{name}.py").write_text("")
    (tmp_path / "vela2" / "api" / "a.py").write_text(
        "from vela2.model import calibration\nfrom vela2.model.calibration import Calibration\n"
        "def f():\n    import importlib\n    importlib.import_module('vela2.scoring.predict')\n")
    assert internal_violations("vela2/api", tmp_path) == ["vela2/api/a.py imports vela2.scoring.predict"]


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from producer.client import Client\n    import importlib\n"
                 "    importlib.import_module('worker.app')\n")
    assert imported_modules(f) >= {"producer.client", "worker.app"}


def test_the_cycle_finder_sees_a_cycle_through_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.c import x\n")
    (pkg / "c.py").write_text("import pkg.a\nx = 1\n")
    (pkg / "d.py").write_text("import pkg.a\n")
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b", "pkg.c"]]
