"""The generated reference pages (stack.docs_gen): fresh, made without the environment's defaults, and
a page without its block says which lines to add."""

from __future__ import annotations

import os

import pytest

from stack import docs_gen


def test_the_generated_reference_pages_are_fresh():
    stale = [str(path.relative_to(docs_gen.ROOT)) for path, (now, new) in docs_gen.updated_pages().items()
             if now != new]
    assert stale == [], "stale: run `.venv/bin/python -m stack.docs_gen --write`"
    assert docs_gen.main(["--check"]) == 0


def test_the_help_pages_list_every_command_and_no_default_from_the_environment(monkeypatch):
    monkeypatch.setenv("VELA2_REDIS_URL", "redis://from-the-environment.example:6379/0")
    monkeypatch.setenv("COLUMNS", "40")
    with docs_gen.clean_environment():
        text = docs_gen.cli_block()
        assert "VELA2_REDIS_URL" not in os.environ and os.environ["COLUMNS"] == docs_gen.COLUMNS
    assert os.environ["VELA2_REDIS_URL"] == "redis://from-the-environment.example:6379/0"  # restored
    assert "from-the-environment" not in text
    for command in ("vela2", "vela2 worker", "vela2 http", "vela2 jobs submit", "vela2 cells add", "vela2 train"):
        assert f"### `{command}`\n" in text, command
    assert "default: redis://127.0.0.1:6379/0" in text


def test_the_http_page_has_every_route_and_its_codes():
    text = docs_gen.http_block()
    for heading in ("### `POST /v1/system_one`", "### `GET /v1/results/{request_id}`", "### `POST /v1/batches`",
                    "### `GET /readyz`"):
        assert heading in text
    assert "| 409 |" in text and "`wait_s` (query)" in text


def test_a_page_without_its_block_is_refused_with_the_lines_to_add():
    with pytest.raises(ValueError, match="generated: settings"):
        docs_gen.with_block("# Settings\n", "settings", "| table |")
    page = "# S\n\n{start}\n{body}\n{end}\n\nafter\n"
    fill = {"start": docs_gen.marker("settings"), "end": docs_gen.END}
    assert docs_gen.with_block(page.format(body="old", **fill), "settings", "new") == page.format(body="new", **fill)


def test_the_command_line_takes_write_or_check_only(capsys):
    assert docs_gen.main([]) == 2 and docs_gen.main(["--write", "--check"]) == 2
    assert "usage" in capsys.readouterr().err
