"""`vela2 calibrate`: fit temperatures and thresholds of calibration.json from labelled rows.

Three layers, top-down:

1. Pure math on numpy arrays (float64): NLL, ECE, F1, and the temperature fits (torch LBFGS on
   log T, T clamped to [0.05, 20]).
2. Gold checking: `check_gold(row, gold)` says why a labelled row cannot be used.
3. `calibrate(model, rows)`: runs `vela2.predict` with raw logits and word units, gathers per-task
   data, fits, and reports metrics before / after; `calibrate_command` is the CLI around it.

What is fitted (everything else in calibration.json is kept as it was):
- choice / score: one temperature per task ("choice:boolq"), softmax over the REAL options only
  ([ABS] excluded, the convention results use for `probs`).
- set: one `T_set` over every option of every set question; then a threshold per set task
  (best F1 over that task's options, at the new T_set).
- span: one `T_span` over every word x label unit (words outside a question's `fields` are left
  out; gold offsets index the row's whole `text`); then a threshold per span task x label by
  WORD-LEVEL F1 (a word is positive for a label when it overlaps a gold span of that label; the
  decoder's runs, length rule and sparse gate are not simulated).
Thresholds need `min_positives` positive units, else the current value is kept and a note says so.
"After" metrics are measured on the same rows the fit used (in-sample).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vela2.api.schemas import Row, guess_id_task, parse_row, split_task
from vela2.config import DEFAULT_MAX_BATCH_TOKENS
from vela2.errors import InvalidRequest, Vela2Error
from vela2.model.calibration import Calibration, sigmoid, softmax

logger = logging.getLogger(__name__)

T_MIN = 0.05  # fitted temperatures are clamped to [T_MIN, T_MAX]
T_MAX = 20.0
ECE_BINS = 15  # equal-width confidence bins of the reported ECE
MIN_POSITIVES = 5  # positive units a threshold fit needs; fewer -> keep the current threshold
MIN_TEMPERATURE_ITEMS = 10  # questions (choice/score) or units (set/span) a temperature fit needs


# --- math ----------------------------------------------------------------------------------------


def _pad(logits: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Variable-length logit vectors -> (N, K_max) float64 values and a (N, K_max) bool mask."""
    k_max = max(len(z) for z in logits)
    values = np.zeros((len(logits), k_max), dtype=np.float64)
    mask = np.zeros((len(logits), k_max), dtype=bool)
    for i, z in enumerate(logits):
        values[i, : len(z)] = z
        mask[i, : len(z)] = True
    return values, mask


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


