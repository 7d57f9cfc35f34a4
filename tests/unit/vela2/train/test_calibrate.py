"""vela2.train.calibrate: calibration math, gold checking, calibrate() and the calibrate command."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import pytest
import torch

import vela2
from vela2.api.schemas import Answer, ErrorInfo, RowResult, Status, Units, parse_row
from vela2.model.calibration import Calibration, sigmoid, softmax
from vela2.train import calibrate
from vela2.train.calibrate import fit_sigmoid_temperature, fit_softmax_temperature
from vela2.train.labelled import check_gold, read_jsonl
from vela2.train.metrics import best_f1_threshold, ece, f1_from_counts, f1_score, sigmoid_nll, softmax_nll

# --- math against hand-computed values ------------------------------------------------------------


def test_softmax_nll_hand_values():
    logits = [np.array([0.0, math.log(3.0)]), np.array([0.0, math.log(3.0)])]  # softmax = [1/4, 3/4]
    assert softmax_nll(logits, [0, 1]) == pytest.approx((math.log(4.0) + math.log(4.0 / 3.0)) / 2)
    # at T = 2 the logits halve: p0 = 1 / (1 + sqrt 3)
    assert softmax_nll(logits[:1], [0], 2.0) == pytest.approx(math.log(1 + math.sqrt(3.0)))
    # variable lengths: a 3-option item with equal logits costs log 3
    assert softmax_nll([np.zeros(3)], [2]) == pytest.approx(math.log(3.0))


def test_sigmoid_nll_hand_values_and_stability():
    assert sigmoid_nll(np.array([0.0]), np.array([1.0])) == pytest.approx(math.log(2.0))
    z = np.array([math.log(3.0), math.log(3.0)])  # sigmoid = 3/4
    assert sigmoid_nll(z, np.array([1.0, 0.0])) == pytest.approx((math.log(4 / 3) + math.log(4)) / 2)
    # huge logits stay finite: a confident wrong unit costs ~ its logit
    assert sigmoid_nll(np.array([1000.0]), np.array([0.0])) == pytest.approx(1000.0)


def test_ece_hand_example():
    conf = np.array([0.9, 0.9, 0.62, 0.3])
    correct = np.array([1, 0, 1, 0])
    # bins (15 equal): {0.9, 0.9} acc .5 -> .5*.4; {0.62} acc 1 -> .25*.38; {0.3} acc 0 -> .25*.3
    assert ece(conf, correct) == pytest.approx(0.2 + 0.095 + 0.075)
    # perfectly calibrated bins give 0; confidence 0 lands in the first bin
    assert ece(np.array([0.5, 0.5, 0.0]), np.array([1, 0, 0])) == pytest.approx(0.0)
    assert ece(np.array([1.0]), np.array([0])) == pytest.approx(1.0)


def test_f1_helpers():
    assert f1_from_counts(2, 1, 1) == pytest.approx(4 / 6)
    assert f1_from_counts(0, 0, 0) == 1.0
    assert f1_from_counts(0, 3, 0) == 0.0
    assert f1_score(np.array([1, 1, 0, 0]), np.array([1, 0, 1, 0])) == pytest.approx(0.5)


def test_best_f1_threshold_tiny_example():
    probs = np.array([0.9, 0.8, 0.4, 0.3, 0.1])
    targets = np.array([1, 0, 1, 0, 0])
    # top-1: F1 2/3; top-2: 1/2; top-3: 0.8 (best); top-4: 2/3; all: 4/7
    thr, f1 = best_f1_threshold(probs, targets, min_positives=1)
    assert f1 == pytest.approx(0.8)
    assert thr == pytest.approx(0.35)  # midpoint between 0.4 (kept) and 0.3 (dropped)
    assert f1_score(probs >= thr, targets) == pytest.approx(f1)
    assert best_f1_threshold(probs, targets, min_positives=3) is None
    assert best_f1_threshold(probs, np.zeros(5), min_positives=0) is None


def test_best_f1_threshold_ties_and_all_positive():
    # equal probabilities are never split by a cut
    thr, f1 = best_f1_threshold(np.array([0.5, 0.5, 0.2]), np.array([1, 0, 0]), min_positives=1)
    assert (thr, f1) == (pytest.approx(0.35), pytest.approx(2 / 3))
    # every unit positive -> keep them all: threshold is the lowest probability
    thr, f1 = best_f1_threshold(np.array([0.7, 0.2]), np.array([1, 1]), min_positives=1)
    assert (thr, f1) == (pytest.approx(0.2), pytest.approx(1.0))


# --- temperature recovery -----------------------------------------------------------------------


def _softened_choice_data(n: int, seed: int, t_true: float = 3.0) -> tuple[list[np.ndarray], list[int]]:
    rng = np.random.default_rng(seed)
    logits = [rng.normal(0.0, 3.0, size=4) for _ in range(n)]  # z ~ N(0, 3) per 4-option item
    gold = [int(rng.choice(4, p=softmax(z / t_true))) for z in logits]
    return logits, gold


def test_fit_softmax_temperature_recovers_t3():
    logits, gold = _softened_choice_data(4000, seed=0)
    t = fit_softmax_temperature(logits, gold)
    assert abs(t - 3.0) < 0.3
    held_logits, held_gold = _softened_choice_data(2000, seed=1)
    assert softmax_nll(held_logits, held_gold, t) < softmax_nll(held_logits, held_gold, 1.0)


def test_fit_softmax_temperature_variable_lengths():
    rng = np.random.default_rng(2)
    logits = [rng.normal(0.0, 3.0, size=int(rng.integers(2, 7))) for _ in range(4000)]
    gold = [int(rng.choice(len(z), p=softmax(z / 2.0))) for z in logits]
    assert abs(fit_softmax_temperature(logits, gold) - 2.0) < 0.25


def test_fit_softmax_temperature_clamps():
    separable = [np.array([1.0, 0.0]), np.array([0.0, 1.0])]  # optimum: T -> 0
    assert fit_softmax_temperature(separable, [0, 1]) == pytest.approx(calibrate.T_MIN)
    uninformative = [np.array([1.0, 0.0]), np.array([1.0, 0.0])]  # optimum: uniform, T -> infinity
    assert fit_softmax_temperature(uninformative, [0, 1]) == pytest.approx(calibrate.T_MAX)


def test_fit_sigmoid_temperature_recovers_t3():
    rng = np.random.default_rng(3)
    z = rng.normal(0.0, 3.0, size=20000)
    y = (rng.random(z.size) < sigmoid(z / 3.0)).astype(np.float64)
    t = fit_sigmoid_temperature(z, y)
    assert abs(t - 3.0) < 0.3
    assert sigmoid_nll(z, y, t) < sigmoid_nll(z, y, 1.0)


# --- gold checking --------------------------------------------------------------------------------

TEXT = "Ann Lee wrote to ann@x.org today"


def _choice(gold: Any, **kw: Any) -> dict[str, Any]:
    return {
        "id": "c",
        "task": "choice:t",
        "text": TEXT,
        "questions": [{"options": ["yes", "no"]}],
        "gold": gold,
        **kw,
    }


def _set(gold: Any) -> dict[str, Any]:
    return {
        "id": "s",
        "task": "set:t",
        "text": TEXT,
        "questions": [{"options": ["a", "b", "c"]}],
        "gold": gold,
    }


def _span(gold: Any) -> dict[str, Any]:
    return {
        "id": "p",
        "task": "span:pii",
        "text": TEXT,
        "questions": [{"labels": ["person", "email"]}],
        "gold": gold,
    }


@pytest.mark.parametrize(
    "obj, pattern",
    [
        (_choice("yes"), None),
        (_choice("maybe"), r"'maybe' is not among the options"),
        (_choice(["yes"]), r"choice gold must be one option"),
        (_choice(None), r"no gold"),
        (_set([]), None),
        (_set(["a", "c"]), None),
        (_set(["a", "z"]), r"\['z'\] are not among the options"),
        (_set(["a", "a"]), r"twice"),
        (_set("a"), r"set gold must be a list"),
        (_span([]), None),
        (_span([{"label": "person", "start": 0, "end": 7}]), None),
        (_span([{"label": "person", "start": 0, "end": 99}]), r"\[0, 99\) are outside the text of 32"),
        (_span([{"label": "person", "start": 5, "end": 5}]), r"outside the text"),
        (_span([{"label": "phone", "start": 0, "end": 3}]), r"label 'phone' is not among the labels"),
        (_span([{"label": "person", "start": 0}]), r"must be an object with label, start, end"),
        (_span([{"label": "person", "start": 0.0, "end": 3}]), r"must be integers"),
    ],
)
def test_check_gold_single_question(obj, pattern):
    reason = check_gold(parse_row(obj), obj["gold"])
    if pattern is None:
        assert reason is None
    else:
        assert reason is not None and re.search(pattern, reason), reason


def test_check_gold_multi_question_rows():
    obj = {
        "id": "m",
        "task": "choice:t",
        "text": TEXT,
        "questions": [{"options": ["yes", "no"]}, {"task": "set:s", "options": ["a", "b"]}],
    }
    row = parse_row(obj)
    assert check_gold(row, ["no", ["b"]]) is None
    assert check_gold(row, [None, ["b"]]) is None  # an unlabelled question is fine
    assert "no gold" in check_gold(row, [None, None])
    assert "list of 2 per-question golds" in check_gold(row, "yes")
    assert "list of 2 per-question golds; got a list of 1" in check_gold(row, ["yes"])
    assert check_gold(row, ["yes", ["q"]]).startswith("questions[1]: ")


# --- calibrate() with a stand-in model ------------------------------------------------------------


class FakeModel:
    """What calibrate() needs of a model: its calibration; vela2.predict is patched alongside."""

    def __init__(self, table: dict[tuple[str, int], Any], fail: set[str] = frozenset()):
        self.calibration = Calibration(set_thresholds={"set:rare": 0.3})
        self.table = table  # (row id, question) -> raw logits (choice/set) or {label: word logits} (span)
        self.fail = fail  # row ids the model fails on
        self.seen: list[str] = []


def _words(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"\S+", text)]


def fake_predict(model: FakeModel, rows: list[dict[str, Any]], *, precision: str, max_batch_tokens: int):
    assert precision == "fp32" and max_batch_tokens > 0
    out = []
    for r in rows:
        assert r["logits"] is True and r["units"] is True
        model.seen.append(r["id"])
        if r["id"] in model.fail:
            out.append(RowResult(id=r["id"], status=Status.error, error=ErrorInfo(type="model_error", message="boom")))
            continue
        answers = []
        for qi, q in enumerate(r["questions"]):
            task = q.get("task") or r["task"]
            raw = model.table[(r["id"], qi)]
            if task.startswith("span:"):
                offsets = _words(r["text"])
                units = Units(offsets=offsets, probs={k: [0.5] * len(v) for k, v in raw.items()}, logits=raw)
                answers.append(Answer(question=qi, task=task, probs={}, units=units))
            else:
                answers.append(Answer(question=qi, task=task, probs={}, logits=list(map(float, raw))))
        out.append(RowResult(id=r["id"], task=r["task"], status=Status.ok, answers=answers))
    return out


def _synthetic_rows(seed: int = 0) -> tuple[list[dict[str, Any]], FakeModel]:
    rng = np.random.default_rng(seed)
    table: dict[tuple[str, int], Any] = {}
    rows: list[dict[str, Any]] = []
    opts = ["a", "b", "c"]
    for i in range(600):  # choice:soft, gold from softmax(z / 3) over real options
        z = rng.normal(0.0, 3.0, size=4)  # 3 options then [ABS]
        table[(f"c{i}", 0)] = z
        gold = opts[int(rng.choice(3, p=softmax(z[:3] / 3.0)))]
        rows.append(
            {
                "id": f"c{i}",
                "task": "choice:soft",
                "text": "t",
                "questions": [{"options": opts}],
                "gold": gold,
            }
        )
    for i in range(400):  # set:s, gold from sigmoid(z / 2)
        z = rng.normal(0.0, 3.0, size=3)
        table[(f"s{i}", 0)] = z
        gold = [o for o, zz in zip(opts, z, strict=True) if rng.random() < sigmoid(zz / 2.0)]
        rows.append({"id": f"s{i}", "task": "set:s", "text": "t", "questions": [{"options": opts}], "gold": gold})
    for i in range(30):  # set:rare: two positives in all -> threshold kept
        table[(f"r{i}", 0)] = np.array([-4.0, -5.0])
        gold = ["p"] if i < 2 else []
        rows.append(
            {
                "id": f"r{i}",
                "task": "set:rare",
                "text": "t",
                "questions": [{"options": ["p", "q"]}],
                "gold": gold,
            }
        )
    text = "w0 w1 w2 w3 w4 w5 w6 w7"
    words = _words(text)
    for i in range(60):  # span:pii: person words inside gold spans have high logits; email nearly never
        person = rng.normal(-2.0, 1.0, size=8)
        spans = []
        for w in range(8):
            if rng.random() < 0.3:
                person[w] += 5.0
                spans.append({"label": "person", "start": words[w][0], "end": words[w][1]})
        if i < 2:
            spans.append({"label": "email", "start": words[0][0], "end": words[1][1]})  # two words
        table[(f"p{i}", 0)] = {"person": person.tolist(), "email": rng.normal(-3.0, 1.0, size=8).tolist()}
        rows.append(
            {
                "id": f"p{i}",
                "task": "span:pii",
                "text": text,
                "questions": [{"labels": ["person", "email"]}],
                "gold": spans,
            }
        )
    return rows, FakeModel(table)


@pytest.fixture
def fake_vela2(monkeypatch):
    monkeypatch.setattr(vela2, "predict", fake_predict, raising=False)


def test_calibrate_fits_and_reports(fake_vela2):
    rows, model = _synthetic_rows()
    base = model.calibration.to_dict()
    cal, report = calibrate.calibrate(model, rows)
    assert model.calibration.to_dict() == base  # the model's own calibration is untouched
    assert abs(cal.temperatures["choice:soft"] - 3.0) < 0.6
    assert cal.temperatures["choice"] == 1.0  # the type default is kept
    assert 1.4 < cal.T_set < 2.8
    assert cal.set_thresholds["set:rare"] == 0.3  # 2 positives < 5: kept
    assert "set:s" in cal.set_thresholds
    assert set(cal.span_thresholds["span:pii"]) == {"person"}  # email: 4 positive words < 5
    assert cal.pii == model.calibration.pii and cal.default_questions == model.calibration.default_questions

    tasks = report["tasks"]
    assert set(tasks) == {"choice:soft", "set:s", "set:rare", "span:pii"}
    soft = tasks["choice:soft"]
    assert soft["n"] == 600 and soft["type"] == "choice"
    assert soft["after"]["nll"] < soft["before"]["nll"]
    assert soft["after"]["ece"] < soft["before"]["ece"]
    assert soft["after"]["accuracy"] == soft["before"]["accuracy"]  # T never changes the argmax
    assert tasks["set:s"]["units"] == 1200 and tasks["set:s"]["after"]["nll"] < tasks["set:s"]["before"]["nll"]
    assert tasks["set:rare"]["notes"] == ["2 positives < 5; kept threshold 0.3"]
    assert any("label 'email': 4 positive words < 5" in n for n in tasks["span:pii"]["notes"])
    span = tasks["span:pii"]
    assert span["units"] == 60 * 8 * 2
    assert span["after"]["f1_per_label"]["person"] >= span["before"]["f1_per_label"]["person"]
    assert span["after"]["thresholds"]["email"] == 0.5
    assert report["skipped"] == [] and report["n_used"] == report["n_rows"] == len(rows)
    json.dumps(report)  # the report is plain JSON


def test_word_targets_use_overlap():
    offsets = np.array([[0, 3], [4, 7], [8, 13]])
    spans = [{"label": "person", "start": 5, "end": 9}, {"label": "email", "start": 0, "end": 13}]
    assert calibrate._word_targets(offsets, spans, "person").tolist() == [0.0, 1.0, 1.0]
    assert calibrate._word_targets(offsets, spans, "email").tolist() == [1.0, 1.0, 1.0]
    assert calibrate._word_targets(offsets, [], "email").tolist() == [0.0, 0.0, 0.0]


def test_calibrate_span_units_respect_question_fields(fake_vela2):
    text = "User: Ann Lee. Assistant: call Bob now"
    row = {
        "id": "f0",
        "task": "span:pii",
        "text": text,
        "fields": [{"name": "user", "start": 6, "end": 14}, {"name": "assistant", "start": 26, "end": len(text)}],
        "questions": [{"labels": ["person"], "fields": ["assistant"]}],
        "gold": [{"label": "person", "start": 31, "end": 34}],
    }
    n_words = len(_words(text))
    model = FakeModel({("f0", 0): {"person": [0.0] * n_words}})
    _, report = calibrate.calibrate(model, [row])
    span = report["tasks"]["span:pii"]
    assert span["units"] == 3  # "call", "Bob", "now": words of the assistant field only
    assert span["before"]["positives"] == 1


def test_calibrate_skips_bad_rows_with_ids(fake_vela2):
    rows, model = _synthetic_rows()
    model.fail = {"c1"}
    q2 = [{"options": ["a", "b"]}]
    bad = [
        {"id": "bad-gold", "task": "choice:soft", "text": "t", "questions": q2, "gold": "z"},
        {
            "id": "bad-span",
            "task": "span:pii",
            "text": "ab",
            "questions": [{"labels": ["person"]}],
            "gold": [{"label": "person", "start": 0, "end": 5}],
        },
        {"id": "bad-row", "task": "choice:soft", "questions": q2, "gold": "a"},
        {"id": "no-gold", "task": "choice:soft", "text": "t", "questions": q2},
    ]
    _, report = calibrate.calibrate(model, bad + rows)
    reasons = {s["id"]: s["reason"] for s in report["skipped"]}
    assert set(reasons) == {"bad-gold", "bad-span", "bad-row", "no-gold", "c1"}
    assert "'z' is not among the options" in reasons["bad-gold"]
    assert "outside the text of 2 characters" in reasons["bad-span"]
    assert reasons["bad-row"].startswith("invalid row: text")
    assert "boom" in reasons["c1"]
    assert not {"bad-gold", "bad-span", "bad-row", "no-gold"} & set(model.seen)  # never scored
    assert report["tasks"]["choice:soft"]["n"] == 599
    assert report["n_used"] == len(rows) - 1


def test_calibrate_without_usable_rows_keeps_calibration(fake_vela2):
    model = FakeModel({})
    cal, report = calibrate.calibrate(model, [{"id": "x", "task": "choice:t", "text": "t"}])
    assert cal.to_dict() == model.calibration.to_dict()
    assert report["tasks"] == {} and report["n_used"] == 0 and report["skipped"][0]["id"] == "x"


# --- the command --------------------------------------------------------------------------------


def test_calibrate_command_writes_backup_report_and_table(fake_vela2, monkeypatch, tmp_path, capsys):
    rows, model = _synthetic_rows()
    monkeypatch.setattr(vela2, "load", lambda path, device, dtype: model, raising=False)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    model.calibration.write(ckpt)
    old = (ckpt / "calibration.json").read_text()
    dev = tmp_path / "dev.jsonl"
    dev.write_text(
        "\n".join(json.dumps(r) for r in rows[:5]) + "\n\n{not json\n" + "\n".join(json.dumps(r) for r in rows[5:])
    )
    report_path = str(tmp_path / "r.json")
    rc = calibrate.calibrate_command(
        str(ckpt), str(dev), out=None, report_path=report_path, device="cpu", precision="fp32"
    )
    assert rc == 0
    backups = list(ckpt.glob("calibration.json.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == old
    new = Calibration.read(ckpt)
    assert abs(new.temperatures["choice:soft"] - 3.0) < 0.6
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["skipped"][0]["line"] == 7 and "invalid JSON" in report["skipped"][0]["reason"]
    assert report["tasks"]["choice:soft"]["after"]["temperature"] == pytest.approx(new.temperatures["choice:soft"])
    printed = capsys.readouterr().out
    assert re.search(r"choice:soft\s+600 .*-> ", printed)
    assert "skipped line 7" in printed and "wrote " in printed


def test_calibrate_command_out_and_no_usable_rows(fake_vela2, monkeypatch, tmp_path):
    rows, model = _synthetic_rows()
    monkeypatch.setattr(vela2, "load", lambda path, device, dtype: model, raising=False)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    dev = tmp_path / "dev.jsonl"
    dev.write_text("\n".join(json.dumps(r) for r in rows[:200]))
    out = tmp_path / "cal.json"
    run = lambda dev_path, out=None: calibrate.calibrate_command(
        str(ckpt), str(dev_path), out=out, report_path=None, device="cpu", precision="fp32"
    )
    assert run(dev, out=str(out)) == 0
    assert "choice:soft" in Calibration.read(out).temperatures
    assert not (ckpt / "calibration.json").exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"id": "u", "task": "choice:t", "text": "t", "questions": [{"options": ["a", "b"]}]}))
    assert run(empty) == 2
    assert not (ckpt / "calibration.json").exists()
    assert run(tmp_path / "missing.jsonl") == 2


# --- end to end on the demo checkpoint (fixtures demo_dir, demo_model: tests/conftest.py) ------

_VOCAB_TEXT = """the of and to in is was for on that with as by at from it this are or have not which but were
company market report price bank city police court party group water school health data system question
answer option label person email phone address account number name team game music film sky green blue
red yellow true false yes no maybe agree disagree neutral positive negative score quality helpful harmful
safe unsafe violence hate privacy medical legal finance sports politics science technology travel food
weather review product service customer support order delivery refund payment card password login"""
VOCAB = sorted(set(_VOCAB_TEXT.split()))


def _demo_choice_rows(n_rows: int, n_questions: int, seed: int) -> list[dict[str, Any]]:
    """Generated rows, each bundling `n_questions` 4-option questions over one text."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_rows):
        questions = []
        for _ in range(n_questions):
            options = [str(w) for w in rng.choice(VOCAB, size=4, replace=False)]
            questions.append({"question": " ".join(rng.choice(VOCAB, size=5)) + "?", "options": options})
        text = " ".join(rng.choice(VOCAB, size=int(rng.integers(5, 30))))
        rows.append({"id": f"d{i}", "task": "choice:softened", "text": text, "questions": questions})
    return rows


