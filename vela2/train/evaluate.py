"""`vela2 eval`: score labelled rows with a checkpoint as it stands and report per task metrics.

The metrics are `vela2.train.metrics.evaluate`'s, on the data `vela2.train.calibrate.gather` collects (the same
definitions `vela2 calibrate` prints): choice / score accuracy, NLL and ECE over the real options;
set and span NLL / ECE per unit and F1 at the checkpoint's own thresholds (span: word-level, per
label and pooled over the task's labels). Nothing is fitted: this is the number a trained model is
checked by.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from vela2.config import DEFAULT_MAX_BATCH_TOKENS
from vela2.train.calibrate import gather
from vela2.train.labelled import read_jsonl
from vela2.train.metrics import evaluate


def eval_report(
    model: Any, rows: list[Any], *, precision: str = "fp32", max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    progress: bool | None = False,
) -> dict[str, Any]:
    """Metrics of `model` (with its own calibration) on labelled rows.

    Returns {"model", "n_rows", "n_used", "skipped": [{"id", "reason"}], "tasks": {task: {"type",
    "n", "units"?, metrics of `vela2.train.metrics.evaluate`}}}. `progress`: the rows scored, on
    stderr (vela2.progress: None = a bar on a terminal, else lines; False = none).
    """
    data, skipped = gather(model, rows, precision=precision, max_batch_tokens=max_batch_tokens, progress=progress,
                           label="eval")
    metrics = evaluate(data, model.calibration)
    tasks: dict[str, Any] = {}
    for task, td in sorted(data.items()):
        entry: dict[str, Any] = {"type": td.kind, "n": td.n_questions}
        if td.units:
            entry["units"] = td.n_units()
        entry.update(metrics[task])
        tasks[task] = entry
    return {"model": model.name, "n_rows": len(rows), "n_used": len(rows) - len(skipped) if data else 0,
            "skipped": skipped, "tasks": tasks}


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def format_eval(report: dict[str, Any]) -> str:
    """The report as a table: one line per task, then one per span label, then skipped rows."""
    head = f"{'task':<28} {'n':>6} {'units':>8}  {'acc / F1':>9} {'NLL':>9} {'ECE':>9}"
    lines = [f"model {report['model']}", head, "-" * len(head)]
    for task, e in report["tasks"].items():
        key = "accuracy" if e["type"] in ("choice", "score") else "f1"
        lines.append(f"{task:<28} {e['n']:>6} {e.get('units', ''):>8}  {_num(e[key]):>9} {_num(e['nll']):>9} "
                     f"{_num(e['ece']):>9}")
        for label, f1 in e.get("f1_per_label", {}).items():
            lines.append(f"{'':<28}   {label}: word F1 {f1:.4f} at threshold {e['thresholds'][label]:.3g}")
    lines.append(f"rows: {report['n_rows']} read, {report['n_used']} used, {len(report['skipped'])} skipped")
    for s in report["skipped"]:
        where = f"line {s['line']}" if s.get("line") else s["id"]
        lines.append(f"  skipped {where}: {s['reason']}")
    return "\n".join(line.rstrip() for line in lines)


def eval_command(checkpoint: str, rows_path: str, *, json_path: str | None = None, device: str = "cpu",
                 precision: str = "fp32", max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
                 batch_invariant: bool = False) -> int:
    """`vela2 eval`: print the table (and write the report as JSON); 2 when no row is usable.
    `batch_invariant`: score in batch-invariant mode (vela2.model.invariant)."""
    from vela2.model.checkpoint import load, serving_dtype

    try:
        rows, bad_lines = read_jsonl(rows_path)
    except OSError as e:
        print(f"vela2 eval: cannot read {rows_path}: {e}", file=sys.stderr)
        return 2
    model = load(checkpoint, device=device, dtype=serving_dtype(precision))
    if batch_invariant:
        model.use_batch_invariant()
    report = eval_report(model, rows, precision=precision, max_batch_tokens=max_batch_tokens, progress=None)
    report["skipped"] = bad_lines + report["skipped"]
    report["n_rows"] += len(bad_lines)
    print(format_eval(report))
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if not report["tasks"]:
        print(f"vela2 eval: no usable labelled rows in {rows_path}", file=sys.stderr)
        return 2
    return 0
