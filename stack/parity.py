"""`vela2 parity`: the seed's parity report, reproduced for our own paths.

Arms: predict() in bf16, fp32 and fp8 (the reference path) and the queue path (worker) in the same
precisions, both in batch-invariant mode (vela2.model.invariant) where the backbone allows it, so that
a same-precision comparison compares like with like: the same kernels, weights and numbers for every
sequence whatever batch it ran in. Sections: rendering, outputs per comparison x type (each worker
arm against predict() at its precision, then fp32 vs bf16 and fp8 vs bf16: what each precision
changes), the noise floor (the default mode's batch-shape effect: the same rows batched vs one per
batch, counted, never a failure by itself), bundled vs single in fp32 and in fp8 (with the
noise-floor control), SystemOne vs predict(), arm run times. Exit status is non-zero when a
same-precision comparison shows any difference (a logit, a decision, a span set) or a rendering
mismatch.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from producer.client import Client
from stack.harness import WorkerProcess, embedded_redis
from vela2.cli import Parser
from vela2.config import DEFAULT_MAX_BATCH_TOKENS, PRECISIONS

TYPES = ("choice", "score", "set", "span")
RENDER_COLUMNS = ("input_ids", "position_ids", "parts", "blocks", "word_positions", "offsets")


def debug_rows(rows: list[dict]) -> list[dict]:
    """Copies of the rows asking for raw logits, units and render digests."""
    return [dict(copy.deepcopy(r), logits=True, units=True) for r in rows]


@dataclass
class Comparison:
    """Max differences between two arms' answers for one question type."""

    name: str
    type: str
    same_precision: bool
    n: int = 0
    noise_floor: bool = False  # the default mode's batch-shape effect: reported, never a failure by itself
    max_abs_prob_diff: float = 0.0
    max_abs_logit_diff: float = 0.0
    decision_diffs: int = 0
    word_units: int = 0
    spans: int = 0
    span_set_diffs: int = 0
    unit_offset_mismatches: int = 0
    gate_fired: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        if self.type != "span":
            for k in ("word_units", "spans", "span_set_diffs", "unit_offset_mismatches", "gate_fired"):
                d.pop(k)
        return d


def _maxdiff(a: list[float] | np.ndarray, b: list[float] | np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.abs(a - b).max()) if a.size else 0.0


def compare(name: str, left: list[dict], right: list[dict], same_precision: bool,
            noise_floor: bool = False) -> list[Comparison]:
    """Compare two arms' result dicts (same rows, same order), question by question."""
    comps = {t: Comparison(name, t, same_precision, noise_floor=noise_floor) for t in TYPES}
    for a, b in zip(left, right, strict=True):
        if a.get("status") != "ok" or b.get("status") != "ok":
            if a.get("status") != b.get("status"):
                comps["choice"].decision_diffs += 1
            continue
        for qa, qb in zip(a["answers"], b["answers"], strict=True):
            kind = qa["task"].split(":", 1)[0]
            c = comps[kind]
            c.n += 1
            c.max_abs_prob_diff = max(c.max_abs_prob_diff, _maxdiff(list(qa["probs"].values()),
                                                                    list(qb["probs"].values())))
            if kind == "span":
                ua, ub = qa.get("units") or {}, qb.get("units") or {}
                c.word_units += len(ua.get("offsets", []))
                c.unit_offset_mismatches += ua.get("offsets") != ub.get("offsets")
                for lab in ua.get("probs", {}):
                    c.max_abs_prob_diff = max(c.max_abs_prob_diff, _maxdiff(ua["probs"][lab], ub["probs"][lab]))
                    c.max_abs_logit_diff = max(c.max_abs_logit_diff,
                                               _maxdiff(ua["logits"][lab], ub["logits"][lab]))
                sa = {(s["label"], s["start"], s["end"]) for s in qa.get("spans", [])}
                sb = {(s["label"], s["start"], s["end"]) for s in qb.get("spans", [])}
                c.spans += len(sa)
                c.span_set_diffs += sa != sb
                c.gate_fired += bool(qa.get("gate_fired"))
                c.decision_diffs += (sa != sb) or (qa.get("gate_fired") != qb.get("gate_fired"))
            else:
                c.max_abs_logit_diff = max(c.max_abs_logit_diff, _maxdiff(qa["logits"], qb["logits"]))
                c.decision_diffs += qa["decision"] != qb["decision"]
    return [c for c in comps.values() if c.n]


