"""SystemOne requests: schema, validation, rendering into one bundled row, 1:1 answers from predict()."""

from __future__ import annotations

import copy
import json
import math
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vela2.api.schemas import Answer, ErrorInfo, RowResult, SpanOut, Status, content_id
from vela2.api.systemone import (
    SCHEMA_DIR,
    SCHEMA_FILES,
    SystemOneAnswer,
    check_model,
    error_answer,
    is_system_one,
    main,
    parse_request,
    render_input,
    schema_texts,
    to_answer,
    to_row,
)
from vela2.config import LIMITS
from vela2.errors import InvalidRequest, LimitExceeded, ModelMismatch, Vela2Error
from vela2.model.calibration import DEFAULT_QUESTIONS, Calibration
from vela2.scoring.systemone import predict_mixed, system_one_request

MODEL = "vela2-demo"
STATE = {
    "user": "Hi, I am Alice Smith and my email is alice@example.com. Can you cancel my order 4471?",
    "assistant": "Sure Alice, order 4471 is cancelled. Anything else for Acme Corp today?",
    "context": "Support chat, channel web, agent Bob Jones, 2026-10-03.",
}


def req(**kw: Any) -> dict[str, Any]:
    """A valid request (free text, one choice task) with `kw` replacing its top-level keys."""
    base: dict[str, Any] = {
        "model": MODEL,
        "id": "req-1",
        "input": "The parcel arrived two days late and the box was crushed.",
        "tasks": [{"name": "sentiment", "kind": "choice", "options": ["positive", "negative"]}],
    }
    base.update(kw)
    return base


def task(kind: str, name: str = "t", **kw: Any) -> dict[str, Any]:
    """A valid task of `kind` with `kw` replacing (or adding) its keys."""
    items = {"options": ["a", "b"]} if kind in ("choice", "score", "set") else {"labels": ["x", "y"]}
    return {**{"name": name, "kind": kind, **items}, **kw}


def stub_model(name: str = MODEL) -> SimpleNamespace:
    """What system_one_request reads of a model before predict(): enough for requests refused early."""
    return SimpleNamespace(name=name, calibration=Calibration())


# --- parsing -----------------------------------------------------------------------------------


def test_parse_valid_request_defaults() -> None:
    r = parse_request(
        req(tasks=[task(k, name=k) for k in ("choice", "score", "set", "span", "classify", "extract")])
    )
    assert r.version == "1" and r.units is False and r.id == "req-1"
    assert [t.kind for t in r.tasks] == ["choice", "score", "set", "span", "classify", "extract"]
    assert [t.row_task for t in r.tasks] == [
        "choice:choice",
        "score:score",
        "set:set",
        "span:span",
        "choice:classify",
        "span:extract",
    ]


def test_missing_or_null_id_gets_the_content_id() -> None:
    obj = req()
    del obj["id"]
    a = parse_request(obj)
    assert a.id == content_id(obj) and a.id.startswith("h-")
    assert parse_request({**obj, "id": None}).id == a.id
    assert parse_request(copy.deepcopy(obj)).id == a.id  # deterministic
    assert parse_request({**obj, "input": "other text"}).id != a.id


def test_is_system_one_tells_requests_from_rows() -> None:
    assert is_system_one(req())
    assert is_system_one(parse_request(req()))
    row = {"id": "r", "task": "choice:x", "text": "t", "questions": [{"options": ["a", "b"]}]}
    assert not is_system_one(row)
    assert not is_system_one({"model": MODEL, "input": "x"})  # no tasks: a (bad) row, not SystemOne
    assert not is_system_one([req()])


def _many(n: int, prefix: str = "l") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


