"""The docs' reference blocks generated from the code, where the code is the truth (developer
tooling: the docs site, not the product):

- `settings`: the worker settings table (`worker.settings.markdown_table`), in docs/reference/settings.md;
- `cli`: every command's `--help` (`vela2 --help`, each subcommand's, their subcommands'), in
  docs/reference/cli.md;
- `http`: the HTTP route's paths, methods, parameters and status codes from its OpenAPI document
  (`producer.http.app.create_app(...).openapi()`), in docs/reference/http.md.

    python -m stack.docs_gen --write   # rewrite every generated block
    python -m stack.docs_gen --check   # exit 1 naming each stale page (tests/unit/stack/test_docs_gen.py)

A page keeps its own prose: only the lines between `<!-- generated: NAME ... -->` and
`<!-- /generated -->` are rewritten. Everything is made in a clean environment (no VELA2_* or
REDIS* variables, 100 columns), so a default that comes from the environment never reaches a page.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = "100"  # argparse wraps --help to $COLUMNS: fixed, so the page does not follow the terminal
END = "<!-- /generated -->"


def marker(name: str) -> str:
    """The line that opens the generated block `name`."""
    return f"<!-- generated: {name} (python -m stack.docs_gen --write) -->"


@contextlib.contextmanager
def clean_environment() -> Iterator[None]:
    """No VELA2_* / REDIS* variables and a fixed width while the block is made; restored after."""
    saved = dict(os.environ)
    try:
        for name in [k for k in os.environ if k.startswith(("VELA2_", "REDIS"))]:
            del os.environ[name]
        os.environ["COLUMNS"] = COLUMNS
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def settings_block() -> str:
    """The worker settings table."""
    from worker.settings import markdown_table

    return markdown_table()


def help_text(argv: list[str]) -> str:
    """What `vela2 ARGV --help` prints, run in this process."""
    from vela2.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main([*argv, "--help"])
        except SystemExit:  # argparse exits after printing the help
            pass
    return out.getvalue().rstrip() + "\n"


def _subcommands(text: str) -> list[str]:
    """The subcommands a help text lists under its positional arguments (the line `  {submit,status,...}`;
    an option's choices follow the option's name, never start a line), in order."""
    found = re.search(r"^  \{([\w,-]+)\}$", text, re.MULTILINE)
    return found.group(1).split(",") if found else []


def cli_block() -> str:
    """`vela2 --help`, then each subcommand's help (and its own subcommands'), in the order listed."""
    parts = []
    todo: list[list[str]] = [[]]
    while todo:
        argv = todo.pop(0)
        if len(argv) > 2:  # vela2 jobs submit is as deep as commands go; deeper is a parsing mistake
            raise RuntimeError(f"vela2 {' '.join(argv)}: subcommands nested deeper than two")
        text = help_text(argv)
        title = " ".join(["vela2", *argv])
        parts.append(f"### `{title}`\n\n<!-- not-run: output -->\n```text\n{text}```\n")
        todo[:0] = [[*argv, sub] for sub in _subcommands(text)]
    return "\n".join(parts).rstrip()


def _number(value: float) -> str:
    """60.0 as `60`, 0.5 as `0.5`."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _bounds(schema: dict[str, Any]) -> str:
    """A parameter schema's bounds (`>= 0; <= 60`, a length, the values allowed; an anyOf with null unwrapped)."""
    for option in schema.get("anyOf", []):
        if option.get("type") != "null":
            schema = option
    parts = [f"{word} {_number(schema[key])}" for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                                 ("maximum", "<="), ("exclusiveMaximum", "<"))
             if key in schema]
    if "maxLength" in schema:
        parts.append(f"at most {schema['maxLength']} characters")
    if "enum" in schema:
        parts.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"]))
    return "; ".join(parts)


def _body(op: dict[str, Any]) -> list[str]:
    """The lines naming the request body's content types (and named schema); none without a body."""
    kinds = []
    for content_type, media in op.get("requestBody", {}).get("content", {}).items():
        ref = media.get("schema", {}).get("$ref", "")
        kinds.append(f"`{content_type}`" + (f" (`{ref.rsplit('/', 1)[1]}`)" if ref else ""))
    return ["Body: " + ", ".join(kinds), ""] if kinds else []


def _operation(path: str, method: str, op: dict[str, Any]) -> str:
    """One operation: a heading, its summary and description, parameters, body, status codes."""
    lines = [f"### `{method.upper()} {path}`", "", op.get("summary", "").rstrip(".") + "."]
    if op.get("description"):
        lines += ["", op["description"].strip()]
    lines.append("")
    params = []
    for p in op.get("parameters", []):
        bounds = _bounds(p.get("schema", {}))
        params.append(f"- `{p['name']}` ({p['in']}{', required' if p.get('required') else ''})"
                      + (f": {p['description']}" if p.get("description") else "") + (f" ({bounds})" if bounds else ""))
    if params:
        lines += ["Parameters:", "", *params, ""]
    lines += [*_body(op), "| status | when |", "|---|---|"]
    for code, response in sorted(op.get("responses", {}).items()):
        lines.append(f"| {code} | {response.get('description', '').replace('|', '/')} |")
    return "\n".join(lines)


def http_block() -> str:
    """Every path and method of the route's OpenAPI document (a route built for the demo model, no
    keys: the document does not depend on them), in the document's order."""
    from producer.http.app import create_app

    doc = create_app(keys=None).openapi()
    ops = [_operation(path, method, op) for path, methods in doc["paths"].items() for method, op in methods.items()]
    return "\n\n".join(ops)


BLOCKS: dict[str, tuple[str, Callable[[], str]]] = {  # name -> (page under ROOT, its block)
    "settings": ("docs/reference/settings.md", settings_block),
    "cli": ("docs/reference/cli.md", cli_block),
    "http": ("docs/reference/http.md", http_block),
}


def with_block(text: str, name: str, body: str) -> str:
    """`text` with its generated block `name` replaced by `body`; ValueError when it has none."""
    start = marker(name) + "\n"
    head, found, rest = text.partition(start)
    if not found or END not in rest:
        raise ValueError(f"no generated block {name!r}: add the lines {start.strip()!r} and {END!r}")
    return head + start + body.rstrip() + "\n" + END + rest.split(END, 1)[1]


def updated_pages(root: Path = ROOT) -> dict[Path, tuple[str, str]]:
    """Each page with a generated block: (its text now, its text regenerated)."""
    pages: dict[Path, tuple[str, str]] = {}
    with clean_environment():
        for name, (page, make) in BLOCKS.items():
            path = root / page
            if path not in pages:
                text = path.read_text(encoding="utf-8")
                pages[path] = (text, text)
            now, new = pages[path]
            pages[path] = (now, with_block(new, name, make()))
    return pages


def main(argv: list[str] | None = None) -> int:
    """`--write` rewrites the stale pages; `--check` exits 1 naming them."""
    argv = sys.argv[1:] if argv is None else argv
    if argv not in (["--write"], ["--check"]):
        print("usage: python -m stack.docs_gen (--write | --check)", file=sys.stderr)
        return 2
    stale = {path: new for path, (now, new) in updated_pages().items() if now != new}
    for path, new in stale.items():
        if argv == ["--write"]:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
        else:
            print(f"stale: {path.relative_to(ROOT)} (run: python -m stack.docs_gen --write)", file=sys.stderr)
    return 1 if stale and argv == ["--check"] else 0


if __name__ == "__main__":
    sys.exit(main())
