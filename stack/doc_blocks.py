"""The fenced blocks of README.md and the docs site, with the marker on the line before each
(developer tooling: the docs' tests and `stack.doc_answers` read pages through this one parser).

The markers (HTML comments: invisible on the site):

- `<!-- example: KIND -->`: a test runs or checks the block (tests/unit/test_docs.py's KINDS);
- `<!-- not-run: REASON -->`: shown, never run; REASON says why.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER_RE = re.compile(r"<!-- (example|not-run): (.*?) -->")
FENCE_RE = re.compile(r"^( *)(```|~~~)\s*([\w-]*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its marker (`example` / `not-run` and the kind or reason, or None),
    the code (dedented when the block is indented) and where it is: its lines are the page's
    lines[line:end] (0-based; `line` is also the 1-based line of the opening fence)."""

    path: Path
    line: int
    end: int
    marker: tuple[str, str] | None
    code: str


def pages(root: Path = ROOT) -> list[Path]:
    """README.md, then every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a markdown file, each with the marker on the line before it.
    Raises ValueError naming the line of a block that never closes."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found, i = [], 0
    while i < len(lines):
        opened = FENCE_RE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, fence = opened.group(1), opened.group(2)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise ValueError(f"{path}:{i + 1}: a fenced block that never closes")
        marked = MARKER_RE.fullmatch(lines[i - 1].strip()) if i else None
        code = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(path, i + 1, end, (marked.group(1), marked.group(2)) if marked else None,
                           textwrap.dedent(code) if indent else code))
        i = end + 1
    return found


def marked(kind: str, root: Path = ROOT) -> list[Block]:
    """The blocks marked `example: kind` in README.md and docs/, in order."""
    return [b for path in pages(root) for b in blocks(path) if b.marker == ("example", kind)]