# (request, error class, substrings the message must contain)
BAD_REQUESTS = {
    "unknown kind": (
        req(tasks=[{**task("choice"), "kind": "summarize"}]),
        InvalidRequest,
        ["unknown kind 'summarize'"],
    ),
    "empty labels": (
        req(tasks=[task("span", name="pii", labels=[])]),
        InvalidRequest,
        ["'pii'", "labels is empty"],
    ),
    "empty classify labels": (req(tasks=[task("classify", labels=[])]), InvalidRequest, ["labels is empty"]),
    "empty options": (req(tasks=[task("set", options=[])]), InvalidRequest, ["options is empty"]),
    "field not in input": (
        req(input=STATE, tasks=[task("span", name="pii", fields=["user", "email"])]),
        InvalidRequest,
        ["tasks[0] 'pii'", "field 'email' is not in input", "user, assistant, context"],
    ),
    "fields over free text": (
        req(tasks=[task("span", fields=["user"])]),
        InvalidRequest,
        ["fields given but input is free text"],
    ),
    "duplicate task names": (
        req(tasks=[task("choice", name="a"), task("set", name="a")]),
        InvalidRequest,
        ["tasks[1]", "duplicate task name 'a'"],
    ),
    "non-string field value": (
        req(input={"user": "hi", "age": 41}),
        InvalidRequest,
        ["input field 'age' must be a string", "int 41"],
    ),
    "null field value": (req(input={"user": None}), InvalidRequest, ["input field 'user' must be a string"]),
    "too many tasks": (
        req(tasks=[task("choice", name=f"t{i}") for i in range(LIMITS.max_tasks + 1)]),
        LimitExceeded,
        [f"{LIMITS.max_tasks + 1} tasks given; limit {LIMITS.max_tasks}"],
    ),
    "too many labels": (
        req(tasks=[task("extract", name="ents", labels=_many(LIMITS.max_labels + 1))]),
        LimitExceeded,
        ["'ents'", f"{LIMITS.max_labels + 1} labels given; limit {LIMITS.max_labels}"],
    ),
    "too many options": (
        req(tasks=[task("set", options=_many(LIMITS.max_options + 1))]),
        LimitExceeded,
        [f"{LIMITS.max_options + 1} options given; limit {LIMITS.max_options}"],
    ),
    "too many fields": (
        req(input={f"f{i}": "x" for i in range(LIMITS.max_fields + 1)}),
        LimitExceeded,
        [f"input has {LIMITS.max_fields + 1} fields; limit {LIMITS.max_fields}"],
    ),
    "label too long": (
        req(tasks=[task("span", labels=["x" * (LIMITS.max_item_chars + 1)])]),
        LimitExceeded,
        [f"{LIMITS.max_item_chars + 1:,} characters; limit {LIMITS.max_item_chars}"],
    ),
    "question too long": (
        req(tasks=[task("choice", question="q" * (LIMITS.max_question_chars + 1))]),
        LimitExceeded,
        [f"tasks[0].question has {LIMITS.max_question_chars + 1:,} characters; limit {LIMITS.max_question_chars:,}"],
    ),
    "other version": (req(version="2"), InvalidRequest, ["version '2' is not supported"]),
    "unknown key": (req(priority=3), InvalidRequest, ["priority: unknown field"]),
    "unknown task key": (
        req(tasks=[task("choice", weight=2)]),
        InvalidRequest,
        ["tasks[0].weight: unknown field"],
    ),
    "missing tasks": (
        {k: v for k, v in req().items() if k != "tasks"},
        InvalidRequest,
        ["tasks: field required"],
    ),
    "empty tasks": (req(tasks=[]), InvalidRequest, ["tasks is empty"]),
    "missing kind": (
        req(tasks=[{"name": "t", "options": ["a", "b"]}]),
        InvalidRequest,
        ["tasks[0].kind: field required"],
    ),
    "empty input": (req(input="  "), InvalidRequest, ["input is empty"]),
    "empty json input": (req(input={}), InvalidRequest, ["empty JSON object"]),
    "list input": (req(input=["a"]), InvalidRequest, ["input must be a string or a JSON object", "list"]),
    "question on classify": (
        req(tasks=[task("classify", question="Topic?")]),
        InvalidRequest,
        ["classify tasks take only labels"],
    ),
    "question on extract": (
        req(tasks=[task("extract", question="Find")]),
        InvalidRequest,
        ["extract tasks take only labels"],
    ),
    "options on classify": (
        req(tasks=[task("classify", options=["a", "b"])]),
        InvalidRequest,
        ["take labels, not options"],
    ),
    "labels on choice": (
        req(tasks=[task("choice", labels=["a", "b"])]),
        InvalidRequest,
        ["take options, not labels"],
    ),
    "multi_label on choice": (
        req(tasks=[task("choice", multi_label=True)]),
        InvalidRequest,
        ["multi_label is only for classify"],
    ),
    "single-label classify with one label": (
        req(tasks=[task("classify", labels=["sports"])]),
        InvalidRequest,
        ["needs at least 2 labels; got 1"],
    ),
    "choice with one option": (
        req(tasks=[task("choice", options=["yes"])]),
        InvalidRequest,
        ["needs at least 2 options; got 1"],
    ),
    "duplicate label": (
        req(tasks=[task("span", labels=["a", "a"])]),
        InvalidRequest,
        ["duplicate label 'a'"],
    ),
    "fields on choice": (
        req(input=STATE, tasks=[task("choice", fields=["user"])]),
        InvalidRequest,
        ["fields is only for span"],
    ),
    "non-bool units": (req(units="yes"), InvalidRequest, ["units"]),
    "model not a string": (req(model=7), InvalidRequest, ["model"]),
    # every string must be valid Unicode (UTF-8 encodable): a lone surrogate is named by its place
    "surrogate in free text": (
        req(input="The parcel \ud800 arrived."), InvalidRequest,
        ["input is not valid Unicode (lone surrogate at index 11)"],
    ),
    "surrogate in a field value": (
        req(input={"user": "hi \udfff"}), InvalidRequest,
        ["input.user is not valid Unicode (lone surrogate at index 3)"],
    ),
    "surrogate in a field name": (
        req(input={"us\ud800er": "hi"}), InvalidRequest,
        ["input has a key that is not valid Unicode (lone surrogate at index 2)"],
    ),
    "surrogate in a task name": (
        req(tasks=[task("choice", name="t\ud800")]), InvalidRequest,
        ["tasks[0].name is not valid Unicode (lone surrogate at index 1)"],
    ),
    "surrogate in a question": (
        req(tasks=[task("choice", question="Is it\ud800?")]), InvalidRequest,
        ["tasks[0].question is not valid Unicode (lone surrogate at index 5)"],
    ),
    "surrogate in an option": (
        req(tasks=[task("score", options=["1", "2\udc00"])]), InvalidRequest,
        ["tasks[0].options[1] is not valid Unicode (lone surrogate at index 1)"],
    ),
    "surrogate in a label": (
        req(tasks=[task("extract", labels=["\ud800x"])]), InvalidRequest,
        ["tasks[0].labels[0] is not valid Unicode (lone surrogate at index 0)"],
    ),
    "surrogate in fields": (
        req(input=STATE, tasks=[task("span", fields=["user", "x\ud800"])]), InvalidRequest,
        ["tasks[0].fields[1] is not valid Unicode (lone surrogate at index 1)"],
    ),
    "surrogate in the model name": (
        req(model="vela2-\ud800"), InvalidRequest, ["model is not valid Unicode (lone surrogate at index 6)"],
    ),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_request_raises_a_named_error(name: str) -> None:
    obj, cls, parts = BAD_REQUESTS[name]
    with pytest.raises(cls) as exc:
        parse_request(obj)
    assert type(exc.value) is cls
    for part in parts:
        assert part in str(exc.value), f"{part!r} not in {str(exc.value)!r}"


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_request_becomes_an_error_answer(name: str) -> None:
    obj, cls, parts = BAD_REQUESTS[name]
    ans = system_one_request(stub_model(), obj)  # never reaches predict(): refused before
    assert ans["status"] == "error" and ans["version"] == "1"
    assert ans["id"] == obj.get("id", "req-1")
    assert ans["error"]["type"] == cls.code
    assert all(p in ans["error"]["message"] for p in parts)
    assert "tasks" not in ans
    SystemOneAnswer.model_validate(ans)


@pytest.mark.parametrize(
    "rid,cls,message",
    [
        ("", InvalidRequest, "id is empty"),
        ("r" * (LIMITS.max_id_chars + 1), LimitExceeded, "id has 257 characters; limit 256"),
        ("r\ud800", InvalidRequest, "id is not valid Unicode (lone surrogate at index 1)"),
    ],
)
def test_bad_ids_are_refused_by_name(rid: str, cls: type, message: str) -> None:
    with pytest.raises(cls) as exc:
        parse_request(req(id=rid))
    assert type(exc.value) is cls and message in str(exc.value)
    ans = system_one_request(stub_model(), req(id=rid))
    assert ans["status"] == "error" and ans["error"]["type"] == cls.code and message in ans["error"]["message"]
    # the answer is always valid UTF-8 JSON with an id of at most the limit
    json.dumps(ans, ensure_ascii=False).encode("utf-8")
    assert 0 < len(ans["id"]) <= LIMITS.max_id_chars
    if rid.startswith("r\ud800"):
        assert ans["id"] == "r\\ud800"
    SystemOneAnswer.model_validate(ans)


def test_surrogates_with_a_loaded_model(demo_model: Any) -> None:
    """predict()'s SystemOne paths answer, never raise: bad requests and rows get errors next to good ones."""
    bad_req = req(id="s-bad", input={"user": "hi \ud800 there"})
    ans = system_one_request(demo_model, bad_req)
    assert ans["status"] == "error" and "input.user is not valid Unicode" in ans["error"]["message"]
    bad_row = {"id": "row-bad", "task": "span:x", "text": "Alice \udc00", "questions": [{"labels": ["person"]}]}
    out = predict_mixed(demo_model, [bad_req, req(), bad_row, req(id="req-2", model="vela2-\ud800")])
    assert [o["status"] for o in out] == ["error", "ok", "error", "error"]
    assert "text is not valid Unicode (lone surrogate at index 6)" in out[2]["error"]["message"]
    assert out[3]["model"] == "vela2-\\ud800"
    for o in out:
        json.dumps(o, ensure_ascii=False, allow_nan=False).encode("utf-8")


def test_non_object_request_becomes_an_error_answer() -> None:
    ans = system_one_request(stub_model(), ["not", "a", "request"])
    assert ans["status"] == "error" and ans["error"]["type"] == "invalid_request"
    assert "must be a JSON object; got list" in ans["error"]["message"]
    assert ans["model"] is None and ans["id"].startswith("h-")


def test_error_answer_without_id_uses_the_content_id() -> None:
    obj = req(tasks=[])
    del obj["id"]
    ans = error_answer(obj, InvalidRequest("x"))
    assert ans["id"] == content_id(obj) and ans["model"] == MODEL


def test_limits_at_the_bound_are_accepted() -> None:
    parse_request(req(tasks=[task("choice", name=f"t{i}") for i in range(LIMITS.max_tasks)]))
    parse_request(req(tasks=[task("span", labels=_many(LIMITS.max_labels))]))
    parse_request(req(tasks=[task("set", options=_many(LIMITS.max_options))]))
    parse_request(req(input={f"f{i}": "x" for i in range(LIMITS.max_fields)}))
    parse_request(
        req(tasks=[task("classify", labels=["sports"], multi_label=True)])
    )  # multi: 1 label is fine


# --- the model name ------------------------------------------------------------------------------


def test_check_model_refuses_another_name() -> None:
    r = parse_request(req(model="vela2-9b"))
    with pytest.raises(ModelMismatch) as exc:
        check_model(r, MODEL)
    assert str(exc.value) == "request names model 'vela2-9b'; this worker serves 'vela2-demo'"
    check_model(parse_request(req()), MODEL)  # the right name passes


def test_wrong_model_name_becomes_an_error_answer() -> None:
    ans = system_one_request(stub_model(), req(model="vela2-9b"))
    assert ans == {
        "version": "1",
        "model": "vela2-9b",
        "id": "req-1",
        "status": "error",
        "error": {
            "type": "model_mismatch",
            "message": "request names model 'vela2-9b'; this worker serves 'vela2-demo'",
        },
    }


# --- rendering into one bundled row --------------------------------------------------------------


def test_json_input_is_rendered_with_headers_and_exact_field_ranges() -> None:
    text, ranges = render_input(STATE)
    assert text == (
        "user:\n"
        + STATE["user"]
        + "\n\nassistant:\n"
        + STATE["assistant"]
        + "\n\ncontext:\n"
        + STATE["context"]
    )
    assert [r.name for r in ranges] == ["user", "assistant", "context"]  # key order kept
    for r in ranges:
        assert text[r.start : r.end] == STATE[r.name]
        assert text[r.start - len(r.name) - 2 : r.start] == f"{r.name}:\n"  # the header, excluded


def test_free_text_input_has_no_fields() -> None:
    assert render_input("just text") == ("just text", None)
    row = to_row(parse_request(req(tasks=[task("span")])), Calibration())
    assert row.text == req()["input"] and row.fields is None and row.questions[0].fields is None


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(
            st.characters(blacklist_characters="\n", blacklist_categories=["Cs"]), min_size=1, max_size=8
        ).filter(lambda s: s.strip() != ""),
        st.text(st.characters(blacklist_categories=["Cs"]), max_size=30),
        min_size=1,
        max_size=6,
    )
)
def test_field_ranges_index_the_text_exactly(fields: dict[str, str]) -> None:
    text, ranges = render_input(fields)
    assert [r.name for r in ranges] == list(fields)
    prev_end = 0
    for i, r in enumerate(ranges):
        assert text[r.start : r.end] == fields[r.name]
        head = ("\n\n" if i else "") + f"{r.name}:\n"
        assert text[prev_end : r.start] == head  # only the separator and header between fields
        prev_end = r.end
    assert prev_end == len(text)


