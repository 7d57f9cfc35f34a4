"""The metrics of calibration and evaluation (pure numpy, float64): NLL, ECE, F1, the threshold with
the best F1, and `evaluate`: per task metrics of a calibration on gathered data (what `vela2
calibrate` reports before / after and `vela2 eval` prints)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vela2.model.calibration import Calibration, sigmoid, softmax
from vela2.train.task_data import TaskData

ECE_BINS = 15  # equal-width confidence bins of the reported ECE
MIN_POSITIVES = 5  # positive units a threshold fit needs; fewer -> keep the current threshold


def softmax_nll(logits: list[np.ndarray], gold: list[int], temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of `gold` under softmax(logits / T); one vector per item."""
    if len(logits) != len(gold) or not logits:
        raise ValueError(f"need as many gold labels as logit vectors (> 0); got {len(gold)} and {len(logits)}")
    total = 0.0
    for z, g in zip(logits, gold, strict=True):
        s = np.asarray(z, dtype=np.float64) / temperature
        m = s.max()
        total += m + math.log(np.exp(s - m).sum()) - s[g]
    return total / len(logits)


def sigmoid_nll(logits: np.ndarray, targets: np.ndarray, temperature: float = 1.0) -> float:
    """Mean binary cross-entropy of 0/1 `targets` under sigmoid(logits / T), computed stably."""
    x = np.asarray(logits, dtype=np.float64) / temperature
    y = np.asarray(targets, dtype=np.float64)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"logits and targets must have one equal, non-empty shape; got {x.shape} and {y.shape}")
    # softplus(x) - y * x == -[y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))]
    return float((np.logaddexp(0.0, x) - y * x).mean())


def ece(confidences: np.ndarray, correct: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """Expected calibration error over equal-width bins (lo, hi] of [0, 1] (0 falls in the first).

    ECE = sum over bins of |bin| / N * |mean(correct) - mean(confidence)|. For binary units pass
    confidence = P(positive) and correct = target (the reliability of the positive probability).
    """
    c = np.asarray(confidences, dtype=np.float64)
    y = np.asarray(correct, dtype=np.float64)
    if c.shape != y.shape or c.ndim != 1 or c.size == 0:
        raise ValueError(f"confidences and correct must be equal, non-empty 1-d; got {c.shape} and {y.shape}")
    bins = np.clip(np.ceil(c * n_bins).astype(int) - 1, 0, n_bins - 1)  # (N,) bin index
    total = 0.0
    for b in range(n_bins):
        sel = bins == b
        if sel.any():
            total += sel.sum() / c.size * abs(y[sel].mean() - c[sel].mean())
    return float(total)


def f1_from_counts(tp: int, fp: int, fn: int) -> float:
    """F1 = 2TP / (2TP + FP + FN); 1.0 when there is nothing to find and nothing was predicted."""
    denom = 2 * tp + fp + fn
    return 1.0 if denom == 0 else 2 * tp / denom


def f1_score(predicted: np.ndarray, targets: np.ndarray) -> float:
    """Binary F1 of boolean predictions against 0/1 targets (micro over all units given)."""
    p = np.asarray(predicted, dtype=bool)
    t = np.asarray(targets, dtype=bool)
    return f1_from_counts(int((p & t).sum()), int((p & ~t).sum()), int((~p & t).sum()))


def best_f1_threshold(
    probs: np.ndarray, targets: np.ndarray, min_positives: int = MIN_POSITIVES
) -> tuple[float, float] | None:
    """The threshold (decision: p >= threshold) with the best F1, and that F1.

    None when fewer than `min_positives` targets are positive (keep the default). Candidate cuts
    lie between consecutive distinct probabilities; the returned threshold is the midpoint between
    the lowest probability kept positive and the next lower one (the lowest probability itself when
    every unit is predicted positive). Ties go to the highest threshold (fewest positives).
    """
    p = np.asarray(probs, dtype=np.float64)
    t = np.asarray(targets, dtype=bool)
    if p.shape != t.shape or p.ndim != 1:
        raise ValueError(f"probs and targets must be equal 1-d arrays; got {p.shape} and {t.shape}")
    n_pos = int(t.sum())
    if n_pos < min_positives or n_pos == 0:
        return None
    order = np.argsort(-p, kind="stable")
    ps, ts = p[order], t[order]  # (N,) descending probabilities
    tp = np.cumsum(ts)  # (N,) TP when the first k+1 units are predicted positive
    fp = np.cumsum(~ts)
    # only cut after the last unit of a run of equal probabilities
    last = np.r_[ps[1:] != ps[:-1], True]
    f1 = np.where(last, 2 * tp / (tp + fp + n_pos), -1.0)
    k = int(np.argmax(f1))  # first maximum = highest threshold
    thr = ps[k] if k == len(ps) - 1 else (ps[k] + ps[k + 1]) / 2
    return float(thr), float(f1[k])


def evaluate(data: dict[str, TaskData], cal: Calibration) -> dict[str, dict[str, Any]]:
    """Per task metrics of `cal` on gathered data: NLL, ECE (15 bins), accuracy or F1, T, thresholds.

    choice / score: NLL of gold under softmax over real options; ECE with confidence = max prob and
    correct = argmax == gold; accuracy. set / span: binary NLL and ECE per unit (probability vs
    target); F1 micro over the task's units at its thresholds (span: word-level).
    """
    out: dict[str, dict[str, Any]] = {}
    for task, td in sorted(data.items()):
        m: dict[str, Any] = {"temperature": cal.temperature(task)}
        if td.kind in ("choice", "score"):
            m.update(_option_metrics(td, cal.temperature(task)))
        else:
            m.update(_unit_metrics(task, td, cal))
        out[task] = m
    return out


def _option_metrics(td: TaskData, t: float) -> dict[str, Any]:
    """choice / score at temperature `t`: NLL of the gold options, ECE of the top probability, accuracy."""
    probs = [softmax(z / t) for z in td.logits]
    conf = np.array([p.max() for p in probs])
    correct = np.array([int(np.argmax(p)) == g for p, g in zip(probs, td.gold, strict=True)])
    return {"nll": softmax_nll(td.logits, td.gold, t), "ece": ece(conf, correct), "accuracy": float(correct.mean())}


def _unit_metrics(task: str, td: TaskData, cal: Calibration) -> dict[str, Any]:
    """set / span: binary NLL, ECE and F1 over every unit of the task at `cal`'s thresholds, the
    thresholds themselves and (span) the F1 of each label."""
    t = cal.T_set if td.kind == "set" else cal.T_span
    zs, ys, preds = [], [], []
    thresholds: dict[str, float] = {}
    per_label: dict[str, float] = {}
    for key, u in sorted(td.units.items()):
        z, y = u.arrays()
        thr = cal.set_threshold(task) if td.kind == "set" else cal.span_threshold(task, key)
        pred = sigmoid(z / t) >= thr
        thresholds[key] = thr
        per_label[key] = f1_score(pred, y)
        zs.append(z)
        ys.append(y)
        preds.append(pred)
    z, y = np.concatenate(zs), np.concatenate(ys)
    m: dict[str, Any] = {}
    if z.size == 0:  # e.g. every word outside the questions' fields
        m.update(nll=None, ece=None, f1=None, positives=0)
    else:
        m.update(
            nll=sigmoid_nll(z, y, t),
            ece=ece(sigmoid(z / t), y),
            f1=f1_score(np.concatenate(preds), y),
            positives=int(y.sum()),
        )
    if td.kind == "set":
        m["threshold"] = thresholds["*"]
    else:
        m["thresholds"] = thresholds
        m["f1_per_label"] = per_label
    return m
