"""README.md and the docs site (docs/, mkdocs.yml) without a process: every fenced block is marked as an
example a test runs or as not run (with a reason), every example kind has its test, the nav lists
every page, the README stays a front page, and the examples that need no process are valid (the
SystemOne request and the shape of its answer, a row, a result, a cells file).

The markers, on the line right before a block (HTML comments: invisible on the site):

- `<!-- example: KIND -->`: the test named in KINDS runs or checks the block (`examples(KIND)`);
- `<!-- not-run: REASON -->`: shown, never run; REASON says why (`output`, a shape that is no program,
  or what it needs that a test cannot have: a GPU, a deployment, minutes of training).
"""

from __future__ import annotations

import json
import re

from stack.doc_blocks import ROOT, blocks, marked, pages

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"  # in examples: the tests put their own Redis's URL there
KINDS = {  # example kind -> the test that runs or checks its blocks (each calls examples(KIND))
    "pytest": "tests/integration/test_docs.py",
    "script": "tests/integration/test_docs.py",
    "quickstart-worker": "tests/integration/test_docs.py",
    "quickstart-request": "tests/integration/test_docs.py",
    "quickstart-output": "tests/integration/test_docs.py",
    "byom": "tests/integration/vela2/train/test_using_a_real_model.py",
    "openai": "tests/integration/producer/http/test_openai_sdk.py",
    "systemone-request": "tests/unit/test_docs.py",
    "systemone-answer": "tests/unit/test_docs.py",
    "row": "tests/unit/test_docs.py",
    "row-result": "tests/unit/test_docs.py",
    "cells-file": "tests/unit/test_docs.py",
}
README_MAX_LINES = 250


def examples(kind: str) -> list[str]:
    """The example blocks of one kind in README.md and docs/, in order."""
    found = [b.code for b in marked(kind, ROOT)]
    assert found, f"README.md and docs/ have no example of kind {kind!r}"
    return found


def test_every_fenced_block_is_an_example_or_says_why_it_is_not_run():
    problems = []
    for path in pages():
        for b in blocks(path):
            where = f"{path.relative_to(ROOT)}:{b.line}"
            if b.marker is None:
                problems.append(f"{where}: no <!-- example: KIND --> or <!-- not-run: REASON --> on the line before")
            elif b.marker[0] == "example" and b.marker[1] not in KINDS:
                problems.append(f"{where}: unknown example kind {b.marker[1]!r} (known: {sorted(KINDS)})")
            elif b.marker[0] == "not-run" and len(b.marker[1].strip()) < 6:
                problems.append(f"{where}: a not-run block needs its reason")
    assert problems == []


def test_every_example_kind_is_used_and_read_by_its_test():
    used = {b.marker[1] for path in pages() for b in blocks(path) if b.marker and b.marker[0] == "example"}
    assert used == set(KINDS)
    for kind, test in KINDS.items():
        assert f'examples("{kind}")' in (ROOT / test).read_text(encoding="utf-8"), (kind, test)


def test_the_parser_sees_indented_blocks_and_their_markers(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("1. a step:\n\n    <!-- example: row -->\n    ```json\n    {\"a\": 1}\n    ```\n\n"
                    "```\nno marker\n```\n", encoding="utf-8")
    found = blocks(page)
    assert [(b.marker, b.code) for b in found] == [(("example", "row"), '{"a": 1}\n'), (None, "no marker\n")]


def _nav_pages(nav: list) -> list[str]:
    out = []
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_the_nav_lists_every_page_under_docs_once():
    import yaml

    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    on_disk = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == on_disk and len(nav) == len(set(nav))


def test_the_readme_is_a_front_page_and_no_page_shows_an_install_from_pypi():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    for heading in ("## Install", "## Quickstart"):
        assert heading in readme
    for path in pages():  # vela2 is not published: installs name a checkout or a built wheel
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"pip install [\"']?vela2\b", text), path.relative_to(ROOT)


def test_the_row_and_result_examples_are_valid():
    from vela2.api.schemas import RowResult, parse_row

    [row], [result] = examples("row"), examples("row-result")
    parsed = parse_row(json.loads(row))
    assert RowResult.model_validate(json.loads(result)).id == parsed.id


def test_the_cells_file_example_parses():
    from vela2.wire.cells import parse_cells

    [doc] = examples("cells-file")
    assert [cell.name for cell in parse_cells(json.loads(doc)).cells] == ["a", "b"]


def test_the_systemone_example_is_a_valid_request_and_answer():
    import jsonschema_rs

    from vela2.api.systemone import SCHEMA_DIR, SCHEMA_FILES, SystemOneAnswer, parse_request

    [request_text], [answer_text] = examples("systemone-request"), examples("systemone-answer")
    request, answer = json.loads(request_text), json.loads(answer_text)
    parse_request(request)
    for name, doc in (("request", request), ("answer", answer)):
        schema = json.loads((SCHEMA_DIR / SCHEMA_FILES[name]).read_text(encoding="utf-8"))
        assert jsonschema_rs.validator_for(schema).is_valid(doc), name
    SystemOneAnswer.model_validate(answer)
    for task in answer["tasks"].values():
        for span in task.get("spans", []):
            assert request["input"][span["field"]][span["start"] : span["end"]] == span["text"]


def test_every_answer_shown_is_the_demo_models_real_answer(demo_dir):
    """The SystemOne answer and the row result the pages show are the demo model's answers to the request
    and the row they show (stack.doc_answers: decisions and spans exact, numbers to their rounding)."""
    from stack import doc_answers

    checked = doc_answers.check(demo_dir)
    assert set(checked) == set(doc_answers.PAIRS)
    stale = {kind: f"{diffs}\nthe block should read:\n{text}" for kind, (diffs, text) in checked.items() if diffs}
    assert not stale, "\n".join(f"{k}: {v}" for k, v in stale.items()) + "\n(python -m stack.doc_answers --write)"


def test_a_worker_gives_the_systemone_example_its_answer(vela2_redis, demo_dir):
    """Sent through the producer to a worker (FakeWorker on the demo model), the example request gets the
    answer shown (the worker's numbers are predict()'s)."""
    from producer import Client
    from producer.testing import FakeWorker
    from stack.doc_answers import differences

    request, shown = json.loads(examples("systemone-request")[0]), json.loads(examples("systemone-answer")[0])
    client = Client(redis=vela2_redis.client(), model=request["model"])
    with FakeWorker(vela2_redis.client(), answer="model", checkpoint=demo_dir):
        real = client.answer(client.submit(request), timeout_s=60)
    assert differences(shown, real) == []
