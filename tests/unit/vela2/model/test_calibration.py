"""Calibration math against hand-computed values, lookups, calibration.json I/O, and the way
finish() applies it to raw logits (set decisions at the threshold, temperatures per task/type)."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from vela2.errors import CheckpointError
from vela2.model.calibration import (
    DEFAULT_QUESTIONS,
    GENERIC_SET_THRESHOLD,
    GENERIC_SPAN_THRESHOLD,
    Calibration,
    PiiRules,
    choice_probs,
    expected_value,
    option_value,
    sigmoid,
    softmax,
)
from vela2.scoring.pipeline import SeqOutput, finish, prepare

# --- the math, by hand ---------------------------------------------------------------------------


def test_softmax_by_hand():
    p = softmax(np.array([0.0, math.log(3.0)]))
    assert p == pytest.approx([0.25, 0.75], abs=1e-12)
    # shift invariance and no overflow on huge logits
    assert softmax(np.array([1000.0, 1000.0 + math.log(3.0)])) == pytest.approx([0.25, 0.75], abs=1e-12)


def test_sigmoid_by_hand():
    assert sigmoid(np.array([0.0]))[0] == 0.5
    assert sigmoid(np.array([math.log(3.0)]))[0] == pytest.approx(0.75, abs=1e-12)
    assert sigmoid(np.array([-math.log(3.0)]))[0] == pytest.approx(0.25, abs=1e-12)


def test_choice_probs_by_hand():
    # options [log 1, log 3], abstain log 4, T = 1:
    # probs over options = [1/4, 3/4]; P(ABS) over options + ABS = 4 / (1 + 3 + 4) = 1/2
    logits = np.log(np.array([1.0, 3.0, 4.0], dtype=np.float32))
    probs, abstain = choice_probs(logits, 1.0, 2)
    assert probs == pytest.approx([0.25, 0.75], abs=1e-6)
    assert abstain == pytest.approx(0.5, abs=1e-6)
    assert isinstance(abstain, float)


def test_choice_probs_temperature_divides_logits():
    # logits [2, 0, 0] at T = 2 are [1, 0, 0]: probs = [e, 1] / (e + 1); P(ABS) = 1 / (e + 2)
    probs, abstain = choice_probs(np.array([2.0, 0.0, 0.0]), 2.0, 2)
    e = math.e
    assert probs == pytest.approx([e / (e + 1), 1 / (e + 1)], abs=1e-12)
    assert abstain == pytest.approx(1 / (e + 2), abs=1e-12)


def test_choice_probs_shape_checked():
    with pytest.raises(ValueError, match="expected 3 logits"):
        choice_probs(np.zeros(2), 1.0, 2)


def test_expected_value_by_hand():
    assert expected_value(["0", "1", "2"], np.array([0.2, 0.3, 0.5])) == pytest.approx(1.3)
    assert expected_value(["1", "2.5"], np.array([0.5, 0.5])) == pytest.approx(1.75)
    assert expected_value(["low", "high"], np.array([0.5, 0.5])) is None


@pytest.mark.parametrize("option", ["nan", "NaN", "-nan", "inf", "-inf", "+inf", "Infinity", "-Infinity", "1e999",
                                    "-1e400", "one", "", " "])
def test_an_option_is_numeric_only_when_it_parses_as_a_finite_float(option):
    assert option_value(option) is None
    assert expected_value(["1", option], np.array([0.5, 0.5])) is None


def test_numeric_options():
    assert [option_value(o) for o in ["0", "-3", " 4 ", "2.5", "1e3", "1_000", "5e-324"]] == [
        0.0, -3.0, 4.0, 2.5, 1000.0, 1000.0, 5e-324]


def test_expected_value_is_finite_and_within_the_values():
    big = "1.7976931348623157e308"
    # the plain weighted sum overflows; the scaled one does not
    e = expected_value([big, big], np.array([0.6, 0.4]))
    assert e == pytest.approx(float(big)) and math.isfinite(e)
    assert expected_value([big, "-" + big], np.array([0.5, 0.5])) == pytest.approx(0.0, abs=1e294)
    # probabilities summing to a hair under 1 do not take it below the smallest value
    assert expected_value(["3", "3", "3"], np.full(3, 0.33333333)) == 3.0


def test_sigmoid_saturates_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sigmoid(np.array([-1e4, -800.0, 800.0, 1e4])).tolist() == [0.0, 0.0, 1.0, 1.0]
        assert sigmoid(np.array([-np.inf, np.inf])).tolist() == [0.0, 1.0]


# --- lookups -------------------------------------------------------------------------------------


def test_temperature_lookup_order_task_then_type_then_one():
    cal = Calibration(temperatures={"choice": 2.0, "choice:boolq": 4.0}, T_set=3.0, T_span=5.0)
    assert cal.temperature("choice:boolq") == 4.0  # the task's own
    assert cal.temperature("choice:other") == 2.0  # the type's
    assert cal.temperature("score:helpsteer2") == 1.0  # neither fitted: 1
    assert cal.temperature("set:shield") == 3.0
    assert cal.temperature("span:pii") == 5.0


def test_threshold_lookups():
    cal = Calibration(set_thresholds={"set:shield": 0.3}, span_thresholds={"span:pii": {"email": 0.7, "*": 0.6}})
    assert cal.set_threshold("set:shield") == 0.3
    assert cal.set_threshold("set:other") == GENERIC_SET_THRESHOLD == 0.5
    assert cal.span_threshold("span:pii", "email") == 0.7  # task + label
    assert cal.span_threshold("span:pii", "person") == 0.6  # the task's "*"
    assert cal.span_threshold("span:ents", "person") == GENERIC_SPAN_THRESHOLD == 0.5  # span:*


def test_pii_and_overlap_policy():
    cal = Calibration(pii=PiiRules(tasks=["pii*"]), span_overlap={"span:ents": "flat"})
    assert cal.is_pii("span:pii_dev") and not cal.is_pii("span:ents") and not cal.is_pii("choice:pii")
    assert cal.overlap("span:pii_dev") == "flat"
    assert cal.overlap("span:ents") == "flat"  # set explicitly
    assert cal.overlap("span:other") == "nested"
    assert cal.question_text("extract") == DEFAULT_QUESTIONS["extract"]


# --- calibration.json -------------------------------------------------------------------------------


def test_json_round_trip(tmp_path):
    cal = Calibration(
        temperatures={"choice": 1.5, "score:x": 0.7},
        T_set=2.0,
        T_span=0.5,
        set_thresholds={"set:a": 0.4},
        span_thresholds={"span:b": {"x": 0.3}},
        pii=PiiRules(tasks=["pii*"], min_chars={"email": 6}, min_words={"person": 2}, sparse_gate=0.8),
    )
    cal.write(tmp_path)
    again = Calibration.read(tmp_path)
    assert again == cal
    assert json.loads((tmp_path / "calibration.json").read_text())["T_set"] == 2.0


def test_missing_file_gives_defaults(tmp_path):
    assert Calibration.read(tmp_path) == Calibration()


def test_unknown_key_rejected():
    with pytest.raises(CheckpointError, match="unknown keys"):
        Calibration.from_dict({"temperatures": {}, "T_sett": 1.0})


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), "2"])
def test_bad_temperature_rejected(bad):
    with pytest.raises(CheckpointError, match="must be > 0"):
        Calibration.from_dict({"temperatures": {"choice": bad}})


# --- applied by finish() to raw logits ---------------------------------------------------------


def _finish(model, row: dict, outputs: list[SeqOutput]):
    prep = prepare(model, row)
    assert len(prep.sequences) == 1
    return finish(model, prep, outputs, {"queue_ms": 0.0, "model_ms": 0.0}, "fp32")


@pytest.fixture
def calibrated(demo_model):
    """The demo model with a calibration swapped in for one test (restored afterwards)."""
    saved = demo_model.calibration
    yield demo_model
    demo_model.calibration = saved


def test_set_decision_at_threshold_is_in(calibrated):
    calibrated.calibration = Calibration(set_thresholds={"set:shield": 0.5})
    row = {"id": "s", "task": "set:shield", "text": "Some text here.", "questions": [{"options": ["a", "b", "c"]}]}
    # sigmoid(0) = 0.5 exactly (== threshold -> in); sigmoid(-1e-3) just below -> out
    out = SeqOutput(options={0: np.array([0.0, -1e-3, 3.0], dtype=np.float32)})
    (ans,) = _finish(calibrated, row, [out]).answers
    assert ans.decision == ["a", "c"]
    assert ans.probs["a"] == 0.5
    assert ans.probs["c"] == pytest.approx(1 / (1 + math.exp(-3.0)), abs=1e-7)
    assert ans.abstain_probability is None


def test_set_decision_may_be_empty_and_uses_t_set(calibrated):
    calibrated.calibration = Calibration(T_set=2.0, set_thresholds={"set:shield": 0.75})
    row = {"id": "s", "task": "set:shield", "text": "Some text here.", "questions": [{"options": ["a", "b"]}]}
    # logit 2 ln 3 at T_set 2 -> sigmoid(ln 3) = 0.75 -> in; logit 2 -> sigmoid(1) = 0.731 -> out
    out = SeqOutput(options={0: np.array([2 * math.log(3.0), 2.0], dtype=np.float64)})
    (ans,) = _finish(calibrated, row, [out]).answers
    assert ans.probs["a"] == pytest.approx(0.75, abs=1e-12)
    assert ans.decision == ["a"]
    out = SeqOutput(options={0: np.array([-5.0, 2.0])})
    (ans,) = _finish(calibrated, row, [out]).answers
    assert ans.decision == []


def test_choice_and_score_answers_from_logits(calibrated):
    calibrated.calibration = Calibration(temperatures={"choice": 2.0, "score:q": 1.0})
    choice = {
        "id": "c",
        "task": "choice:boolq",
        "text": "The sky is green.",
        "questions": [{"options": ["yes", "no"]}],
        "logits": True,
    }
    out = SeqOutput(options={0: np.array([2.0, 0.0, 0.0], dtype=np.float32)})  # T = 2 (type)
    (ans,) = _finish(calibrated, choice, [out]).answers
    e = math.e
    assert ans.probs["yes"] == pytest.approx(e / (e + 1), abs=1e-7)
    assert ans.decision == "yes"
    assert ans.abstain_probability == pytest.approx(1 / (e + 2), abs=1e-7)
    assert ans.logits == [2.0, 0.0, 0.0]
    assert ans.expected is None

    score = {"id": "s", "task": "score:q", "text": "The sky is green.", "questions": [{"options": ["0", "1", "2"]}]}
    # probs over options [1, 1, 2] / 4 at T = 1 (the task's own): expected = (0 + 1 + 4) / 4
    out = SeqOutput(options={0: np.log(np.array([1.0, 1.0, 2.0, 4.0]))})
    (ans,) = _finish(calibrated, score, [out]).answers
    assert ans.probs == pytest.approx({"0": 0.25, "1": 0.25, "2": 0.5}, abs=1e-7)
    assert ans.decision == "2"
    assert ans.expected == pytest.approx(1.25, abs=1e-7)
    assert ans.abstain_probability == pytest.approx(0.5, abs=1e-7)


def test_span_probs_use_t_span_and_threshold(calibrated):
    calibrated.calibration = Calibration(T_span=2.0, span_thresholds={"span:ents": {"person": 0.5}})
    row = {
        "id": "p",
        "task": "span:ents",
        "text": "Ann Lee met Bob today",
        "questions": [{"labels": ["person"]}],
        "units": True,
    }
    # logit 0 -> 0.5 (== threshold: in); -1e-3 -> just below (out); 2 at T_span 2 -> sigmoid(1)
    logits = np.array([[0.0], [0.0], [-4.0], [2.0], [-1e-3]], dtype=np.float32)
    (ans,) = _finish(calibrated, row, [SeqOutput(spans={0: logits})]).answers
    assert [(s.label, s.start, s.end, s.text) for s in ans.spans] == [
        ("person", 0, 7, "Ann Lee"),
        ("person", 12, 15, "Bob"),
    ]
    assert ans.spans[0].score == 0.5
    assert ans.spans[1].score == pytest.approx(1 / (1 + math.exp(-1.0)), abs=1e-7)
    assert ans.probs["person"] == pytest.approx(1 / (1 + math.exp(-1.0)), abs=1e-7)  # max over words
    assert ans.units.offsets == [(0, 3), (4, 7), (8, 11), (12, 15), (16, 21)]
    assert ans.units.probs["person"][4] == pytest.approx(0.5, abs=1e-3) and ans.units.probs["person"][4] < 0.5
    assert ans.gate_fired is None  # not a PII task


def test_a_calibration_json_overriding_some_question_texts_keeps_the_others(tmp_path):
    """Found by review: overriding only "classify" made every row without a question raise KeyError."""
    (tmp_path / "calibration.json").write_text(json.dumps({"default_questions": {"classify": "Which labels?"}}))
    cal = Calibration.read(tmp_path)
    assert cal.default_questions == {**DEFAULT_QUESTIONS, "classify": "Which labels?"}
    assert cal.question_text("choice") == DEFAULT_QUESTIONS["choice"]
    assert cal.question_text("classify") == "Which labels?"
    for bad in ({"choice": ""}, {"choice": 3}, ["choice"]):
        (tmp_path / "calibration.json").write_text(json.dumps({"default_questions": bad}))
        with pytest.raises(CheckpointError, match="default_questions must map kinds to question texts"):
            Calibration.read(tmp_path)
