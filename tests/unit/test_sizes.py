"""The house rules of size, over the product code (vela2, worker, producer, stack): no module over
MAX_MODULE_LINES lines, no class over MAX_CLASS_LINES, no function over MAX_FUNCTION_LINES (their
docstrings and comments count: what a reader has to read). A newcomer finds one concept per module
and reads any function on one screen."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("vela2", "worker", "producer", "stack")
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 60


def oversized(path: Path) -> list[str]:
    """What in one file is over its limit, one line each (path:line name: n lines, limit)."""
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{where}: {lines} lines (modules: {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            if n > limit:
                kind = "classes" if isinstance(node, ast.ClassDef) else "functions"
                found.append(f"{where}:{node.lineno} {node.name}: {n} lines ({kind}: {limit})")
    return found


@pytest.mark.parametrize("package", PRODUCT)
def test_nothing_is_over_its_size(package: str) -> None:
    found = [line for path in sorted((ROOT / package).rglob("*.py")) for line in oversized(path)]
    assert found == []


def test_the_rule_sees_a_long_function_in_a_class(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    f = tmp_path / "m.py"
    f.write_text(f"class A:\n    def f(self):\n{body}\n")
    assert oversized(f) == [f"{f}:2 f: {MAX_FUNCTION_LINES + 1} lines (functions: {MAX_FUNCTION_LINES})"]
