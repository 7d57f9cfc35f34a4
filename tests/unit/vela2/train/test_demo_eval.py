"""vela2.train.demo_eval: word-level span F1 and choice accuracy of served answers, pooled and per family,
and the goals a report misses (the scores `vela2 init-demo` writes beside the demo's weights)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vela2.train.demo_eval import GOALS, NO_FAMILY, _summary, _tally, format_report, misses

# words: Write to ann . lee @ example . com or call + 1 555 0100 .
TEXT = "Write to ann.lee@example.com or call +1 555 0100."


def _span(label: str, part: str) -> dict:
    start = TEXT.index(part)
    return {"label": label, "start": start, "end": start + len(part)}


def _row(gold_spans: list[dict], intent: str = "refund") -> dict:
    return {"id": "r", "text": TEXT,
            "questions": [{"task": "span:pii", "labels": ["email", "phone"]},
                          {"task": "choice:intent", "options": ["refund", "cancel"]}],
            "gold": [gold_spans, intent]}


def _result(spans: list[dict], decision: str) -> SimpleNamespace:
    out = [SimpleNamespace(label=s["label"], start=s["start"], end=s["end"]) for s in spans]
    return SimpleNamespace(status="ok", error=None,
                           answers=[SimpleNamespace(spans=out, decision=None), SimpleNamespace(spans=None,
                                                                                                decision=decision)])


def test_word_f1_and_accuracy_per_family():
    gold = [_span("email", "ann.lee@example.com"), _span("phone", "+1 555 0100")]
    found = [_span("email", "lee@example.com"), _span("phone", "+1 555 0100.")]  # 2 e-mail words missed, 1 extra
    rows = [(_row(gold), {"email": "dotted", "phone": "spaced", "intent": "ask"}),
            (_row([], "cancel"), {"intent": "stop"})]
    results = [_result(found, "refund"), _result([_span("phone", "555")], "refund")]
    report = _summary(*_tally(rows, results))
    email, phone = report["spans"]["email"], report["spans"]["phone"]
    assert email["families"]["dotted"] == {"f1": round(2 * 5 / (2 * 5 + 0 + 2), 4), "gold_words": 7}
    assert phone["families"]["spaced"]["f1"] == round(2 * 4 / (2 * 4 + 1), 4)
    # the second message has no phone: its marked word is a false positive of no family
    assert phone["false_positive_words_without_one"] == 1 and NO_FAMILY not in phone["families"]
    assert phone["f1"] == round(2 * 4 / (2 * 4 + 2 + 0), 4)
    intent = report["choices"]["choice:intent"]
    assert intent["accuracy"] == 0.5 and intent["families"] == {"ask": {"accuracy": 1.0, "n": 1},
                                                                "stop": {"accuracy": 0.0, "n": 1}}
    assert "ask" in format_report({"split": "held_out", "rows": 2, "seed": 1, **report})


def test_a_row_without_an_answer_is_an_error_not_a_zero():
    failed = SimpleNamespace(status="error", error={"type": "model_error"}, answers=[])
    with pytest.raises(ValueError, match="got no answer"):
        _tally([(_row([]), {})], [failed])


def test_misses_names_each_goal_and_family_under_it():
    def entry(key: str, pooled: float, **fams: float) -> dict:
        return {key: pooled, "families": {f: {key: v} for f, v in fams.items()}}

    report = {"spans": {"email": entry("f1", 0.95, dotted=0.97, hyphen=0.85), "phone": entry("f1", 0.9),
                        "person": entry("f1", 0.6)},
              "choices": {"choice:intent": entry("accuracy", 0.95), "choice:sentiment": entry("accuracy", 0.92)}}
    assert misses(report) == ["email: f1 0.950 < 0.9 (families: hyphen 0.850)", "person: f1 0.600 < 0.7"]
    assert misses(report, {"spans": {}, "choices": {"choice:intent": 0.99}}) == ["choice:intent: accuracy 0.950 < 0.99"]
    assert set(GOALS["spans"]) == {"email", "phone", "person"}
