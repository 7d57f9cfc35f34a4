"""The README's examples that need no process: every marked block has a known kind, and the SystemOne
example is a valid request with the shape of its answer (the validators, the JSON Schemas)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_RE = re.compile(r"<!-- example: ([\w-]+) -->\n```\w+\n(.*?)```", re.DOTALL)


def examples(kind: str) -> list[str]:
    """The README's example blocks of one kind, in order."""
    found = [code for k, code in EXAMPLE_RE.findall((ROOT / "README.md").read_text(encoding="utf-8")) if k == kind]
    assert found, f"the README has no example of kind {kind!r}"
    return found


def test_every_marked_block_has_a_known_kind():
    kinds = {k for k, _ in EXAMPLE_RE.findall((ROOT / "README.md").read_text(encoding="utf-8"))}
    assert kinds == {"pytest", "script", "systemone-request", "systemone-answer", "openai"}


def test_the_systemone_example_is_a_valid_request_and_the_shape_of_its_answer(vela2_redis, demo_dir):
    import jsonschema_rs

    from producer import Client
    from producer.testing import FakeWorker
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
    client = Client(redis=vela2_redis.client(), model=request["model"])
    with FakeWorker(vela2_redis.client(), answer="model", checkpoint=demo_dir):
        real = client.answer(client.submit(request), timeout_s=60)
    assert real["status"] == "ok" and list(real) == list(answer)
    assert list(real["tasks"]) == list(answer["tasks"])
    for name, task in answer["tasks"].items():
        got = real["tasks"][name]
        assert (got["kind"], set(got), set(got["probs"])) == (task["kind"], set(task), set(task["probs"])), name
        assert type(got.get("decision")) is type(task.get("decision")), name