def _fit_log_temperature(loss_at: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """Minimise loss_at(T) over log T with LBFGS; T clamped to [T_MIN, T_MAX]."""
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    lo, hi = math.log(T_MIN), math.log(T_MAX)
    opt = torch.optim.LBFGS(
        [log_t],
        lr=1.0,
        max_iter=200,
        tolerance_grad=1e-10,
        tolerance_change=1e-14,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        # clamping inside keeps the logits finite if the line search wanders (separable data)
        loss = loss_at(torch.exp(log_t.clamp(lo - 1.0, hi + 1.0)))
        loss.backward()
        return loss

    opt.step(closure)
    t = float(torch.exp(log_t.detach()))
    if not math.isfinite(t):
        t = T_MIN if log_t.item() < 0 else T_MAX
    return float(min(max(t, T_MIN), T_MAX))


def fit_softmax_temperature(logits: list[np.ndarray], gold: list[int]) -> float:
    """The temperature minimising the NLL of `gold` under softmax(logits / T).

    logits: one vector per item over that item's REAL options only (lengths may differ); gold: the
    index of the right option of each item. Optimises log T with LBFGS in float64; T in [0.05, 20].
    """
    if len(logits) != len(gold) or not logits:
        raise ValueError(f"need as many gold labels as logit vectors (> 0); got {len(gold)} and {len(logits)}")
    values, mask = _pad(logits)
    z = torch.from_numpy(values)  # (N, K_max)
    m = torch.from_numpy(mask)  # (N, K_max)
    g = torch.as_tensor(gold, dtype=torch.long)  # (N,)
    if bool((g < 0).any()) or bool((g >= m.sum(1)).any()):
        raise ValueError("gold index outside its item's options")
    neg_inf = torch.tensor(-math.inf, dtype=torch.float64)

    def loss_at(t: torch.Tensor) -> torch.Tensor:
        s = torch.where(m, z / t, neg_inf)  # (N, K_max); padding never wins the softmax
        return (torch.logsumexp(s, dim=1) - s.gather(1, g[:, None]).squeeze(1)).mean()

    return _fit_log_temperature(loss_at)


def fit_sigmoid_temperature(logits: np.ndarray, targets: np.ndarray) -> float:
    """The temperature minimising the binary NLL of 0/1 `targets` under sigmoid(logits / T).

    logits, targets: (N,) arrays. LBFGS on log T in float64; T in [0.05, 20].
    """
    x = torch.as_tensor(np.asarray(logits, dtype=np.float64))
    y = torch.as_tensor(np.asarray(targets, dtype=np.float64))
    if x.shape != y.shape or x.numel() == 0:
        raise ValueError(f"logits and targets must have one equal, non-empty shape; got {x.shape} and {y.shape}")

    def loss_at(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.binary_cross_entropy_with_logits(x / t, y)

    return _fit_log_temperature(loss_at)


# --- gold -----------------------------------------------------------------------------------------


def question_golds(row: Row, gold: Any) -> list[Any]:
    """`gold` aligned with the row's questions: the gold itself for a one-question row, else the list.

    A multi-question row's gold must be a list with one entry per question (None = unlabelled).
    Raises ValueError when it is not.
    """
    n = len(row.questions)
    if n == 1:
        return [gold]
    if not isinstance(gold, list) or len(gold) != n:
        got = f"a list of {len(gold)}" if isinstance(gold, list) else type(gold).__name__
        raise ValueError(f"gold of a row with {n} questions must be a list of {n} per-question golds; got {got}")
    return list(gold)


def _check_question_gold(kind: str, q: Any, text: str, gold: Any) -> str | None:
    if gold is None:
        return None
    if kind in ("choice", "score"):
        if not isinstance(gold, str):
            return f"{kind} gold must be one option (a string); got {type(gold).__name__}"
        if gold not in q.options:
            return f"gold {gold!r} is not among the options {q.options}"
        return None
    if kind == "set":
        if not isinstance(gold, list) or not all(isinstance(g, str) for g in gold):
            return f"set gold must be a list of options; got {type(gold).__name__}"
        missing = [g for g in gold if g not in q.options]
        if missing:
            return f"gold options {missing} are not among the options {q.options}"
        if len(set(gold)) != len(gold):
            return f"gold lists an option twice: {gold}"
        return None
    # span
    if not isinstance(gold, list):
        return f"span gold must be a list of {{label, start, end}}; got {type(gold).__name__}"
    for j, s in enumerate(gold):
        if not isinstance(s, dict) or not {"label", "start", "end"} <= set(s):
            return f"gold span [{j}] must be an object with label, start, end; got {s!r}"
        label, start, end = s["label"], s["start"], s["end"]
        if label not in q.labels:
            return f"gold span [{j}] label {label!r} is not among the labels {q.labels}"
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
            return f"gold span [{j}] start and end must be integers; got {start!r}, {end!r}"
        if not 0 <= start < end <= len(text):
            return f"gold span [{j}] offsets [{start}, {end}) are outside the text of {len(text)} characters"
    return None


def check_gold(row: Row, gold: Any) -> str | None:
    """Why `gold` cannot be used for this (valid) row, or None when it can.

    choice / score: one of the options (a string); set: a list of distinct options (may be empty);
    span: a list of {label, start, end} with the label among the question's labels and
    0 <= start < end <= len(text). A multi-question row takes a list of per-question golds (None for
    an unlabelled question); a row needs at least one labelled question.
    """
    if gold is None:
        return "row has no gold"
    try:
        golds = question_golds(row, gold)
    except ValueError as e:
        return str(e)
    if all(g is None for g in golds):
        return "row has no gold"
    for i, (q, g) in enumerate(zip(row.questions, golds, strict=True)):
        kind, _ = split_task(row.question_task(i))
        reason = _check_question_gold(kind, q, row.text, g)
        if reason:
            return reason if len(row.questions) == 1 else f"questions[{i}]: {reason}"
    return None


# --- gathered data --------------------------------------------------------------------------------


@dataclass
class _Units:
    """Binary units (set options or span words of one label): raw logits and 0/1 targets."""

    logits: list[np.ndarray] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)

    def add(self, logits: np.ndarray, targets: np.ndarray) -> None:
        self.logits.append(np.asarray(logits, dtype=np.float64))
        self.targets.append(np.asarray(targets, dtype=np.float64))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
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
    units: dict[str, _Units] = field(default_factory=dict)  # set: {"*": options}; span: label -> words


def _word_targets(offsets: np.ndarray, spans: list[dict[str, Any]], label: str) -> np.ndarray:
    """(n_words,) 1.0 where word [s, e) overlaps a gold span [start, end) of `label`."""
    t = np.zeros(len(offsets), dtype=np.float64)
    for s in spans:
        if s["label"] == label and len(offsets):
            t[(offsets[:, 0] < s["end"]) & (s["start"] < offsets[:, 1])] = 1.0
    return t


def _words_in_fields(row: Row, fields: list[str] | None, offsets: np.ndarray) -> np.ndarray:
    """(n_words,) True for words inside the question's allowed fields (all words when unrestricted)."""
    if not fields or not row.fields:
        return np.ones(len(offsets), dtype=bool)
    keep = np.zeros(len(offsets), dtype=bool)
    for f in row.fields:
        if f.name in fields:
            keep |= (offsets[:, 0] >= f.start) & (offsets[:, 1] <= f.end)
    return keep


def _gather_answer(data: dict[str, TaskData], row: Row, qi: int, gold: Any, answer: Any) -> None:
    """Add one answered, labelled question to `data`; raises ValueError when the answer lacks raw outputs."""
    task = row.question_task(qi)
    kind, _ = split_task(task)
    q = row.questions[qi]
    td = data.setdefault(task, TaskData(task=task, kind=kind))
    if kind in ("choice", "score", "set"):
        assert q.options is not None  # Row validation: choice / score / set questions always carry options
        n = len(q.options)
        want = n + 1 if kind != "set" else n
        if answer.logits is None or len(answer.logits) != want:
            got = "none" if answer.logits is None else len(answer.logits)
            raise ValueError(f"questions[{qi}]: expected {want} raw logits in the answer; got {got}")
        z = np.asarray(answer.logits, dtype=np.float64)
        if kind == "set":
            td.units.setdefault("*", _Units()).add(z, np.array([o in gold for o in q.options], dtype=np.float64))
        else:
            td.logits.append(z[:n])  # real options only; [ABS] is the last logit
            td.gold.append(q.options.index(gold))
    else:
        units = answer.units
        if units is None or units.logits is None:
            raise ValueError(f"questions[{qi}]: the span answer carries no units.logits")
        offsets = np.asarray(units.offsets, dtype=np.int64).reshape(-1, 2)  # (n_words, 2)
        keep = _words_in_fields(row, q.fields, offsets)  # (n_words,) words the decoder may use
        for label in q.labels or []:
            z = units.logits.get(label)
            if z is None or len(z) != len(offsets):
                raise ValueError(f"questions[{qi}]: units.logits[{label!r}] missing or not one per word")
            targets = _word_targets(offsets, gold, label)
            td.units.setdefault(label, _Units()).add(np.asarray(z)[keep], targets[keep])
    td.n_questions += 1


def gather(
    model: Any, rows: list[Any], *, precision: str = "fp32", max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
) -> tuple[dict[str, TaskData], list[dict[str, Any]]]:
    """Validate labelled rows, score them with raw logits and word units, and gather per-task data.

    Returns (task -> TaskData, skipped) where skipped lists {"id", "reason"} for invalid rows, bad
    golds and rows the model failed on.
    """
    import vela2  # late: vela2/__init__ may import this module

    skipped: list[dict[str, Any]] = []
    kept: list[tuple[Row, list[Any]]] = []
    for obj in rows:
        try:
            row = parse_row(obj)
        except Vela2Error as e:
            skipped.append({"id": guess_id_task(obj)[0], "reason": f"invalid row: {e}"})
            continue
        reason = check_gold(row, row.gold)
        if reason:
            skipped.append({"id": row.id, "reason": reason})
            continue
        kept.append((row, question_golds(row, row.gold)))
    if not kept:
        return {}, skipped
    requests = [row.model_copy(update={"logits": True, "units": True}).model_dump() for row, _ in kept]
    results = vela2.predict(model, requests, precision=precision, max_batch_tokens=max_batch_tokens)
    data: dict[str, TaskData] = {}
    for (row, golds), res in zip(kept, results, strict=True):
        if res.status != "ok" or not res.answers:
            msg = res.error.message if res.error else str(res.status)
            skipped.append({"id": row.id, "reason": f"model failed on the row: {msg}"})
            continue
        by_q = {a.question: a for a in res.answers}
        trial: dict[str, TaskData] = {}  # this row's contribution, merged only when all of it is usable
        try:
            for qi, g in enumerate(golds):
                if g is None:
                    continue
                if qi not in by_q:
                    raise ValueError(f"questions[{qi}]: no answer in the result")
                _gather_answer(trial, row, qi, g, by_q[qi])
        except ValueError as e:
            skipped.append({"id": row.id, "reason": str(e)})
            continue
        for task, td in trial.items():
            _merge(data.setdefault(task, TaskData(task=task, kind=td.kind)), td)
    for s in skipped:
        logger.warning("skipped labelled row %s: %s", s["id"], s["reason"])
    return data, skipped


def _merge(into: TaskData, part: TaskData) -> None:
    into.n_questions += part.n_questions
    into.logits += part.logits
    into.gold += part.gold
    for key, u in part.units.items():
        dst = into.units.setdefault(key, _Units())
        dst.logits += u.logits
        dst.targets += u.targets


# --- fit and evaluate -----------------------------------------------------------------------------


def _pooled(data: dict[str, TaskData], kind: str) -> tuple[np.ndarray, np.ndarray]:
    parts = [u.arrays() for td in data.values() if td.kind == kind for u in td.units.values()]
    if not parts:
        return np.zeros(0), np.zeros(0)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _fit_binary_t(z: np.ndarray, y: np.ndarray, what: str, current: float, notes: list[str]) -> float:
    n_pos = int(y.sum())
    if z.size < MIN_TEMPERATURE_ITEMS or n_pos == 0 or n_pos == z.size:
        if z.size:
            notes.append(
                f"{what}: {z.size} units with {n_pos} positive (need >= {MIN_TEMPERATURE_ITEMS} units of "
                f"both classes); kept T = {current:.3g}"
            )
        return current
    return fit_sigmoid_temperature(z, y)


def fit(
    data: dict[str, TaskData], base: Calibration, *, min_positives: int = MIN_POSITIVES
) -> tuple[Calibration, dict[str, list[str]], list[str]]:
    """Fit temperatures and thresholds on gathered data, starting from (a copy of) `base`.

    Returns (calibration, per-task notes, global notes). Fields not fitted are kept from `base`.
    """
    cal = copy.deepcopy(base)
    notes: dict[str, list[str]] = {task: [] for task in data}
    global_notes: list[str] = []
    for task, td in sorted(data.items()):
        if td.kind not in ("choice", "score"):
            continue
        if td.n_questions < MIN_TEMPERATURE_ITEMS:
            notes[task].append(
                f"{td.n_questions} labelled questions < {MIN_TEMPERATURE_ITEMS}; kept T = {base.temperature(task):.3g}"
            )
            continue
        cal.temperatures[task] = fit_softmax_temperature(td.logits, td.gold)
    cal.T_set = _fit_binary_t(*_pooled(data, "set"), "T_set", base.T_set, global_notes)
    cal.T_span = _fit_binary_t(*_pooled(data, "span"), "T_span", base.T_span, global_notes)
    for task, td in sorted(data.items()):
        if td.kind == "set":
            z, y = td.units["*"].arrays()
            best = best_f1_threshold(sigmoid(z / cal.T_set), y, min_positives)
            if best is None:
                notes[task].append(
                    f"{int(y.sum())} positives < {min_positives}; kept threshold {base.set_threshold(task):.3g}"
                )
            else:
                cal.set_thresholds[task] = best[0]
        elif td.kind == "span":
            per = dict(cal.span_thresholds.get(task, {}))
            for label, u in sorted(td.units.items()):
                z, y = u.arrays()
                best = best_f1_threshold(sigmoid(z / cal.T_span), y, min_positives)
                if best is None:
                    notes[task].append(
                        f"label {label!r}: {int(y.sum())} positive words < {min_positives}; kept threshold "
                        f"{base.span_threshold(task, label):.3g}"
                    )
                else:
                    per[label] = best[0]
            if per:
                cal.span_thresholds[task] = per
    return cal, notes, global_notes


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
            t = cal.temperature(task)
            probs = [softmax(z / t) for z in td.logits]
            conf = np.array([p.max() for p in probs])
            correct = np.array([int(np.argmax(p)) == g for p, g in zip(probs, td.gold, strict=True)])
            m.update(nll=softmax_nll(td.logits, td.gold, t), ece=ece(conf, correct), accuracy=float(correct.mean()))
        else:
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
        out[task] = m
    return out


def calibrate(
    model: Any, rows: list[dict[str, Any]], *, precision: str = "fp32", max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
) -> tuple[Calibration, dict[str, Any]]:
    """Fit calibration from labelled rows; returns (new Calibration, report).

    The report: {"n_rows", "n_used", "skipped": [{"id", "reason"}], "tasks": {task: {"type", "n",
    "units"?, "before": metrics, "after": metrics, "notes"}}, "T_set", "T_span", "notes"}; metrics
    as in `evaluate`. With no usable rows the calibration is the model's own, unchanged.
    """
    base: Calibration = model.calibration
    data, skipped = gather(model, rows, precision=precision, max_batch_tokens=max_batch_tokens)
    cal, task_notes, notes = fit(data, base)
    before, after = evaluate(data, base), evaluate(data, cal)
    tasks: dict[str, Any] = {}
    for task, td in sorted(data.items()):
        entry: dict[str, Any] = {"type": td.kind, "n": td.n_questions}
        if td.units:
            entry["units"] = int(sum(u.arrays()[0].size for u in td.units.values()))
        entry.update(before=before[task], after=after[task], notes=task_notes[task])
        tasks[task] = entry
    report = {
        "n_rows": len(rows),
        "n_used": len(rows) - len(skipped) if data else 0,  # each skipped entry is one row
        "skipped": skipped,
        "tasks": tasks,
        "T_set": {"before": base.T_set, "after": cal.T_set},
        "T_span": {"before": base.T_span, "after": cal.T_span},
        "notes": [*notes, "after-metrics are measured on the rows the fit used (in-sample)"],
    }
    return cal, report


# --- command line ---------------------------------------------------------------------------------


def read_jsonl(path: str | Path) -> tuple[list[Any], list[dict[str, Any]]]:
    """Rows of a JSONL file (blank lines skipped) and {"id": None, "line", "reason"} for bad lines.

    The file is read as bytes and each line decoded on its own (`decode_json`, as the CLI's predict
    and backfill do): invalid JSON, a byte that is not UTF-8, or JSON nested deeper than 64 levels
    makes that line a bad row, not the whole file fail."""
    from vela2.wire.messages import decode_json

    rows: list[Any] = []
    bad: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                line.decode("utf-8")  # json.loads of bytes would also take UTF-16 / UTF-32
                rows.append(decode_json(line, f"line {n}"))
            except UnicodeDecodeError as e:
                bad.append({"id": None, "line": n, "reason": f"not valid UTF-8: {e.reason} at byte {e.start}"})
            except InvalidRequest as e:  # "line N is not valid JSON: ..." / "... nested deeper than 64 levels"
                reason = str(e).removeprefix(f"line {n} is ").removeprefix("not valid JSON: ")
                reason = "invalid JSON: " + reason
                bad.append({"id": None, "line": n, "reason": reason})
    return rows, bad


def _fmt(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return "-"
    return f"{before:.4f} -> {after:.4f}"


def format_report(report: dict[str, Any]) -> str:
    """A readable before / after table per task, then the pooled temperatures, notes and skipped rows."""
    head = f"{'task':<28} {'n':>6} {'units':>8}  {'T':<18} {'NLL':<18} {'ECE':<18} {'F1 / acc':<18}"
    lines = [head, "-" * len(head)]
    for task, e in report["tasks"].items():
        b, a = e["before"], e["after"]
        key = "accuracy" if e["type"] in ("choice", "score") else "f1"
        t = _fmt(b["temperature"], a["temperature"])
        lines.append(
            f"{task:<28} {e['n']:>6} {e.get('units', ''):>8}  {t:<18} {_fmt(b['nll'], a['nll']):<18} "
            f"{_fmt(b['ece'], a['ece']):<18} {_fmt(b[key], a[key]):<18}"
        )
        if e["type"] == "set":
            lines.append(f"{'':<28}   threshold {_fmt(b['threshold'], a['threshold'])}")
        elif e["type"] == "span":
            for label, thr in a["thresholds"].items():
                lines.append(
                    f"{'':<28}   {label}: threshold {_fmt(b['thresholds'][label], thr)}, word F1 "
                    f"{_fmt(b['f1_per_label'][label], a['f1_per_label'][label])}"
                )
        lines += [f"{'':<28}   note: {note}" for note in e["notes"]]
    for name in ("T_set", "T_span"):
        lines.append(f"{name}: {_fmt(report[name]['before'], report[name]['after'])}")
    lines += [f"note: {note}" for note in report["notes"]]
    lines.append(f"rows: {report['n_rows']} read, {report['n_used']} used, {len(report['skipped'])} skipped")
    for s in report["skipped"]:
        where = f"line {s['line']}" if s.get("line") else s["id"]
        lines.append(f"  skipped {where}: {s['reason']}")
    return "\n".join(line.rstrip() for line in lines)


def _backup(path: Path) -> Path | None:
    if not path.is_file():
        return None
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    dst = path.with_name(f"{path.name}.bak-{stamp}")
    shutil.copy2(path, dst)
    return dst


def calibrate_command(
    checkpoint: str,
    dev_path: str,
    *,
    out: str | None = None,
    report_path: str | None = None,
    device: str = "cpu",
    precision: str = "fp32",
) -> int:
    """`vela2 calibrate`: fit, write calibration.json (backing up the old one), print the table.

    Writes into the checkpoint unless `out` is given; the file replaced is first copied to
    `<name>.bak-<UTC timestamp>`. Returns 0, or 2 when the dev file has no usable rows.
    """
    import vela2  # late: vela2/__init__ may import this module

    try:
        rows, bad_lines = read_jsonl(dev_path)
    except OSError as e:
        print(f"vela2 calibrate: cannot read {dev_path}: {e}", file=sys.stderr)
        return 2
    model = vela2.load(checkpoint, device=device, dtype=torch.float32)
    cal, report = calibrate(model, rows, precision=precision)
    report["skipped"] = bad_lines + report["skipped"]
    report["n_rows"] += len(bad_lines)
    print(format_report(report))
    if report_path:
        Path(report_path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if not report["tasks"]:
        print(f"vela2 calibrate: no usable labelled rows in {dev_path}; nothing written", file=sys.stderr)
        return 2
    target = Path(out) if out else Path(checkpoint) / "calibration.json"
    if target.is_dir():
        target = target / "calibration.json"
    backup = _backup(target)
    cal.write(target)
    print(f"wrote {target}" + (f" (previous kept as {backup.name})" if backup else ""))
    return 0
