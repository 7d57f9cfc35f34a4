"""`vela2 demo --answer FILE` (stack.demo.answer): the demo model's real answer to a SystemOne request or a
row, computed in-process as a CPU worker computes it: what the docs' example answers are regenerated with."""

from __future__ import annotations

import json

import pytest

from stack import demo

REQUEST = {
    "model": "vela2-demo", "id": "req-9",
    "input": "Hi, my name is Maria Lopez. Where is my package, it has not arrived yet. You can reach me at "
             "maria.lopez12@example.com.",
    "tasks": [
        {"name": "intent", "kind": "choice", "question": "What does the customer want?",
         "options": ["refund", "delivery", "password", "cancel"]},
        {"name": "pii", "kind": "span", "labels": ["person", "email"]},
    ],
}


def test_answer_prints_the_demo_models_answer(demo_dir, tmp_path, capsys):
    path = tmp_path / "request.json"
    path.write_text(json.dumps(REQUEST))
    assert demo.main(["--answer", str(path), "--checkpoint", str(demo_dir)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["status"] == "ok" and got["id"] == "req-9" and "timings" not in got
    assert got["served_by"]["name"] == "vela2-demo" and got["served_by"]["precision"] == "fp32"
    assert got["tasks"]["intent"]["decision"] == "delivery"
    found = {(s["label"], s["text"]) for s in got["tasks"]["pii"]["spans"]}
    assert any(label == "person" and "Maria Lopez" in text for label, text in found), found
    assert any(label == "email" and "@example.com" in text for label, text in found), found
    assert got == demo.answer(REQUEST, demo_dir)  # the same numbers every time


def test_answer_takes_rows_too_and_needs_a_checkpoint(demo_dir, tmp_path, capsys):
    row = {"id": "r1", "task": "set:toxicity", "text": "You are all useless idiots.",
           "questions": [{"question": "Is the message toxic?", "options": ["insult", "threat"]}]}
    got = demo.answer(row, demo_dir)
    assert got["status"] == "ok" and got["answers"][0]["decision"] == ["insult"]
    path = tmp_path / "row.json"
    path.write_text(json.dumps(row))
    with pytest.raises(SystemExit):
        demo.main(["--answer", str(path)])
    assert "--answer needs --checkpoint" in capsys.readouterr().err