def rendering_section(left: list[dict], right: list[dict]) -> dict[str, int]:
    """Rows, sequences and per-column mismatches between two arms' render digests."""
    out = {"rows": 0, "sequences": 0, "mismatches": 0, **{c: 0 for c in RENDER_COLUMNS}, "window_count": 0}
    for a, b in zip(left, right, strict=True):
        ra, rb = a.get("render"), b.get("render")
        if ra is None and rb is None:
            continue
        out["rows"] += 1
        out["sequences"] += (ra or {}).get("sequences", 0)
        if ra is None or rb is None:
            out["mismatches"] += 1
            continue
        bad = [c for c in RENDER_COLUMNS if ra[c] != rb[c]]
        for c in bad:
            out[c] += 1
        out["window_count"] += ra["sequences"] != rb["sequences"]
        out["mismatches"] += bool(bad) or ra["sequences"] != rb["sequences"]
    return out


def split_questions(rows: list[dict]) -> tuple[list[dict], list[dict], list[tuple[int, int]]]:
    """Multi-question rows and, for each of their questions, a row asking it alone.

    Returns (bundled rows, single rows, (bundled index, question index) per single row).
    """
    bundled: list[dict] = []
    singles: list[dict] = []
    index: list[tuple[int, int]] = []
    for r in rows:
        if len(r["questions"]) < 2:
            continue
        b = len(bundled)
        bundled.append(r)
        for q, question in enumerate(r["questions"]):
            single = dict(r, id=f"{r.get('id', 'row')}#q{q}", questions=[question])
            if question.get("task"):
                single["task"] = question["task"]
            singles.append(single)
            index.append((b, q))
    return bundled, singles, index


@dataclass
class BundleStats:
    questions: int = 0
    span_questions: int = 0
    bit_identical: int = 0
    max_abs_logit_diff: float = 0.0
    span_max_abs_logit_diff: float = 0.0
    noise_floor_max_abs_logit_diff: float = 0.0
    noise_floor_span_max_abs_logit_diff: float = 0.0
    decision_flips: int = 0
    rows: int = 0
    by_task: dict[str, int] = field(default_factory=dict)


def _answer_logits(ans: dict) -> np.ndarray:
    if ans.get("logits") is not None:
        return np.asarray(ans["logits"], dtype=np.float64)
    return np.concatenate([np.asarray(v, dtype=np.float64) for v in ans["units"]["logits"].values()])


def bundled_vs_single(predict_fn, rows: list[dict]) -> BundleStats:
    """Every question of each multi-question row asked alone vs bundled, plus the noise floor:
    the same bundled rows run one per batch instead of batched with others.
    """
    bundled, singles, index = split_questions(debug_rows(rows))
    st = BundleStats(rows=len(bundled))
    if not bundled:
        return st
    together = predict_fn(bundled)
    alone = predict_fn(singles)
    one_per_batch = [predict_fn([r])[0] for r in bundled]
    for r in bundled:
        st.by_task[r["task"]] = st.by_task.get(r["task"], 0) + 1
    for (b, q), single in zip(index, alone, strict=True):
        qa, qs = together[b]["answers"][q], single["answers"][0]
        la, ls = _answer_logits(qa), _answer_logits(qs)
        d = _maxdiff(la, ls)
        is_span = qa["task"].startswith("span:")
        st.questions += 1
        st.span_questions += is_span
        st.bit_identical += bool(np.array_equal(la, ls))
        if is_span:
            st.span_max_abs_logit_diff = max(st.span_max_abs_logit_diff, d)
            st.decision_flips += {(s["label"], s["start"], s["end"]) for s in qa["spans"]} != {
                (s["label"], s["start"], s["end"]) for s in qs["spans"]}
        else:
            st.max_abs_logit_diff = max(st.max_abs_logit_diff, d)
            st.decision_flips += qa["decision"] != qs["decision"]
        qn = one_per_batch[b]["answers"][q]
        dn = _maxdiff(la, _answer_logits(qn))
        if is_span:
            st.noise_floor_span_max_abs_logit_diff = max(st.noise_floor_span_max_abs_logit_diff, dn)
        else:
            st.noise_floor_max_abs_logit_diff = max(st.noise_floor_max_abs_logit_diff, dn)
    return st