def test_calibrate_recovers_t3_on_demo_model(demo_dir):
    model = vela2.load(demo_dir)  # its own copy: the option head is rescaled below
    rows = _demo_choice_rows(300, 8, seed=0)
    raw = vela2.predict(model, [dict(r, logits=True) for r in rows], precision="fp32")
    logits = [np.asarray(a.logits[:4]) for res in raw for a in res.answers]  # real options; [ABS] last
    spread = float(np.std([z - z.mean() for z in logits]))  # within-question std of option logits
    assert spread > 0.05, f"demo option logits barely differ within a question (std {spread:.3f})"
    # T is only identifiable when options' logits differ by O(T) within a question; the random demo
    # heads do not promise that, so scale the option head's (linear) output layer to a spread of 2.
    k = 2.0 / spread
    with torch.no_grad():
        model.option_head.out.weight.mul_(k)
        model.option_head.out.bias.mul_(k)
    rng = np.random.default_rng(1)
    it = iter(logits)
    for row in rows:  # gold ~ softmax(model logits / 3); the rescaled model's logits are k * z
        row["gold"] = [q["options"][int(rng.choice(4, p=softmax(k * next(it) / 3.0)))] for q in row["questions"]]

    fit_rows, held_rows = rows[:200], rows[200:]
    cal, report = calibrate.calibrate(model, fit_rows, precision="fp32")
    t = cal.temperatures["choice:softened"]
    assert 2.4 <= t <= 3.6, t
    assert report["tasks"]["choice:softened"]["n"] == 1600 and report["skipped"] == []
    held, skipped = calibrate.gather(model, held_rows, precision="fp32")
    assert skipped == []
    held_logits = held["choice:softened"].logits
    assert np.allclose(np.concatenate(held_logits), k * np.concatenate(logits[1600:]), rtol=1e-4, atol=1e-4)
    before = calibrate.evaluate(held, model.calibration)["choice:softened"]
    after = calibrate.evaluate(held, cal)["choice:softened"]
    assert after["nll"] < before["nll"] and after["ece"] < before["ece"]


