"""What a calibration fit reads: per task, the raw (uncalibrated) model outputs of labelled questions
and their gold, as `vela2.train.calibrate.gather` collects them from predict() results."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class BinaryUnits:
    """Binary units (set options or span words of one label): raw logits and 0/1 targets."""

    logits: list[np.ndarray] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)

    def add(self, logits: np.ndarray, targets: np.ndarray) -> None:
        """Add one question's units: (n,) raw logits and their (n,) 0/1 targets."""
        self.logits.append(np.asarray(logits, dtype=np.float64))
        self.targets.append(np.asarray(targets, dtype=np.float64))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every unit added, as (N,) float64 logits and (N,) targets (empty arrays when none)."""
        if not self.logits:
            return np.zeros(0), np.zeros(0)
        return np.concatenate(self.logits), np.concatenate(self.targets)


@dataclass
class TaskData:
    """Everything one task contributes to the fit, from the raw (uncalibrated) model outputs."""

    task: str
    kind: str
    n_questions: int = 0
    logits: list[np.ndarray] = field(default_factory=list)  # choice/score: (n_options,) per question
    gold: list[int] = field(default_factory=list)  # choice/score: gold option index per question
    units: dict[str, BinaryUnits] = field(default_factory=dict)  # set: {"*": options}; span: label -> words

    def n_units(self) -> int:
        """How many binary units (set options, span words x labels) the task has."""
        return int(sum(u.arrays()[0].size for u in self.units.values()))


def merge(into: TaskData, part: TaskData) -> None:
    """Add the questions of `part` (same task) to `into`."""
    into.n_questions += part.n_questions
    into.logits += part.logits
    into.gold += part.gold
    for key, u in part.units.items():
        dst = into.units.setdefault(key, BinaryUnits())
        dst.logits += u.logits
        dst.targets += u.targets