def timed(fn, *args, **kw) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0


def type_counts(rows: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r.get("task", "?")] += 1
    return dict(counts)


# --- SystemOne ----------------------------------------------------------------------------------

SYSTEM_ONE_STATE = {
    "user": "Hi, I am Alice Smith and my email is alice@acme.com. Can you move my order to Friday?",
    "assistant": "Of course Alice. I moved order 4471 to Friday and sent a note to alice@acme.com.",
    "context": "Customer support chat for Acme. Agents must not reveal other customers' data.",
}


def system_one_requests(model_name: str) -> list[dict]:
    """The seed's six SystemOne requests: choice / choice with no question / score; span + choice
    over a 3-field JSON state; set."""
    text = SYSTEM_ONE_STATE["user"]
    return [
        {"model": model_name, "id": "s1-choice", "input": text,
         "tasks": [{"name": "intent", "kind": "choice", "question": "What does the user want?",
                    "options": ["reschedule", "refund", "complaint"]}]},
        {"model": model_name, "id": "s1-noq", "input": text,
         "tasks": [{"name": "topic", "kind": "classify", "labels": ["orders", "billing", "sports"]}]},
        {"model": model_name, "id": "s1-score", "input": text,
         "tasks": [{"name": "urgency", "kind": "score", "options": ["1", "2", "3", "4", "5"]}]},
        {"model": model_name, "id": "s1-state", "input": dict(SYSTEM_ONE_STATE),
         "tasks": [{"name": "pii", "kind": "span", "labels": ["person", "email"], "fields": ["user", "assistant"]},
                   {"name": "resolved", "kind": "choice", "question": "Was the request handled?",
                    "options": ["yes", "no"]}]},
        {"model": model_name, "id": "s1-set", "input": text,
         "tasks": [{"name": "policy", "kind": "set", "options": ["privacy", "violence", "self-harm"]}]},
        {"model": model_name, "id": "s1-extract", "input": text,
         "tasks": [{"name": "ents", "kind": "extract", "labels": ["person", "company"]}]},
    ]


def systemone_section(model, precision: str) -> dict[str, Any]:
    """SystemOne answers vs the predict() results of the same rows: max |diff| and decision
    mismatches; and the route function refusing another model's name."""
    import vela2
    from vela2.api.systemone import parse_request, to_row
    from vela2.scoring.systemone import system_one_request

    max_diff, mismatches, n = 0.0, 0, 0
    for req in system_one_requests(model.name):
        answer = system_one_request(model, req, precision=precision)
        row = to_row(parse_request(req), model.calibration)
        (res,) = vela2.predict(model, [row], precision=precision)
        for task, qa in zip(req["tasks"], res.to_json_dict()["answers"], strict=True):
            got = answer["tasks"][task["name"]]
            n += 1
            max_diff = max(max_diff, _maxdiff(list(got["probs"].values()), list(qa["probs"].values())))
            mismatches += got.get("decision") != qa.get("decision") or len(got.get("spans") or []) != len(
                qa.get("spans") or [])
    refused = system_one_request(model, dict(system_one_requests(model.name)[0], model="another-model"))
    return {"requests": len(system_one_requests(model.name)), "tasks": n, "max_abs_diff": max_diff,
            "decision_mismatches": mismatches, "ok": max_diff == 0 and mismatches == 0,
            "other_model_rejected": refused.get("status") == "error"
            and refused["error"]["type"] == "model_mismatch"}


# --- the report ---------------------------------------------------------------------------------


