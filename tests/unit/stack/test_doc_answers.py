"""stack.doc_answers: the docs' example answers compared with, and rewritten from, the demo model's."""

from __future__ import annotations

import json
import shutil

from stack import doc_answers
from stack.doc_answers import ROOT, differences, layout


def test_differences_name_decisions_spans_and_numbers_beyond_rounding():
    real = {"tasks": {"t": {"probs": {"a": 0.9641, "b": 0.0359}, "decision": "a",
                            "spans": [{"label": "email", "start": 22, "end": 37, "score": 0.981}]}},
            "served_by": {"name": "m", "digest": "1", "precision": "fp32"}}
    shown = json.loads(json.dumps(doc_answers.shown_answer(real, {"timings": {"model_ms": 3.0}})))
    assert shown["timings"] == {"model_ms": 3.0} and list(shown)[-1] == "served_by"
    assert differences(shown, real) == []  # rounded, timings shown: still the model's answer
    assert differences({**shown, "served_by": {**shown["served_by"], "digest": "2"}}, real) == []
    moved = json.loads(json.dumps(shown))
    moved["tasks"]["t"]["decision"] = "b"
    moved["tasks"]["t"]["spans"][0]["start"] = 25
    moved["tasks"]["t"]["probs"]["a"] = 0.93
    assert sorted(differences(moved, real)) == [
        "answer.tasks.t.decision: 'b' shown, the model's 'a'",
        "answer.tasks.t.probs.a: 0.93 shown, the model's 0.9641",
        "answer.tasks.t.spans[0].start: 25 shown, the model's 22",
    ]
    assert differences({"tasks": {}}, {"tasks": {}, "extra": 1}) == ["answer: keys ['tasks'] shown, the model's "
                                                                      "['extra', 'tasks']"]


def test_layout_is_the_same_json_within_the_width():
    value = {"a": [{"label": f"l{i}", "start": i, "text": "x" * (i * 7)} for i in range(6)], "b": 1.5, "c": None}
    text = layout(value)
    assert json.loads(text) == value
    assert max(len(line) for line in text.split("\n")) <= doc_answers.WIDTH + 2  # closing brackets may overhang
    assert layout({"short": 1}) == '{"short": 1}'


def test_write_rewrites_a_stale_answer_with_the_models(demo_dir, tmp_path):
    for page in ("README.md", "docs/concepts/systemone.md", "docs/concepts/rows.md", "docs/concepts/answers.md"):
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    block = doc_answers.find_block(tmp_path, "row-result")
    path, first, end = block.path, block.line, block.end
    lines = path.read_text().split("\n")
    stale = json.loads("\n".join(lines[first:end]))
    stale["answers"][0]["decision"] = "none of these"
    path.write_text("\n".join([*lines[:first], json.dumps(stale), *lines[end:]]))
    assert doc_answers.check(demo_dir, tmp_path)["row-result"][0]
    assert path in doc_answers.write(demo_dir, tmp_path)
    assert all(diffs == [] for diffs, _ in doc_answers.check(demo_dir, tmp_path).values())
    assert path.read_text().endswith("\n".join(lines[end:]))  # the rest of the page as it was