def test_calibrate_command_on_demo_checkpoint_set_and_span(demo_dir, tmp_path, capsys):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(demo_dir, ckpt)
    rng = np.random.default_rng(2)
    rows = []
    for i in range(40):
        words = [str(w) for w in rng.choice(VOCAB, size=12)]
        text = " ".join(words)
        starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
        spans = [
            {"label": "person", "start": int(s), "end": int(s) + len(w)}
            for s, w in zip(starts, words, strict=True)
            if rng.random() < 0.3
        ]
        gold_set = [o for o in ["violence", "hate", "privacy"] if rng.random() < 0.4]
        rows.append(
            {
                "id": f"m{i}",
                "task": "span:pii_dev",
                "text": text,
                "questions": [
                    {"labels": ["person", "email"]},
                    {"task": "set:shield", "options": ["violence", "hate", "privacy"]},
                ],
                "gold": [spans, gold_set],
            }
        )
    oob = {"label": "person", "start": 2, "end": 9}
    rows.append(
        {"id": "oob", "task": "span:pii_dev", "text": "a b", "questions": [{"labels": ["person"]}], "gold": [oob]}
    )
    dev = tmp_path / "dev.jsonl"
    dev.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    report_path = tmp_path / "report.json"
    rc = calibrate.calibrate_command(
        str(ckpt), str(dev), out=None, report_path=str(report_path), device="cpu", precision="fp32"
    )
    assert rc == 0
    report = json.loads(report_path.read_text())
    assert [s["id"] for s in report["skipped"]] == ["oob"]
    span, set_ = report["tasks"]["span:pii_dev"], report["tasks"]["set:shield"]
    assert span["units"] == 40 * 12 * 2 and set_["units"] == 40 * 3
    assert any("'email': 0 positive words < 5" in n for n in span["notes"])
    cal = Calibration.read(ckpt)
    assert set(cal.span_thresholds["span:pii_dev"]) == {"person"}
    assert 0.0 < cal.set_thresholds["set:shield"] < 1.0
    assert cal.T_set == report["T_set"]["after"] and cal.T_span == report["T_span"]["after"]
    assert cal.pii == Calibration.read(demo_dir).pii  # not fitted: kept
    assert len(list(ckpt.glob("calibration.json.bak-*"))) == 1
    assert "span:pii_dev" in capsys.readouterr().out


def test_read_jsonl_lists_bad_lines_and_keeps_the_rest(tmp_path):
    """Non-UTF-8 bytes and JSON nested past 64 levels make their own line a bad row, not a crash."""
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"id": "a"}\n'
                     b'{"id": "x\xff\xfe"}\n'
                     + b"[" * 100_000 + b"]" * 100_000 + b"\n"
                     b"{broken\n"
                     b"\n"
                     b'{"id": "b"}\n')
    rows, bad = read_jsonl(path)
    assert rows == [{"id": "a"}, {"id": "b"}]
    assert [b["line"] for b in bad] == [2, 3, 4] and all(b["id"] is None for b in bad)
    assert bad[0]["reason"].startswith("not valid UTF-8")
    assert bad[1]["reason"] == "invalid JSON: nested deeper than 64 levels"
    assert bad[2]["reason"].startswith("invalid JSON: ")