def test_to_row_bundles_every_task_into_one_row() -> None:
    r = parse_request(
        req(
            id="req-9",
            input=STATE,
            units=True,
            tasks=[
                {
                    "name": "intent",
                    "kind": "choice",
                    "question": "What does the user want?",
                    "options": ["cancel", "buy"],
                },
                {"name": "quality", "kind": "score", "options": ["1", "2", "3"]},
                {"name": "policy", "kind": "set", "options": ["violence", "self-harm"]},
                {"name": "pii", "kind": "span", "labels": ["person", "email"], "fields": ["user"]},
                {"name": "topic", "kind": "classify", "labels": ["sports", "politics"]},
                {"name": "ents", "kind": "extract", "labels": ["company"]},
            ],
        )
    )
    row = to_row(r, Calibration())
    assert row.id == "req-9" and row.units is True and row.task == "choice:intent"
    assert row.text == render_input(STATE)[0]
    assert [f.model_dump() for f in row.fields] == [f.model_dump() for f in render_input(STATE)[1]]
    assert [q.task for q in row.questions] == [
        "choice:intent",
        "score:quality",
        "set:policy",
        "span:pii",
        "choice:topic",
        "span:ents",
    ]
    q = row.questions
    assert q[0].question == "What does the user want?" and q[0].options == ["cancel", "buy"]
    assert q[1].question == DEFAULT_QUESTIONS["score"] and q[1].options == ["1", "2", "3"]
    assert q[2].question == DEFAULT_QUESTIONS["set"]
    assert q[3].labels == ["person", "email"] and q[3].options is None and q[3].fields == ["user"]
    assert q[4].question == DEFAULT_QUESTIONS["classify"] and q[4].options == ["sports", "politics"]
    assert q[5].question == DEFAULT_QUESTIONS["extract"] and q[5].labels == ["company"]
    assert q[5].fields == ["user", "assistant", "context"]  # span default: every field
    assert all(x.fields is None for x in (q[0], q[1], q[2], q[4]))