def format_report(report: dict[str, Any]) -> str:
    """The seed-format text report."""
    r = report["rendering"]
    lines = [f"Vela 2 parity: {report['checkpoint']} ({report['model']}, checkpoint digest {report.get('digest')}), "
             f"device {report['device']}", "",
             f"Rows: {', '.join(f'{k} {v}' for k, v in report['row_counts'].items())} = {report['rows']} rows.",
             "", _mode_line(report), "", "Rendering (predict() renders vs worker renders)", "",
             "rows\tsequences (incl. windows)\tmismatches\tparts ids\tblocks\tword positions / offsets\twindow count",
             f"{r['rows']}\t{r['sequences']}\t{r['mismatches']}\t{r['parts']}\t{r['blocks']}\t"
             f"{r['word_positions'] + r['offsets']}\t{r['window_count']}", "", "Outputs", "",
             "comparison\ttype\tn\tmax abs prob diff\tmax abs logit diff\targmax / decision diffs"]
    lines += _comparison_lines([c for c in report["comparisons"] if not c.get("noise_floor")])
    lines += ["", "Noise floor (the default mode: the same rows batched together vs each alone; a batch-shape "
              "effect, never a failure by itself)", "",
              "comparison\ttype\tn\tmax abs prob diff\tmax abs logit diff\targmax / decision diffs"]
    lines += _comparison_lines([c for c in report["comparisons"] if c.get("noise_floor")])
    return "\n".join(lines + _format_bundles(report)) + "\n"


def _mode_line(report: dict[str, Any]) -> str:
    if report.get("batch_invariant"):
        return ("Mode: batch-invariant (every arm; a sequence's numbers do not depend on its batch, so a "
                "same-precision comparison must show no difference at all).")
    return ("Mode: default (this backbone has no batch-invariant mode: "
            f"{report.get('batch_invariant_unavailable')}); same-precision arms are held to equal decisions.")


def _comparison_lines(comparisons: list[dict[str, Any]]) -> list[str]:
    lines = []
    for c in comparisons:
        kind = c["type"]
        if kind == "span":
            kind = f"span ({c['word_units']} word units)"
            tail = (f"{c['decision_diffs']} span-set diffs ({c['spans']} spans), {c['unit_offset_mismatches']} "
                    f"unit-offset mismatches, PII gate fired on {c['gate_fired']} rows")
        else:
            tail = str(c["decision_diffs"])
        lines.append(f"{c['name']}\t{kind}\t{c['n']}\t{c['max_abs_prob_diff']:.3g}\t"
                     f"{c['max_abs_logit_diff']:.3g}\t{tail}")
    return lines


