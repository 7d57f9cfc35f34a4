"""`vela2 calibrate`: fit temperatures and thresholds of calibration.json from labelled rows.

The steps, top-down (each a function of this module, the pieces they use in modules of their own):

1. `gather(model, rows)`: checks each row's gold (`vela2.train.labelled.check_gold`), runs
   `vela2.predict` with raw logits and word units, and collects per task data
   (`vela2.train.task_data.TaskData`).
2. `fit(data, base)`: the temperature fits (torch LBFGS on log T, T clamped to [0.05, 20]) and the
   thresholds with the best F1 (`vela2.train.metrics.best_f1_threshold`).
3. `calibrate(model, rows)`: gather, fit, and metrics before / after (`vela2.train.metrics.evaluate`:
   NLL, ECE, F1); `calibrate_command` is the CLI around it.

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vela2.api.schemas import Row, guess_id_task, parse_row, split_task
from vela2.config import DEFAULT_MAX_BATCH_TOKENS
from vela2.errors import Vela2Error
from vela2.model import manifest
from vela2.model.calibration import Calibration, sigmoid
from vela2.progress import Progress
from vela2.train.labelled import check_gold, question_golds, read_jsonl
from vela2.train.metrics import MIN_POSITIVES, best_f1_threshold, evaluate
from vela2.train.task_data import BinaryUnits, TaskData, merge

logger = logging.getLogger(__name__)

T_MIN = 0.05  # fitted temperatures are clamped to [T_MIN, T_MAX]
T_MAX = 20.0
MIN_TEMPERATURE_ITEMS = 10  # questions (choice/score) or units (set/span) a temperature fit needs
# rows per predict() call while gathering: each call is a step of the progress; enough rows to fill
# several batches of DEFAULT_MAX_BATCH_TOKENS
GATHER_CHUNK_ROWS = 256


# --- temperature fits -----------------------------------------------------------------------------


def _pad(logits: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Variable-length logit vectors -> (N, K_max) float64 values and a (N, K_max) bool mask."""
    k_max = max(len(z) for z in logits)
    values = np.zeros((len(logits), k_max), dtype=np.float64)
    mask = np.zeros((len(logits), k_max), dtype=bool)
    for i, z in enumerate(logits):
        values[i, : len(z)] = z
        mask[i, : len(z)] = True
    return values, mask


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


# --- gathered data --------------------------------------------------------------------------------
# (the word targets and the fields rule are also what `vela2.train.training` trains spans on)


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
            td.units.setdefault("*", BinaryUnits()).add(z, np.array([o in gold for o in q.options], dtype=np.float64))
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
            td.units.setdefault(label, BinaryUnits()).add(np.asarray(z)[keep], targets[keep])
    td.n_questions += 1


def _checked_rows(rows: list[Any]) -> tuple[list[tuple[Row, list[Any]]], list[dict[str, Any]]]:
    """The valid rows whose gold fits, each with one gold per question; and {"id", "reason"} for the others."""
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
    return kept, skipped


def _gather_row(data: dict[str, TaskData], row: Row, golds: list[Any], res: Any) -> str | None:
    """Add the labelled questions of one scored row (`res`: its RowResult) to `data`, all of them or
    none; returns why the row cannot be used, or None."""
    if res.status != "ok" or not res.answers:
        msg = res.error.message if res.error else str(res.status)
        return f"model failed on the row: {msg}"
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
        return str(e)
    for task, td in trial.items():
        merge(data.setdefault(task, TaskData(task=task, kind=td.kind)), td)
    return None


def gather(
    model: Any, rows: list[Any], *, precision: str = "fp32", max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    progress: bool | None = False, label: str = "calibrate",
) -> tuple[dict[str, TaskData], list[dict[str, Any]]]:
    """Validate labelled rows, score them with raw logits and word units, and gather per-task data.

    Returns (task -> TaskData, skipped) where skipped lists {"id", "reason"} for invalid rows, bad
    golds and rows the model failed on. `progress`: the rows scored, on stderr under `label`
    (vela2.progress: None = a bar on a terminal, else lines; False = none).
    """
    import vela2  # late: vela2/__init__ may import this module

    kept, skipped = _checked_rows(rows)
    if not kept:
        return {}, skipped
    requests = [row.model_copy(update={"logits": True, "units": True}).model_dump() for row, _ in kept]
    results: list[Any] = []
    with Progress(label, len(requests), unit="row", show=progress) as bar:
        for at in range(0, len(requests), GATHER_CHUNK_ROWS):
            chunk = requests[at : at + GATHER_CHUNK_ROWS]
            results += vela2.predict(model, chunk, precision=precision, max_batch_tokens=max_batch_tokens)
            bar.update(len(chunk))
    data: dict[str, TaskData] = {}
    for (row, golds), res in zip(kept, results, strict=True):
        reason = _gather_row(data, row, golds, res)
        if reason:
            skipped.append({"id": row.id, "reason": reason})
    for s in skipped:
        logger.warning("skipped labelled row %s: %s", s["id"], s["reason"])
    return data, skipped