def test_default_questions_come_from_the_checkpoint_calibration() -> None:
    cal = Calibration(default_questions={**DEFAULT_QUESTIONS, "classify": "Topic?", "extract": "Entities?"})
    r = parse_request(
        req(tasks=[task("classify", name="c"), task("extract", name="e"), task("choice", name="q")])
    )
    qs = to_row(r, cal).questions
    assert [x.question for x in qs] == ["Topic?", "Entities?", DEFAULT_QUESTIONS["choice"]]


def test_classify_single_label_is_choice_multi_label_is_set() -> None:
    single = parse_request(req(tasks=[task("classify", labels=["sports", "politics"])]))
    multi = parse_request(req(tasks=[task("classify", labels=["sports", "politics"], multi_label=True)]))
    explicit_single = parse_request(req(tasks=[task("classify", labels=["a", "b"], multi_label=False)]))
    assert to_row(single, Calibration()).questions[0].task == "choice:t"
    assert to_row(explicit_single, Calibration()).questions[0].task == "choice:t"
    q = to_row(multi, Calibration()).questions[0]
    assert q.task == "set:t" and q.options == ["sports", "politics"] and q.labels is None


def test_extract_is_a_span_block_over_the_labels() -> None:
    r = parse_request(
        req(input=STATE, tasks=[task("extract", name="ents", labels=["company"], fields=["assistant"])])
    )
    q = to_row(r, Calibration()).questions[0]
    assert (
        q.task == "span:ents" and q.labels == ["company"] and q.options is None and q.fields == ["assistant"]
    )