def _format_bundles(report: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    bundles = [(report["bundle_precision"], report["bundled_vs_single"])]
    if "bundled_vs_single_fp8" in report:
        bundles.append(("fp8", report["bundled_vs_single_fp8"]))
    for precision, b in bundles:
        lines += ["", f"Bundled vs single ({precision})", "",
                  f"{b['rows']} multi-question rows ({', '.join(f'{k} {v}' for k, v in b['by_task'].items())}): "
                  f"every question run alone (its own sequence) vs bundled. {b['questions'] - b['span_questions']} "
                  f"choice / score / set questions and {b['span_questions']} span questions, {b['bit_identical']} "
                  f"bit-identical, max |logit diff| {b['max_abs_logit_diff']:.3g} (span "
                  f"{b['span_max_abs_logit_diff']:.3g}). Noise-floor control (the same bundled rows, one row per "
                  f"batch instead of batched with others): max |logit diff| "
                  f"{b['noise_floor_max_abs_logit_diff']:.3g} (span {b['noise_floor_span_max_abs_logit_diff']:.3g}); "
                  f"decision flips bundled vs single: {b['decision_flips']}."]
    s = report["systemone"]
    lines += ["", "SystemOne vs predict()", "",
              f"{s['requests']} SystemOne requests ({s['tasks']} tasks): max |diff| between the SystemOne answers "
              f"and the predict() probabilities they map from {s['max_abs_diff']:.3g}, {s['decision_mismatches']} "
              f"decision mismatches. Route function (system_one_request): ok={s['ok']}, other model name "
              f"rejected={s['other_model_rejected']}."]
    lines += ["", "Arm run times", "", ", ".join(f"{k} {v:.1f} s" for k, v in report["times_s"].items())]
    lines += ["", f"Verdict: {'PASS' if report['ok'] else 'FAIL'} — " + report["verdict"]]
    return lines


def verdict(report: dict[str, Any]) -> tuple[bool, str]:
    """Pass when same-precision comparisons show no difference (in batch-invariant mode: not a logit; in
    the default mode, where the backbone has no invariant mode: not a decision) and rendering has no
    mismatch. Noise-floor rows never fail it."""
    exact = report.get("batch_invariant", False)
    bad = [f"{c['name']} {c['type']}: {c['decision_diffs']} decision diffs, max |logit diff| "
           f"{c['max_abs_logit_diff']:.3g}" for c in report["comparisons"]
           if c["same_precision"] and not c.get("noise_floor")
           and (c["decision_diffs"] or (exact and (c["max_abs_logit_diff"] or c["max_abs_prob_diff"])))]
    if report["rendering"]["mismatches"]:
        bad.append(f"{report['rendering']['mismatches']} rendering mismatches")
    if not report["systemone"]["ok"] or not report["systemone"]["other_model_rejected"]:
        bad.append("SystemOne answers differ from predict()")
    agree = "are the same bits" if exact else "agree on every decision"
    return (not bad, "; ".join(bad) if bad else f"same-precision arms {agree}; renders identical")


# --- running it -----------------------------------------------------------------------------------


def _worker_arm(checkpoint: str, rows: list[dict], *, redis_url: str, device: str, precision: str,
                workdir: Path, max_batch_tokens: int, tag: str, batch_invariant: bool) -> tuple[list[dict], float]:
    """The queue path: a real worker process at `precision`, every row submitted through the
    producer client (ids suffixed with `tag`, so arms never share a write-once result)."""
    log_path = workdir / f"worker-{tag}.log"
    worker = WorkerProcess.start(redis_url, checkpoint, log_path, name=f"parity-{precision}", device=device,
                                 precision=precision, max_batch_tokens=max_batch_tokens, max_wait_ms=20,
                                 batch_invariant=int(batch_invariant))
    try:
        worker.wait_ready()
        client = Client(redis_url, model=_model_name(checkpoint))
        tagged = [dict(r, id=f"{r['id']}#{tag}") for r in rows]
        t0 = time.perf_counter()
        ids = client.submit_many(tagged)
        got = client.results_many(ids, timeout_s=600)
        elapsed = time.perf_counter() - t0
    finally:
        worker.terminate(60)
    out = []
    for r, rid in zip(rows, ids, strict=True):
        res = got.get(rid)
        if res is None:
            raise RuntimeError(f"the worker left {rid} unanswered (log: {log_path})")
        d = res.to_json_dict()
        mode = (d.get("served_by") or {}).get("batch_invariant")
        if mode is not None and mode != batch_invariant:  # a comparison of the wrong mode proves nothing
            raise RuntimeError(f"the worker answered {rid} with served_by.batch_invariant={mode}; it was started "
                               f"with --batch-invariant {int(batch_invariant)} (log: {log_path})")
        d["id"] = r["id"]
        out.append(d)
    return out, elapsed


def _model_name(checkpoint: str) -> str:
    from vela2.config import Vela2Config

    return Vela2Config.read(checkpoint).name


def noise_floor(models: dict[str, Any], rows: list[dict], max_batch_tokens: int) -> list[Comparison]:
    """The default mode's batch-shape effect per precision: predict() of `rows` batched together vs each
    row alone (its own batch). Decision flips here are what batch-invariant mode removes."""
    import vela2

    out: list[Comparison] = []
    for p, m in models.items():
        batched = [r.to_json_dict() for r in vela2.predict(m, rows, precision=p, max_batch_tokens=max_batch_tokens,
                                                           batch_invariant=False)]
        alone = [vela2.predict(m, [r], precision=p, batch_invariant=False)[0].to_json_dict() for r in rows]
        out += compare(f"noise_floor_{p}_batched_vs_alone", batched, alone, True, noise_floor=True)
    return out


def run_parity(checkpoint: str, rows: list[dict], *, redis_url: str | None = None, device: str = "cpu",
               max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> dict[str, Any]:
    """Run every arm and comparison; returns the report dict (see `format_report`). The arms run in
    batch-invariant mode unless the backbone has none (the report says why)."""
    import tempfile

    import vela2
    from vela2.model import fused
    from vela2.model.checkpoint import load, serving_dtype

    rows = debug_rows(rows)
    times: dict[str, float] = {}
    models = {p: load(checkpoint, device=device, dtype=serving_dtype(p)) for p in PRECISIONS}
    fp32 = models["fp32"]
    no_invariant = fused.supported(fp32.backbone)  # None: the backbone has the batch-invariant mode
    for m in models.values():
        m.batch_invariant = no_invariant is None
    predicted = {}
    for p, m in models.items():
        res, times[f"predict_{p}"] = timed(vela2.predict, m, rows, precision=p, max_batch_tokens=max_batch_tokens)
        predicted[p] = [r.to_json_dict() for r in res]
    worker_out: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="vela2-parity-") as tmp, contextlib.ExitStack() as stack:
        url = redis_url or stack.enter_context(embedded_redis(Path(tmp)))[0]
        nonce = uuid.uuid4().hex[:8]
        for p in PRECISIONS:
            worker_out[p], times[f"worker_{p}"] = _worker_arm(
                checkpoint, rows, redis_url=url, device=device, precision=p, workdir=Path(tmp),
                max_batch_tokens=max_batch_tokens, tag=f"{p}-{nonce}", batch_invariant=no_invariant is None)
    comparisons: list[Comparison] = []
    for p in PRECISIONS:
        comparisons += compare(f"worker_{p}_vs_predict_{p}", worker_out[p], predicted[p], True)
    for p in PRECISIONS:
        if p != "bf16":
            comparisons += compare(f"predict_{p}_vs_predict_bf16", predicted[p], predicted["bf16"], False)
    comparisons_floor, times["noise_floor"] = timed(noise_floor, models, rows, max_batch_tokens)
    bundles = {}
    for p in ("fp32", "fp8"):
        m = models[p]
        bundles[p], times[f"bundled_vs_single_{p}"] = timed(bundled_vs_single, lambda rs, m=m, p=p: [
            r.to_json_dict() for r in vela2.predict(m, rs, precision=p)], rows)
    systemone, times["systemone"] = timed(systemone_section, fp32, "fp32")
    rendering = rendering_section(predicted["bf16"], worker_out["bf16"])
    for p in PRECISIONS:
        if p != "bf16":
            rendering["mismatches"] += rendering_section(predicted[p], worker_out[p])["mismatches"]
    report = {
        "checkpoint": str(checkpoint), "model": fp32.name, "digest": fp32.digest, "device": device, "rows": len(rows),
        "row_counts": type_counts(rows), "batch_invariant": no_invariant is None,
        "batch_invariant_unavailable": no_invariant, "rendering": rendering,
        "comparisons": [c.to_dict() for c in comparisons + comparisons_floor],
        "bundled_vs_single": vars(bundles["fp32"]), "bundle_precision": "fp32",
        "bundled_vs_single_fp8": vars(bundles["fp8"]), "systemone": systemone,
        "times_s": {k: round(v, 2) for k, v in times.items()},
    }
    report["ok"], report["verdict"] = verdict(report)
    return report


def parity_command(checkpoint: str, rows_path: str, *, json_path: str | None, redis_url: str | None,
                   device: str) -> int:
    """`vela2 parity`: print the report, write JSON when asked; exit 1 on a same-precision diff."""
    rows = [json.loads(line) for line in Path(rows_path).read_text().splitlines() if line.strip()]
    report = run_parity(checkpoint, rows, redis_url=redis_url, device=device)
    print(format_report(report), end="")
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else 1


def main(argv: list[str]) -> int:
    """the seed-format parity report: worker vs predict(), bundled vs single, precisions, SystemOne"""
    ap = Parser(prog="vela2 parity", description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("rows", help="JSONL rows to compare on")
    ap.add_argument("--json", help="write the report as JSON too")
    ap.add_argument("--redis", help="Redis URL (default: an embedded one)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    return parity_command(args.checkpoint, args.rows, json_path=args.json, redis_url=args.redis, device=args.device)


if __name__ == "__main__":  # from a checkout that is not installed (no entry points): python -m ...
    sys.exit(main(sys.argv[1:]))