# --- fit ------------------------------------------------------------------------------------------


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
        if td.kind in ("choice", "score"):
            _fit_task_temperature(cal, base, task, td, notes[task])
    # the set and span temperatures are pooled over every task of the type; thresholds use them
    cal.T_set = _fit_binary_t(*_pooled(data, "set"), "T_set", base.T_set, global_notes)
    cal.T_span = _fit_binary_t(*_pooled(data, "span"), "T_span", base.T_span, global_notes)
    for task, td in sorted(data.items()):
        if td.kind == "set":
            _fit_set_threshold(cal, base, task, td, min_positives, notes[task])
        elif td.kind == "span":
            _fit_span_thresholds(cal, base, task, td, min_positives, notes[task])
    return cal, notes, global_notes


def _fit_task_temperature(cal: Calibration, base: Calibration, task: str, td: TaskData, notes: list[str]) -> None:
    """choice / score: the task's own temperature, when it has enough labelled questions."""
    if td.n_questions < MIN_TEMPERATURE_ITEMS:
        notes.append(
            f"{td.n_questions} labelled questions < {MIN_TEMPERATURE_ITEMS}; kept T = {base.temperature(task):.3g}"
        )
        return
    cal.temperatures[task] = fit_softmax_temperature(td.logits, td.gold)


def _fit_set_threshold(cal: Calibration, base: Calibration, task: str, td: TaskData, min_positives: int,
                       notes: list[str]) -> None:
    """set: the task's threshold with the best F1 over its options, at the fitted T_set."""
    z, y = td.units["*"].arrays()
    best = best_f1_threshold(sigmoid(z / cal.T_set), y, min_positives)
    if best is None:
        notes.append(f"{int(y.sum())} positives < {min_positives}; kept threshold {base.set_threshold(task):.3g}")
    else:
        cal.set_thresholds[task] = best[0]


def _fit_span_thresholds(cal: Calibration, base: Calibration, task: str, td: TaskData, min_positives: int,
                         notes: list[str]) -> None:
    """span: a threshold per label with the best word-level F1, at the fitted T_span."""
    per = dict(cal.span_thresholds.get(task, {}))
    for label, u in sorted(td.units.items()):
        z, y = u.arrays()
        best = best_f1_threshold(sigmoid(z / cal.T_span), y, min_positives)
        if best is None:
            notes.append(
                f"label {label!r}: {int(y.sum())} positive words < {min_positives}; kept threshold "
                f"{base.span_threshold(task, label):.3g}"
            )
        else:
            per[label] = best[0]
    if per:
        cal.span_thresholds[task] = per


def calibrate(
    model: Any, rows: list[dict[str, Any]], *, precision: str = "fp32",
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, progress: bool | None = False,
) -> tuple[Calibration, dict[str, Any]]:
    """Fit calibration from labelled rows; returns (new Calibration, report).

    The report: {"n_rows", "n_used", "skipped": [{"id", "reason"}], "tasks": {task: {"type", "n",
    "units"?, "before": metrics, "after": metrics, "notes"}}, "T_set", "T_span", "notes"}; metrics
    as in `evaluate`. With no usable rows the calibration is the model's own, unchanged. `progress`:
    the rows scored, on stderr (`gather`).
    """
    base: Calibration = model.calibration
    data, skipped = gather(model, rows, precision=precision, max_batch_tokens=max_batch_tokens, progress=progress)
    cal, task_notes, notes = fit(data, base)
    before, after = evaluate(data, base), evaluate(data, cal)
    tasks: dict[str, Any] = {}
    for task, td in sorted(data.items()):
        entry: dict[str, Any] = {"type": td.kind, "n": td.n_questions}
        if td.units:
            entry["units"] = td.n_units()
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
    batch_invariant: bool = False,
) -> int:
    """`vela2 calibrate`: fit, write calibration.json (backing up the old one), print the table.
    `batch_invariant`: the dev rows scored in batch-invariant mode (vela2.model.invariant), as a worker
    in that mode scores.

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
    if batch_invariant:
        model.use_batch_invariant()
    cal, report = calibrate(model, rows, precision=precision, progress=None)
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
    checkpoint_dir = target.parent
    # the checkpoint's identity changes with its calibration: its manifest is rewritten (the weights'
    # hashes kept from a manifest that still checks, so a 9B checkpoint is not hashed again)
    refresh = target.name == "calibration.json" and (checkpoint_dir / "config.json").is_file()
    known = manifest.reusable_hashes(checkpoint_dir) if refresh else {}
    known.pop(target.name, None)
    cal.write(target)
    if refresh:
        manifest.write(checkpoint_dir, known)
    print(f"wrote {target}" + (f" (previous kept as {backup.name})" if backup else ""))
    return 0
