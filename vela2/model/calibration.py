"""calibration.json: temperatures, thresholds, PII rules, default question texts, and their math.

Everything here maps raw head logits (fp32 numpy) to the calibrated probabilities and decisions
that results report. `vela2 calibrate` (vela2/train/calibrate.py) writes the same file.
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vela2.errors import CheckpointError

GENERIC_SPAN_THRESHOLD = 0.5  # `span:*` export default, not dev-fitted
GENERIC_SET_THRESHOLD = 0.5  # set tasks without a fitted threshold

# GLiNER2-style default question texts, used when a block has no question (open-label kinds too).
DEFAULT_QUESTIONS = {
    "choice": "Which option fits the text best?",
    "score": "Which score fits the text best?",
    "set": "Which of these apply to the text?",
    "span": "Find the spans of these types in the text.",
    "classify": "Which of these labels describe the text?",
    "extract": "Extract all entities of these types from the text.",
}


@dataclass
class PiiRules:
    """Rules applied to PII span tasks only (tasks whose name matches one of `tasks`)."""

    tasks: list[str] = field(default_factory=lambda: ["pii*"])  # fnmatch patterns over task names
    min_chars: dict[str, int] = field(default_factory=dict)  # label -> shortest span kept, in characters
    min_words: dict[str, int] = field(default_factory=dict)  # label -> shortest span kept, in words
    sparse_gate: float = 0.0  # row max word x label probability below this -> no spans, gate fired

    def applies_to(self, task_name: str) -> bool:
        """Whether the PII rules apply to a span task of this name (one of the `tasks` patterns matches)."""
        return any(fnmatch.fnmatchcase(task_name, pat) for pat in self.tasks)


@dataclass
class Calibration:
    """The contents of calibration.json."""

    temperatures: dict[str, float] = field(default_factory=lambda: {"choice": 1.0, "score": 1.0})
    T_set: float = 1.0
    T_span: float = 1.0
    set_thresholds: dict[str, float] = field(default_factory=dict)  # "set:name" -> threshold
    span_thresholds: dict[str, dict[str, float]] = field(default_factory=dict)  # "span:name" -> label -> thr
    span_default_threshold: float = GENERIC_SPAN_THRESHOLD  # `span:*`
    span_overlap: dict[str, str] = field(default_factory=dict)  # "span:name" -> flat | nested
    pii: PiiRules = field(default_factory=PiiRules)
    default_questions: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_QUESTIONS))
    version: int = 1

    def __post_init__(self) -> None:
        # a checkpoint may override some default question texts only: the others keep theirs
        self.default_questions = {**DEFAULT_QUESTIONS, **self.default_questions}

    # --- lookups -------------------------------------------------------------------------------
    def temperature(self, task: str) -> float:
        """T of a choice / score task: the task's own if fitted, else its type's, else 1."""
        kind = task.split(":", 1)[0]
        if kind == "set":
            return self.T_set
        if kind == "span":
            return self.T_span
        return float(self.temperatures.get(task, self.temperatures.get(kind, 1.0)))

    def set_threshold(self, task: str) -> float:
        """The probability threshold of set task `task` (the generic set default when none is fitted)."""
        return float(self.set_thresholds.get(task, GENERIC_SET_THRESHOLD))

    def span_threshold(self, task: str, label: str) -> float:
        """The threshold of `label` in span task `task`: the label's, else the task's "*", else the default."""
        per = self.span_thresholds.get(task, {})
        return float(per.get(label, per.get("*", self.span_default_threshold)))

    def is_pii(self, task: str) -> bool:
        """Whether `task` is a span task the PII rules apply to."""
        return task.startswith("span:") and self.pii.applies_to(task.split(":", 1)[1])

    def overlap(self, task: str) -> str:
        """`flat` (greedy by score across labels) for PII tasks unless set, else `nested`."""
        return self.span_overlap.get(task, "flat" if self.is_pii(task) else "nested")

    def question_text(self, kind: str) -> str:
        """The default question text of a SystemOne kind (a task given without `question`)."""
        return self.default_questions[kind]

    # --- I/O -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The calibration as calibration.json holds it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        """The calibration of a calibration.json object; CheckpointError for unknown keys, bad
        question texts or a temperature that is not > 0."""
        d = dict(d)
        pii = PiiRules(**d.pop("pii", {}))
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise CheckpointError(f"calibration.json has unknown keys: {sorted(unknown)}")
        questions = d.get("default_questions", {})
        if not isinstance(questions, dict) or not all(isinstance(v, str) and v.strip() for v in questions.values()):
            raise CheckpointError(
                f"calibration.json: default_questions must map kinds to question texts; got {questions!r}"
            )
        cal = cls(**d, pii=pii)
        for name, t in [*cal.temperatures.items(), ("T_set", cal.T_set), ("T_span", cal.T_span)]:
            if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
                raise CheckpointError(f"calibration.json: temperature {name} must be > 0; got {t!r}")
        return cal

    @classmethod
    def read(cls, path: str | Path) -> Calibration:
        """The calibration at `path` (a file, or a checkpoint directory); the defaults when there is none."""
        p = Path(path)
        p = p / "calibration.json" if p.is_dir() else p
        if not p.is_file():
            return cls()
        return cls.from_dict(json.loads(p.read_text()))

    def write(self, path: str | Path) -> None:
        """Write calibration.json at `path` (a file, or into a checkpoint directory)."""
        p = Path(path)
        p = p / "calibration.json" if p.is_dir() else p
        p.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


# --- math on raw logits (fp32 numpy) -----------------------------------------------------------


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, shifted by the maximum (no overflow)."""
    z = x - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)); exp overflowing for x < -709 gives the exact limit 0, without a warning."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def choice_probs(logits: np.ndarray, temperature: float, n_options: int) -> tuple[np.ndarray, float]:
    """Option probabilities and abstain probability of one choice / score block.

    logits: (n_options + 1,) — the options, then [ABS].
    Probabilities are softmax over the real options only (the convention temperatures are fitted on);
    the abstain probability is P([ABS]) from the softmax over options + [ABS], at the same T.
    """
    if logits.shape != (n_options + 1,):
        raise ValueError(f"expected {n_options + 1} logits (options + [ABS]); got shape {logits.shape}")
    # A temperature so small that logits / T overflows gives NaN here, without a warning; results
    # refuse non-finite numbers (vela2.scoring.pipeline.finish answers such a row with a model_error).
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = logits.astype(np.float64) / temperature
        probs = softmax(scaled[:n_options])
        abstain = float(softmax(scaled)[n_options])
    return probs, abstain


def option_value(option: str) -> float | None:
    """The number an option stands for: `float(option)` when that is finite, else None ("nan",
    "inf", "-Infinity" and "1e999" are not numbers here)."""
    try:
        value = float(option)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def expected_value(options: list[str], probs: np.ndarray) -> float | None:
    """Probability-weighted option value of a score block; None unless every option is numeric
    (`option_value`). Always finite: it lies between the smallest and the largest value."""
    parsed = [option_value(o) for o in options]
    if not parsed or any(v is None for v in parsed):
        return None
    values = np.array(parsed, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        total = float((values * p).sum())
        if not math.isfinite(total):  # values near the float limit: sum the scaled values instead
            scale = float(np.abs(values).max())
            total = float((values / scale * p).sum()) * scale
    if math.isnan(total):
        return None
    return min(max(total, float(values.min())), float(values.max()))
