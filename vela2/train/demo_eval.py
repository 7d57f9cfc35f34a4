"""The demo model's held-out evaluation: its answers on messages of template families, formats, names
and companies it never saw (`vela2.train.synthetic`, split "held_out"), scored per family.

The numbers are those of the served answers (`vela2.predict`: calibrated, thresholds, the PII rules
and span decoding applied): span F1 is word-level (a word counts for a label when it overlaps a
span of that label, in the gold and in the answer), choice / score / set accuracy is the share of
exact decisions. Each span label is also scored per format family of its slot (e-mail "hyphen",
phone "no", ...), each choice per phrasing family of the sentence that carries its answer.
`vela2 init-demo` writes the result beside the weights (`HELD_OUT_FILE`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vela2.train.metrics import f1_from_counts

HELD_OUT_FILE = "held-out.json"
# The goals (issue 40) on held-out families: span F1 per label, accuracy per choice task; every family
# of the label or the task is held to it, not only the pooled number.
GOALS: dict[str, dict[str, float]] = {
    "spans": {"email": 0.9, "phone": 0.8, "person": 0.7},
    "choices": {"choice:intent": 0.9, "choice:sentiment": 0.9},
}
# the family each choice question's answer is carried by (the sentence of that family says it)
_CHOICE_FAMILY = {"choice:intent": "intent", "choice:sentiment": "sentiment", "choice:topic": "topic",
                  "score:satisfaction": "sentiment", "set:toxicity": "toxicity"}
NO_FAMILY = "(none)"  # a message without the slot: its spans count as false positives here


def _word_flags(offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """(W,) True for the words [s, e) that overlap one of `spans` [start, end)."""
    flags = np.zeros(len(offsets), dtype=bool)
    for start, end in spans:
        flags |= (offsets[:, 0] < end) & (start < offsets[:, 1])
    return flags


def _count(table: dict[str, dict[str, list[int]]], key: str, family: str, values: list[int]) -> None:
    entry = table.setdefault(key, {}).setdefault(family, [0] * len(values))
    for i, v in enumerate(values):
        entry[i] += v


def _tally(pairs: list[tuple[dict[str, Any], dict[str, str]]], results: list[Any]) -> tuple[dict, dict]:
    """Counts per (label, family): [tp, fp, fn] words; per (task, family): [correct, questions]."""
    from vela2.text.rendering import split_words

    spans: dict[str, dict[str, list[int]]] = {}
    choices: dict[str, dict[str, list[int]]] = {}
    for (row, fams), res in zip(pairs, results, strict=True):
        if res.status != "ok":
            raise ValueError(f"held-out row {row['id']} got no answer: {res.error}")
        offsets = split_words(row["text"])
        for question, gold, answer in zip(row["questions"], row["gold"], res.answers, strict=True):
            task = question["task"]
            if task.startswith("span:"):
                for label in question["labels"]:
                    g = _word_flags(offsets, [(s["start"], s["end"]) for s in gold if s["label"] == label])
                    p = _word_flags(offsets, [(s.start, s.end) for s in answer.spans or [] if s.label == label])
                    counts = [int((g & p).sum()), int((p & ~g).sum()), int((g & ~p).sum())]
                    _count(spans, label, fams.get(label, NO_FAMILY), counts)
            else:
                decision = answer.decision
                right = sorted(decision) == sorted(gold) if isinstance(gold, list) else decision == gold
                _count(choices, task, fams.get(_CHOICE_FAMILY.get(task, ""), NO_FAMILY), [int(right), 1])
    return spans, choices


def _summary(spans: dict, choices: dict) -> dict[str, Any]:
    def f1(c: list[int]) -> float:
        return round(f1_from_counts(*c), 4)

    out: dict[str, Any] = {"spans": {}, "choices": {}}
    for label, by_family in sorted(spans.items()):
        pooled = [sum(c[i] for c in by_family.values()) for i in range(3)]
        out["spans"][label] = {
            "f1": f1(pooled), "gold_words": pooled[0] + pooled[2],
            "families": {fam: {"f1": f1(c), "gold_words": c[0] + c[2]}
                         for fam, c in sorted(by_family.items()) if fam != NO_FAMILY},
            "false_positive_words_without_one": by_family.get(NO_FAMILY, [0, 0, 0])[1],
        }
    for task, by_family in sorted(choices.items()):
        right, n = (sum(c[i] for c in by_family.values()) for i in range(2))
        out["choices"][task] = {
            "accuracy": round(right / n, 4), "n": n,
            "families": {fam: {"accuracy": round(c[0] / c[1], 4), "n": c[1]} for fam, c in sorted(by_family.items())},
        }
    return out


def evaluate_split(model: Any, n_rows: int, seed: int, split: str) -> dict[str, Any]:
    """Scores of `model` on `n_rows` bundled rows of `split` (seed `seed`), pooled and per family."""
    import vela2
    from vela2.train.synthetic import labelled_rows_with_families

    pairs = labelled_rows_with_families(n_rows, seed, bundled_share=1.0, split=split)
    results = vela2.predict(model, [row for row, _ in pairs], precision="fp32")
    return {"split": split, "seed": seed, "rows": n_rows, **_summary(*_tally(pairs, results))}


def misses(report: dict[str, Any], goals: dict[str, dict[str, float]] | None = None) -> list[str]:
    """The goals `report` (of `evaluate_split`) misses: one line per label / task and family under its goal."""
    out = []
    for section, key in (("spans", "f1"), ("choices", "accuracy")):
        for name, goal in (goals or GOALS)[section].items():
            entry = report[section][name]
            below = [f"{fam} {e[key]:.3f}" for fam, e in entry["families"].items() if e[key] < goal]
            if entry[key] < goal or below:
                out.append(f"{name}: {key} {entry[key]:.3f} < {goal}" + (f" (families: {', '.join(below)})"
                                                                          if below else ""))
    return out


def format_report(report: dict[str, Any]) -> str:
    """`evaluate_split`'s report as lines: each span label and choice task, then its families."""
    lines = [f"{report['split']} rows: {report['rows']} (seed {report['seed']})"]
    for label, e in report["spans"].items():
        lines.append(f"  span {label:<9} F1 {e['f1']:.3f} over {e['gold_words']} gold words; "
                     f"{e['false_positive_words_without_one']} words marked in messages without one")
        lines += [f"      {fam:<16} F1 {f['f1']:.3f} ({f['gold_words']} words)" for fam, f in e["families"].items()]
    for task, e in report["choices"].items():
        lines.append(f"  {task:<20} accuracy {e['accuracy']:.3f} over {e['n']}")
        lines += [f"      {fam:<16} accuracy {f['accuracy']:.3f} ({f['n']})" for fam, f in e["families"].items()]
    return "\n".join(lines)