def test_rendered_input_over_the_text_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import vela2.api.systemone.rows as s1

    monkeypatch.setattr(s1, "LIMITS", LIMITS.__class__(max_text_chars=20))
    r = parse_request(req(input={"user": "a" * 10, "assistant": "b" * 5}))  # 6 + 10 + 2 + 11 + 5 rendered
    with pytest.raises(LimitExceeded, match="input renders to 34 characters .*; limit 20"):
        to_row(r, Calibration())


# --- answers: copied 1:1 -------------------------------------------------------------------------


def _fake_result(r: Any) -> RowResult:
    row = to_row(r, Calibration())
    text, ranges = row.text, row.fields
    answers = []
    for i, q in enumerate(row.questions):
        kind = q.task.split(":")[0]
        if kind == "span":
            f = ranges[0]
            spans = [
                SpanOut(
                    label=q.labels[0],
                    start=6,
                    end=11,
                    text=text[f.start + 6 : f.start + 11],
                    score=0.7,
                    field=f.name,
                )
            ]
            answers.append(
                Answer(
                    question=i,
                    task=q.task,
                    probs={lab: 0.1 + i / 7 for lab in q.labels},
                    spans=spans,
                    gate_fired=False,
                )
            )
        elif kind == "set":
            answers.append(Answer(question=i, task=q.task, probs={o: 1 / 3 for o in q.options}, decision=[]))
        else:
            answers.append(
                Answer(
                    question=i,
                    task=q.task,
                    probs={q.options[0]: 0.1 + 1e-17, q.options[1]: 0.9},
                    decision=q.options[1],
                    abstain_probability=math.pi / 10,
                    expected=2.5 if kind == "score" else None,
                )
            )
    return RowResult(
        id=row.id,
        task=row.task,
        status=Status.ok,
        answers=answers,
        timings={"queue_ms": 0.0, "render_ms": 1.0, "model_ms": 2.0, "decode_ms": 0.5},
    )


def test_to_answer_copies_every_answer_field() -> None:
    r = parse_request(
        req(
            input=STATE,
            tasks=[
                task("choice", name="c"),
                task("score", name="s", options=["1", "2"]),
                task("classify", name="m", multi_label=True),
                task("span", name="p"),
            ],
        )
    )
    res = _fake_result(r)
    ans = to_answer(r, res)
    assert ans["status"] == "ok" and ans["id"] == "req-1" and ans["model"] == MODEL and ans["version"] == "1"
    assert list(ans["tasks"]) == ["c", "s", "m", "p"]
    assert ans["timings"] == res.timings
    for t, a in zip(r.tasks, res.answers, strict=True):
        want = a.model_dump(mode="json", exclude_none=True)
        del want["question"], want["task"]
        assert ans["tasks"][t.name] == {"kind": t.kind, **want}
    assert ans["tasks"]["m"]["kind"] == "classify" and ans["tasks"]["m"]["decision"] == []
    assert ans["tasks"]["p"]["spans"][0]["field"] == "user"
    SystemOneAnswer.model_validate(ans)


def test_to_answer_passes_errors_through_and_refuses_mismatched_results() -> None:
    r = parse_request(req())
    err = RowResult(id="req-1", status=Status.error, error=ErrorInfo(type="model_error", message="boom"))
    assert to_answer(r, err) == {
        "version": "1",
        "model": MODEL,
        "id": "req-1",
        "status": "error",
        "error": {"type": "model_error", "message": "boom"},
    }
    wrong = RowResult(
        id="req-1", status=Status.ok, answers=[Answer(question=0, task="choice:other", probs={})]
    )
    with pytest.raises(Vela2Error, match="no answer 'choice:sentiment'"):
        to_answer(r, wrong)
    with pytest.raises(Vela2Error, match="0 answers for 1 tasks"):
        to_answer(r, RowResult(id="req-1", status=Status.ok, answers=[]))


# --- schema files ----------------------------------------------------------------------------------


def test_committed_schema_files_are_current() -> None:
    for name, text in schema_texts().items():
        path = SCHEMA_DIR / name
        assert path.is_file(), f"{path} is missing; run `python -m vela2.api.systemone --write-schemas`"
        assert path.read_text(encoding="utf-8") == text, (
            f"{path} is stale (the pydantic models changed); run `python -m vela2.api.systemone --write-schemas`"
        )


def test_write_schemas_command(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--write-schemas", "--dir", str(tmp_path)]) == 0
    for name, text in schema_texts().items():
        assert (tmp_path / name).read_text(encoding="utf-8") == text
    request_schema = json.loads((tmp_path / SCHEMA_FILES["request"]).read_text())
    assert request_schema["additionalProperties"] is False
    assert request_schema["properties"]["tasks"]["maxItems"] == LIMITS.max_tasks
    assert set(request_schema["required"]) == {"model", "input", "tasks"}
    variants = [request_schema["$defs"][ref["$ref"].rsplit("/", 1)[1]]
                for ref in request_schema["$defs"]["SystemOneTask"]["oneOf"]]
    kinds = [v["properties"]["kind"]["const"] for v in variants]
    assert kinds == ["choice", "score", "set", "span", "classify", "classify", "extract"]
    answer_schema = json.loads((tmp_path / SCHEMA_FILES["answer"]).read_text())
    assert {"version", "id", "status"} <= set(answer_schema["required"])


# --- against the model: SystemOne == predict() on the same row ------------------------------------


# demo_model: the session's trained demo model (tests/conftest.py), so the suite trains it once


def seed_requests(model_name: str) -> list[dict[str, Any]]:
    """The seed's 6 SystemOne requests: choice / choice without a question / score; span + choice over
    a 3-field JSON state; set; plus the open-label kinds."""
    text = "The parcel arrived two days late and the box was crushed, but support refunded me quickly."
    return [
        {
            "model": model_name,
            "id": "s1-choice",
            "input": text,
            "tasks": [
                {
                    "name": "sentiment",
                    "kind": "choice",
                    "question": "How does the customer feel?",
                    "options": ["positive", "negative", "mixed"],
                }
            ],
        },
        {
            "model": model_name,
            "id": "s1-noq",
            "input": text,
            "tasks": [{"name": "late", "kind": "choice", "options": ["yes", "no"]}],
        },
        {
            "model": model_name,
            "id": "s1-score",
            "input": text,
            "tasks": [
                {
                    "name": "quality",
                    "kind": "score",
                    "question": "Rate the service.",
                    "options": ["1", "2", "3", "4", "5"],
                }
            ],
        },
        {
            "model": model_name,
            "id": "s1-state",
            "input": STATE,
            "units": True,
            "tasks": [
                {
                    "name": "pii",
                    "kind": "span",
                    "labels": ["person", "email", "number"],
                    "question": "Find personal data.",
                },
                {
                    "name": "intent",
                    "kind": "choice",
                    "question": "What does the user want?",
                    "options": ["cancel", "buy", "complain"],
                },
            ],
        },
        {
            "model": model_name,
            "id": "s1-set",
            "input": text,
            "tasks": [{"name": "policy", "kind": "set", "options": ["violence", "self-harm", "none"]}],
        },
        {
            "model": model_name,
            "id": "s1-open",
            "input": STATE,
            "tasks": [
                {"name": "topic", "kind": "classify", "labels": ["shipping", "billing", "other"]},
                {
                    "name": "topics",
                    "kind": "classify",
                    "labels": ["shipping", "billing"],
                    "multi_label": True,
                },
                {"name": "ents", "kind": "extract", "labels": ["company", "person"], "fields": ["assistant"]},
            ],
        },
    ]


def _numbers(obj: Any, prefix: str = "") -> dict[str, float]:
    """Every number of a JSON value, keyed by its path (bools and timings left out)."""
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k != "timings":
                out.update(_numbers(v, f"{prefix}.{k}"))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            out.update(_numbers(v, f"{prefix}[{i}]"))
    elif isinstance(obj, int | float) and not isinstance(obj, bool):
        out[prefix] = float(obj)
    return out


def _expected_tasks(r: Any, result: RowResult) -> dict[str, dict[str, Any]]:
    """What each task's answer must be: the predict() answer of its block, minus question / task."""
    out = {}
    for t, a in zip(r.tasks, result.answers, strict=True):
        d = a.model_dump(mode="json", exclude_none=True)
        assert d.pop("question") == r.tasks.index(t) and d.pop("task") == t.row_task
        out[t.name] = d
    return out


def test_seed_requests_equal_predict_exactly(demo_model: Any) -> None:
    import vela2 as vp

    seen_kinds = set()
    for obj in seed_requests(demo_model.name):
        ans = system_one_request(demo_model, obj, precision="fp32")
        assert ans["status"] == "ok", ans
        SystemOneAnswer.model_validate(ans)
        r = parse_request(obj)
        (ref,) = vp.predict(demo_model, [to_row(r, demo_model.calibration)], precision="fp32")
        assert ref.status == Status.ok
        expected = _expected_tasks(r, ref)
        assert list(ans["tasks"]) == [t.name for t in r.tasks]
        for t in r.tasks:
            got = dict(ans["tasks"][t.name])
            assert got.pop("kind") == t.kind
            seen_kinds.add(t.kind)
            assert got.get("decision") == expected[t.name].get("decision")
            a, b = _numbers(got), _numbers(expected[t.name])
            assert a.keys() == b.keys() and a
            assert max(abs(a[k] - b[k]) for k in a) == 0.0
            assert got == expected[t.name]
    assert seen_kinds == {"choice", "score", "set", "span", "classify", "extract"}


def test_span_answers_carry_field_offsets(demo_model: Any) -> None:
    for obj in seed_requests(demo_model.name):
        if not isinstance(obj["input"], dict):
            continue
        ans = system_one_request(demo_model, obj, precision="fp32")
        for t in obj["tasks"]:
            if t["kind"] not in ("span", "extract"):
                continue
            spans = ans["tasks"][t["name"]]["spans"]
            allowed = t.get("fields", list(obj["input"]))
            for s in spans:
                assert s["field"] in allowed
                assert 0 <= s["start"] < s["end"] <= len(obj["input"][s["field"]])
                assert obj["input"][s["field"]][s["start"] : s["end"]] == s["text"]
            if obj.get("units"):  # word units of the whole rendered text (headers included), in order
                units = ans["tasks"][t["name"]]["units"]
                text = render_input(obj["input"])[0]
                assert units["offsets"] and all(0 <= a < b <= len(text) for a, b in units["offsets"])
                assert all(len(p) == len(units["offsets"]) for p in units["probs"].values())
    # A permissive threshold so the demo model's (untrained) spans exist and get checked.
    import vela2 as vp

    cal = copy.deepcopy(demo_model.calibration)
    cal.span_default_threshold = 0.0
    r = parse_request(seed_requests(demo_model.name)[3])
    saved = demo_model.calibration
    demo_model.calibration = cal
    try:
        (res,) = vp.predict(demo_model, [to_row(r, cal)], precision="fp32")
    finally:
        demo_model.calibration = saved
    ans = to_answer(r, res)
    spans = ans["tasks"]["pii"]["spans"]
    assert spans, "threshold 0 must yield spans"
    assert {s["field"] for s in spans} == set(STATE)
    for s in spans:
        assert STATE[s["field"]][s["start"] : s["end"]] == s["text"]
        assert s["text"] not in ("user", "assistant", "context", ":")  # header words never join a span


def test_classify_and_extract_answers(demo_model: Any) -> None:
    ans = system_one_request(demo_model, seed_requests(demo_model.name)[5], precision="fp32")
    single, multi, ents = ans["tasks"]["topic"], ans["tasks"]["topics"], ans["tasks"]["ents"]
    assert single["kind"] == "classify" and single["decision"] in ("shipping", "billing", "other")
    assert set(single["probs"]) == {"shipping", "billing", "other"} and "abstain_probability" in single
    assert math.isclose(sum(single["probs"].values()), 1.0, rel_tol=1e-9)
    assert multi["kind"] == "classify" and isinstance(multi["decision"], list)
    assert set(multi["decision"]) <= {"shipping", "billing"} and "abstain_probability" not in multi
    assert ents["kind"] == "extract" and set(ents["probs"]) == {"company", "person"}
    assert all(s["field"] == "assistant" for s in ents["spans"])


def test_wrong_model_name_with_a_loaded_model(demo_model: Any) -> None:
    ans = system_one_request(demo_model, {**seed_requests(demo_model.name)[0], "model": "vela2-9b"})
    assert ans["status"] == "error" and ans["error"]["type"] == "model_mismatch"
    assert (
        ans["error"]["message"] == f"request names model 'vela2-9b'; this worker serves '{demo_model.name}'"
    )


def test_mixed_rows_and_requests_bad_ones_do_not_stop_the_rest(demo_model: Any) -> None:
    import vela2 as vp

    good = seed_requests(demo_model.name)
    row = {
        "id": "r-1",
        "task": "choice:boolq",
        "text": "The sky is blue.",
        "questions": [{"question": "Is the sky green?", "options": ["yes", "no"]}],
    }
    bad_row = {"id": "r-bad", "task": "choice:boolq", "text": "x", "questions": [{"options": ["yes"]}]}
    bad_req = {**good[1], "id": "s1-bad", "tasks": [{"name": "a", "kind": "nope"}]}
    objs = [good[0], row, bad_req, good[3], bad_row, {**good[4], "model": "other"}, good[5]]
    out = predict_mixed(demo_model, objs, precision="fp32")
    assert [o["id"] for o in out] == ["s1-choice", "r-1", "s1-bad", "s1-state", "r-bad", "s1-set", "s1-open"]
    assert [o["status"] for o in out] == ["ok", "ok", "error", "ok", "error", "error", "ok"]
    assert "unknown kind 'nope'" in out[2]["error"]["message"]
    assert out[5]["error"]["type"] == "model_mismatch"
    assert "answers" in out[1] and "tasks" in out[0]
    # The same rows through predict() directly, in the same order, give the same numbers.
    rows = [
        to_row(parse_request(good[0]), demo_model.calibration),
        row,
        to_row(parse_request(good[3]), demo_model.calibration),
        bad_row,
        to_row(parse_request(good[5]), demo_model.calibration),
    ]
    ref = vp.predict(demo_model, rows, precision="fp32")
    assert out[1] == {**ref[1].to_json_dict(), "timings": out[1]["timings"]}
    for o, res, obj in ((out[0], ref[0], good[0]), (out[3], ref[2], good[3]), (out[6], ref[4], good[5])):
        r = parse_request(obj)
        assert {k: v for k, v in o.items() if k != "timings"} == {
            k: v for k, v in to_answer(r, res).items() if k != "timings"
        }


# --- the published schema says what the validators enforce ------------------------------------------

_OK = {"model": MODEL, "input": "Some text.", "tasks": [{"name": "t", "kind": "choice", "options": ["a", "b"]}]}


def _with_task(**task: Any) -> dict[str, Any]:
    return {**_OK, "tasks": [{"name": "t", **task}]}


SCHEMA_CASES = [  # (request, the validators accept it)
    (_OK, True),
    ({**_OK, "id": None, "version": "1", "units": True}, True),
    (_with_task(kind="choice", options=["a", "b"], question=None, labels=None, fields=None, multi_label=None), True),
    (_with_task(kind="score", options=["1", "2"], question="How good?"), True),
    (_with_task(kind="set", options=["a"]), True),
    (_with_task(kind="span", labels=["person"]), True),
    ({**_with_task(kind="span", labels=["person"], fields=["user"]), "input": {"user": "Hi"}}, True),
    (_with_task(kind="classify", labels=["a", "b"]), True),
    (_with_task(kind="classify", labels=["a"], multi_label=True), True),
    (_with_task(kind="classify", labels=["a", "b"], multi_label=False), True),
    (_with_task(kind="extract", labels=["company"]), True),
    ({**_OK, "input": {"user": "", "bot": "Hello"}}, True),
    ({**_OK, "input": ""}, False),  # the request schemathesis found: empty input ...
    ({**_OK, "input": " \n\x1f"}, False),  # ... and whitespace by str.isspace, \x1c-\x1f included
    ({**_OK, "input": {}}, False),
    ({**_OK, "input": {" ": "x"}}, False),
    ({**_OK, "input": {"a\nb": "x"}}, False),
    ({**_OK, "input": {"a": 1}}, False),
    ({**_OK, "input": {f"f{i}": "x" for i in range(LIMITS.max_fields + 1)}}, False),
    ({**_OK, "input": "x" * (LIMITS.max_text_chars + 1)}, False),
    ({**_OK, "tasks": []}, False),
    ({**_OK, "tasks": [{"name": f"t{i}", "kind": "set", "options": ["a"]} for i in range(LIMITS.max_tasks + 1)]},
     False),
    (_with_task(kind="set", options=[]), False),  # ... and a set task with no options
    ({**_OK, "model": ""}, False),
    ({**_OK, "id": ""}, False),
    ({**_OK, "id": "x" * (LIMITS.max_id_chars + 1)}, False),
    ({**_OK, "version": "2"}, False),
    ({**_OK, "units": None}, False),
    ({**_OK, "extra": 1}, False),
    (_with_task(kind="choice", options=["a"]), False),
    (_with_task(kind="choice", options=["a", "a"]), False),
    (_with_task(kind="choice", options=["a", "\u3000"]), False),
    (_with_task(kind="choice", options=["a", "x" * (LIMITS.max_item_chars + 1)]), False),
    (_with_task(kind="choice", options=[f"o{i}" for i in range(LIMITS.max_options + 1)]), False),
    (_with_task(kind="choice", options=["a", "b"], labels=["c"]), False),
    (_with_task(kind="choice", options=["a", "b"], fields=["user"]), False),
    (_with_task(kind="choice", options=["a", "b"], multi_label=True), False),
    (_with_task(kind="choice", options=["a", "b"], question=" "), False),
    (_with_task(kind="choice", options=["a", "b"], question="q" * (LIMITS.max_question_chars + 1)), False),
    (_with_task(kind="span", labels=[]), False),
    (_with_task(kind="span", options=["a"]), False),
    (_with_task(kind="span", labels=["a"], fields=[]), False),
    ({**_with_task(kind="span", labels=["a"], fields=["u", "u"]), "input": {"u": "x"}}, False),
    (_with_task(kind="span", labels=["a"], fields=["user"]), False),  # fields on free text
    (_with_task(kind="classify", labels=["a"]), False),
    (_with_task(kind="classify", labels=["a", "b"], question="Which?"), False),
    (_with_task(kind="extract", labels=["a"], question="Which?"), False),
    (_with_task(kind="extract", labels=["a"], multi_label=True), False),
    (_with_task(kind="unknown", labels=["a"]), False),
    ({**_OK, "tasks": [{"kind": "set", "options": ["a"]}]}, False),
    (_with_task(kind="set", options=["a"], name=""), False),
    (_with_task(kind="set", options=["a"], name="n" * 129), False),
]


@pytest.mark.parametrize(("request_obj", "valid"), SCHEMA_CASES)
def test_the_request_schema_accepts_exactly_what_the_validators_accept(request_obj: Any, valid: bool) -> None:
    import jsonschema_rs

    from vela2.api.systemone import request_schema

    schema_ok = jsonschema_rs.validator_for(request_schema()).is_valid(request_obj)
    try:
        to_row(parse_request(request_obj), Calibration())  # what the route and then the worker check
        parsed_ok = True
    except Vela2Error:
        parsed_ok = False
    assert (schema_ok, parsed_ok) == (valid, valid)


def test_the_rules_json_schema_cannot_state_are_in_its_description() -> None:
    """Cross-field rules: both documents name them; the validators enforce them."""
    from vela2.api.systemone import CROSS_FIELD_RULES, request_schema

    assert CROSS_FIELD_RULES in request_schema()["description"]
    for bad in ({**_OK, "tasks": [{"name": "t", "kind": "set", "options": ["a"]}] * 2},
                {**_with_task(kind="span", labels=["a"], fields=["other"]), "input": {"user": "x"}}):
        with pytest.raises(InvalidRequest):
            parse_request(bad)
