"""The hot path on one device: the device alone vs predict() vs the queue path, per model shape and
workload, in one run.

    python -m bench.hotpath --out bench/results/gpu-hotpath.json            # the GPU machine: 1.5b and 9b
    python -m bench.hotpath --device cpu --shapes tiny --short-rows 120 --copies 1 --max-rows 24 \
        --tokenizer demo --out /tmp/hotpath.json                             # a smoke run on a CPU

For each shape (random weights in the layout of bench.gpu_engine: qwen2, window 2048) and workload
(`short1`: short online rows of 5-60 words, one per message; `short16`: the same rows, 16 per
message; `mix`: the seed-like mix of bench.workload, 8 rows per message), measured in this order:

device_rows_per_s  vela2.scoring.pipeline.run_ahead alone over the workload's sequences, rendered beforehand
                   (untimed) and packed as predict() packs them, one batch in flight: what the device
                   can do with the host's collating of the next batch hidden behind it.
predict_rows_per_s vela2.predict over the rows in this process (render + pack + forward + decode).
queue_rows_per_s   the rows submitted at once to the online queue (Client.submit_many, chunk_size rows
                   per message) and served by one fresh worker process on the same device; first submit
                   -> last result seen (pipelined MGETs).
ratio_vs_device    queue / device; the goals are >= 0.9 (short rows) and >= 0.95 (mix).
lost               rows without an ok answer; answers_vs_predict: the stored answers against predict()'s
                   at the same precision (decision diffs, max |prob diff|; stack.parity.compare).
worker_cpu_ms_per_request  by stage, from the worker's engine (each thread's own CPU clock): intake
                   (engine thread: opening messages, the duplicate check), render and decode (CPU
                   threads), batch (engine thread: packing, collating, launching, attempt counters),
                   store_ack (engine thread: result writes, acks), and consumer_other (the rest of the
                   process: kombu, Celery, triage, leases, metrics); over every request the worker answered
                   (the queue warm-up included).
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.queue_bench import (
    GC_LOG_PREFIX,
    READY_TIMEOUT_S,
    bench_redis,
    cpu_meter,
    gpu_info,
    machine_info,
    profile_path,
    short_rows,
    start_vela2_worker,
    write_bench_checkpoint,
)

log = logging.getLogger("bench.hotpath")

# name -> (hidden, layers, heads, kv heads, MLP width)
SHAPES = {
    "1.5b": (1536, 28, 12, 2, 8960),  # Qwen2-1.5B's layout
    "9b": (4096, 36, 32, 8, 14336),  # bench.gpu_engine's model (gpu.json)
    "tiny": (128, 2, 2, 1, 448),  # a CPU smoke run
}
WORKLOADS = {"short1": 1, "short16": 16, "mix": 8}  # -> rows per message
GOALS = {"short1": 0.9, "short16": 0.9, "mix": 0.95}


def _now() -> float:
    return time.perf_counter()


def _sync(model: Any) -> None:
    import torch

    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def device_alone(model: Any, rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """run_ahead over pre-rendered sequences, packed as predict() packs them (after one untimed pass):
    one batch in flight, as predict() and the worker's device loop run them, so the baseline is the
    device's best with the host work of the next batch hidden."""
    from vela2.scoring.pipeline import prepare, run_ahead, run_batch
    from vela2.text.packing import pack

    seqs = [s for r in rows for s in prepare(model, r).sequences]
    batches = pack([s.num_tokens for s in seqs], args.max_batch_tokens, args.row_tokens or None)

    def one_pass() -> None:
        for _ in run_ahead(model, ([seqs[k] for k in b] for b in batches), args.precision, args.row_tokens or None):
            pass

    one_pass()  # warm-up: every batch shape seen once (the first pass over new shapes ran 10-20% slower
    # and made the first workload's ratio look better)
    _sync(model)
    t0 = _now()
    one_pass()
    _sync(model)
    seconds = _now() - t0
    one = batches[len(batches) // 2]  # a full batch

    def one_batch() -> None:
        run_batch(model, [seqs[k] for k in one], args.precision, args.row_tokens or None)

    t1 = _now()
    one_batch()
    alone_s = _now() - t1
    probe = {"batch_sequences": len(one), "alone_s": round(alone_s, 4)}
    for interval_ms in (5.0, 0.5):  # Python's default, the worker's default (worker.settings)
        old = sys.getswitchinterval()
        sys.setswitchinterval(interval_ms / 1e3)
        try:
            probe[f"switch_{interval_ms:g}ms"] = gil_probe(one_batch, alone_s)
        finally:
            sys.setswitchinterval(old)
    return {"rows": len(rows), "sequences": len(seqs), "batches": len(batches),
            "tokens": sum(s.num_tokens for s in seqs), "seconds": round(seconds, 3),
            "rows_per_s": round(len(rows) / seconds, 2), "gil_probe": probe}


def gil_probe(work: Any, alone_s: float) -> dict[str, float]:
    """What one busy pure-Python thread does to `work` (one run_batch): its slowdown against
    `alone_s`, and the share of the GIL the busy thread still got (its counting rate while `work`
    runs over its rate alone). torch releases the GIL around each op it dispatches and takes it back
    after, so every op of the batch may wait for the busy thread: up to the switch interval."""
    import threading

    def count(seconds: float | None, stop: threading.Event, out: list[int]) -> None:
        n, end = 0, (_now() + seconds) if seconds else None
        while not stop.is_set() and (end is None or _now() < end):
            for _ in range(1000):
                n += 1
        out.append(n)

    alone: list[int] = []
    count(0.5, threading.Event(), alone)
    stop, during = threading.Event(), []
    t = threading.Thread(target=count, args=(None, stop, during))
    t0 = _now()
    t.start()
    work()
    seconds = _now() - t0
    stop.set()
    t.join()
    share = (during[0] / seconds) / (alone[0] / 0.5)
    return {"slowdown": round(seconds / alone_s, 2), "busy_thread_share": round(share, 3), "seconds": round(seconds, 4)}


def predict_alone(model: Any, rows: list[dict[str, Any]], args: argparse.Namespace) -> tuple[dict[str, Any], list]:
    import vela2

    vela2.predict(model, rows[: min(len(rows), 64)], precision=args.precision,  # warm-up
                  max_batch_tokens=args.max_batch_tokens, row_tokens=args.row_tokens or None)
    _sync(model)
    t0 = _now()
    res = vela2.predict(model, rows, precision=args.precision, max_batch_tokens=args.max_batch_tokens,
                        row_tokens=args.row_tokens or None)
    _sync(model)
    seconds = _now() - t0
    return {"rows": len(rows), "seconds": round(seconds, 3), "rows_per_s": round(len(rows) / seconds, 2)}, res


def queue_path(url: str, model_name: str, rows: list[dict[str, Any]], chunk: int, timeout_s: float,
               worker_pid: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """All rows submitted at once on the online queue, results collected with pipelined MGETs."""
    from producer.client import Client

    client = Client(url, model=model_name)
    tag = uuid.uuid4().hex[:8]
    tagged = [dict(r, id=f"{r['id']}#{tag}") for r in rows]
    meter: dict[str, Any] = {}
    try:
        with cpu_meter({"worker": [worker_pid]}, meter):
            t_start = _now()
            ids = client.submit_many(tagged, chunk_size=chunk)
            # the queue clock starts when every request is in Redis: the worker cannot start sooner
            # (submit_many pushes all in one round trip); the producer's own time is reported beside
            t0, m0 = _now(), time.monotonic()  # monotonic: the clock of the worker's batch records
            submitted_s = t0 - t_start
            got: dict[str, Any] = {}
            missing = list(ids)
            deadline = time.monotonic() + timeout_s
            while missing and time.monotonic() < deadline:
                found = {k: v for k, v in client.results_many(missing[:1024], timeout_s=0).items() if v is not None}
                got.update(found)
                missing = [i for i in missing if i not in got]
                if missing and len(found) < 1024:
                    time.sleep(0.005)
            seconds = _now() - t0
    finally:
        client.close()
    ok = sum(1 for v in got.values() if str(getattr(v.status, "value", v.status)) == "ok")
    answers = {rid.rsplit("#", 1)[0]: v.to_json_dict() for rid, v in got.items()}
    return {"rows": len(rows), "seconds": round(seconds, 3), "rows_per_s": round(len(got) / seconds, 2),
            "ok": ok, "lost": len(rows) - ok, "worker_cpu_s": meter.get("cpu_seconds", {}).get("worker"),
            "submit_seconds": round(submitted_s, 3), "window": [round(m0, 4), round(m0 + seconds, 4)],
            "end_to_end_rows_per_s": round(len(got) / (seconds + submitted_s), 2)}, answers


def device_timeline(stats: dict[str, Any] | None, window: list[float]) -> dict[str, Any] | None:
    """What the worker's device did inside the queue phase (its engine's recent batches, on the host's
    shared monotonic clock): busy fraction, batches, sequences per batch, the idle gaps between a
    batch's end and the next launch, what waited / rendered / was held at each launch, and the
    batches launched before the queue clock started (work the figure did not time)."""
    recent = (stats or {}).get("recent_batches")
    if not recent:
        return None
    rows = [dict(zip(recent["fields"], r, strict=True)) for r in recent["rows"]]
    t0, t1 = window
    # every batch the device ran inside the window, those launched before it too (the worker may
    # take the first messages while the submit's pipeline is still being written)
    rows = [r for r in rows if r["device_end"] >= t0 and r["device_start"] <= t1]
    if not rows:
        return None
    early = [r for r in rows if r["launched"] < t0]
    busy = sum(min(r["device_end"], t1) - max(r["device_start"], t0) for r in rows)
    gaps = [b["device_start"] - a["device_end"] for a, b in zip(rows, rows[1:], strict=False)]  # device idle

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    return {"busy_fraction": round(busy / (t1 - t0), 3), "batches": len(rows),
            "first_launch_s": round(rows[0]["launched"] - t0, 3),
            "launched_before_window": {"batches": len(early), "sequences": sum(r["sequences"] for r in early)},
            "sequences_per_batch": mean([r["sequences"] for r in rows]),
            "device_s_per_batch": mean([r["device_end"] - r["device_start"] for r in rows]),
            "gap_s_mean": mean(gaps), "gap_s_max": round(max(gaps), 4) if gaps else None,
            "waiting_at_launch": mean([r["waiting"] for r in rows]),
            "rendering_at_launch": mean([r["rendering"] for r in rows]),
            "held_at_launch": mean([r["held"] for r in rows]),
            "batches_list": [[round(r["launched"] - t0, 3), round(r["device_start"] - t0, 3),
                              round(r["device_end"] - t0, 3), r["sequences"], r["waiting"], r["rendering"], r["held"]]
                             for r in rows]}


def compare_answers(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> dict[str, Any]:
    """Stored answers against predict()'s, row by row: statuses, decisions (choice / score) and span
    sets that differ, and the largest |probability difference| over every answer."""
    diffs, max_prob, answers = 0, 0.0, 0
    for a, b in zip(left, right, strict=True):
        if a.get("status") != b.get("status"):
            diffs += 1
            continue
        for qa, qb in zip(a.get("answers") or [], b.get("answers") or [], strict=True):
            answers += 1
            spans_a = {(s["label"], s["start"], s["end"]) for s in qa.get("spans") or []}
            spans_b = {(s["label"], s["start"], s["end"]) for s in qb.get("spans") or []}
            diffs += qa.get("decision") != qb.get("decision") or spans_a != spans_b
            pa, pb = qa.get("probs") or {}, qb.get("probs") or {}
            for k in pa.keys() & pb.keys():
                max_prob = max(max_prob, abs(float(pa[k]) - float(pb[k])))
    return {"answers": answers, "decision_diffs": diffs, "max_abs_prob_diff": max_prob}


def cpu_by_stage(stats: dict[str, Any] | None) -> dict[str, Any] | None:
    """The engine's CPU seconds by stage, as ms per answered request."""
    if not stats or not stats.get("answered"):
        return None
    n = stats["answered"]
    stages = dict(stats.get("cpu_s") or {})
    own = float(stats.get("process_cpu_s") or 0.0)  # the worker process itself (not its render processes)
    other = max(0.0, own - sum(v for k, v in stages.items() if not k.endswith("_in_processes")))
    out = {k: round(v * 1e3 / n, 4) for k, v in stages.items()}
    out["consumer_other"] = round(other * 1e3 / n, 4)
    out["worker_process_total"] = round(own * 1e3 / n, 4)
    return {"requests": n, "ms": out}


def _workload_rows(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    if name == "mix":
        from bench.workload import make_workload

        rows = make_workload(seed=args.seed, copies=args.copies)
        return rows[: args.max_rows] if args.max_rows else rows
    return short_rows(args.short_rows, "s-", seed=args.seed + 1)


def run_shape(shape: str, args: argparse.Namespace, work: Path, emit: Any) -> None:
    """Every workload of one model shape: device alone, predict(), then a fresh worker each."""
    import vela2
    from vela2.config import Vela2Config
    from vela2.model.checkpoint import serving_dtype

    shape_args = shape_arguments(shape, args, f"vela2-hp-{shape}")
    ckpt = write_bench_checkpoint(work / f"ckpt-{shape}", shape_args)
    model_name = Vela2Config.read(ckpt).name
    model = vela2.load(ckpt, device=args.device, dtype=serving_dtype(args.precision), random_weights=True)
    if args.attn != "sdpa":
        model.set_attention(args.attn)
    plans = []
    for wl in args.workloads:
        rows = _workload_rows(wl, args)
        dev = device_alone(model, rows, args)
        pred, pred_res = predict_alone(model, rows, args)
        log.info("%s %s: device %.1f rows/s, predict %.1f rows/s (%d rows)", shape, wl, dev["rows_per_s"],
                 pred["rows_per_s"], len(rows))
        plans.append((wl, rows, dev, pred, [r.to_json_dict() for r in pred_res]))
    model.to("meta")  # the workers need the device memory
    del model
    _free_device(args.device)
    base = {"cpu_processes": args.cpu_processes}
    arms = [(wl, rows, dev, pred, dicts, "default", base) for wl, rows, dev, pred, dicts in plans]
    if args.threads_baseline:  # the same short rows through a worker rendering in threads
        arms += [(wl, rows, dev, pred, dicts, "threads", {"cpu_processes": 0})
                 for wl, rows, dev, pred, dicts in plans if wl == "short1"]
    for name, overrides in args.variant:  # the same workloads with other worker settings
        arms += [(wl, rows, dev, pred, dicts, name, {**base, **overrides}) for wl, rows, dev, pred, dicts in plans
                 if wl in args.variant_workloads]
    with bench_redis(work / f"redis-{shape}", args.redis_url) as (url, what, _):
        for wl, rows, dev, pred, pred_dicts, variant, overrides in arms:
            settings = {"redis_url": url, "checkpoint": ckpt, "device": args.device, "precision": args.precision,
                        "max_batch_tokens": args.max_batch_tokens, "max_wait_ms": args.max_wait_ms,
                        "max_buffered": args.max_buffered, "render_threads": args.render_threads,
                        "row_tokens": args.row_tokens, "attn": args.attn, "random_weights": 1, **overrides}
            cpu_processes = settings["cpu_processes"]
            w = start_vela2_worker(f"{shape}-{wl}-{variant}", work, settings, profile=args.profile)
            try:
                w.wait_ready(READY_TIMEOUT_S)
                queue_path(url, model_name, short_rows(24, "warm-", seed=99), 1, args.timeout_s, w.pid)  # warm-up
                q, answers = queue_path(url, model_name, rows, WORKLOADS[wl], args.timeout_s, w.pid)
            finally:
                w.terminate(120)
            stats = w.engine_stats()
            gc_line = [x for x in w.log().splitlines() if GC_LOG_PREFIX in x]
            profile = json.loads(profile_path(w).read_text()) if args.profile and profile_path(w).exists() else None
            right = [answers.get(r["id"], {"status": "missing"}) for r in rows]
            cmp = compare_answers(pred_dicts, right)
            ratio = q["rows_per_s"] / dev["rows_per_s"]
            record = {
                "model": shape, "workload": wl, "chunk_size": WORKLOADS[wl], "cpu_processes": cpu_processes,
                "variant": variant, "overrides": overrides,
                "device_rows_per_s": dev["rows_per_s"], "predict_rows_per_s": pred["rows_per_s"],
                "queue_rows_per_s": q["rows_per_s"], "ratio_vs_device": round(ratio, 3),
                "ratio_predict_vs_device": round(pred["rows_per_s"] / dev["rows_per_s"], 3),
                "goal": GOALS[wl], "meets_goal": ratio >= GOALS[wl], "lost": q["lost"],
                "answers_vs_predict": cmp,
                "worker_cpu_ms_per_request": cpu_by_stage(stats),
                "worker_batches": (stats or {}).get("batches"),
                "worker_rows_per_batch": round(stats["answered"] / stats["batches"], 1)
                if stats and stats.get("batches") else None,
                "worker_process_cpu_s_in_phase": q["worker_cpu_s"],
                "device_timeline": device_timeline(stats, q["window"]),
                "worker_gc": json.loads(gc_line[-1].split(GC_LOG_PREFIX, 1)[1]) if gc_line else None,
                **({"worker_profile": profile} if profile else {}),
                "device": dev, "predict": pred, "queue": q, "redis": what,
            }
            log.info("%s %s: queue %.1f rows/s = %.3f of the device (lost %d, %d decision diffs); CPU ms/request %s",
                     shape, wl, q["rows_per_s"], ratio, q["lost"], record["answers_vs_predict"]["decision_diffs"],
                     (record["worker_cpu_ms_per_request"] or {}).get("ms"))
            emit(record)


def _free_device(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def shape_arguments(shape: str, args: argparse.Namespace, model_name: str) -> argparse.Namespace:
    """`args` with the sizes of SHAPES[shape] and `model_name`: what write_bench_checkpoint reads."""
    hidden, layers, heads, kv, inter = SHAPES[shape]
    return argparse.Namespace(**{**vars(args), "hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv,
                                 "intermediate": inter, "model_name": model_name})


def parse_shapes(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`args.shapes` (a comma list) as a list of SHAPES' names (ap.error on another), and the
    precision's default: bf16 on CUDA, fp32 on a CPU."""
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.precision = args.precision or ("fp32" if args.device == "cpu" else "bf16")
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")


def shapes_report(module: str, argv: list[str], device: str) -> dict[str, Any]:
    """The head of a per-shape benchmark's JSON: its command, the machine, the GPUs on CUDA."""
    report: dict[str, Any] = {"command": f"python -m {module} " + " ".join(argv), "machine": machine_info(),
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "shapes": {}}
    if device.startswith("cuda"):
        report["gpu"] = gpu_info()
    return report


def add_serving_arguments(ap: argparse.ArgumentParser) -> None:
    """The seed, the tokenizer and the hot-path worker settings (max_wait_ms 20, row_tokens 2048,
    sdpa): what bench.hotpath and bench.latency both take."""
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", choices=("bench", "demo"), default="bench")
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--row-tokens", type=int, default=2048)
    ap.add_argument("--max-batch-tokens", type=int, default=65536)
    ap.add_argument("--max-wait-ms", type=float, default=20.0)
    ap.add_argument("--max-buffered", type=int, default=2048)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1.5b,9b", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default=None, help="default bf16 on cuda, fp32 on cpu")
    ap.add_argument("--short-rows", type=int, default=3000, help="rows of the short workloads")
    ap.add_argument("--copies", type=int, default=2, help="copies of the 240-row seed-like mix")
    ap.add_argument("--max-rows", type=int, default=None, help="only the first N rows of the mix (smoke runs)")
    add_serving_arguments(ap)
    ap.add_argument("--render-threads", type=int, default=2)
    ap.add_argument("--cpu-processes", type=int, default=-1, help="worker render / decode processes (-1: auto)")
    ap.add_argument("--threads-baseline", action="store_true",
                    help="also run short1 through a worker rendering in threads (cpu_processes 0)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:K=V,K=V",
                    help="also run the --variant-workloads through a worker with these settings (repeatable)")
    ap.add_argument("--variant-workloads", default="short1", help="comma list: the workloads variants run")
    ap.add_argument("--profile", action="store_true",
                    help="profile every worker thread (cProfile on thread CPU time; slows the worker)")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="longest wait for one phase's results")
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--out", default="bench/results/gpu-hotpath.json")
    args = ap.parse_args(argv)
    args.shapes = args.shapes.split(",")
    args.workloads = args.workloads.split(",")
    args.variant_workloads = args.variant_workloads.split(",")
    variants = []
    for v in args.variant:
        name, _, kvs = v.partition(":")
        try:
            variants.append((name, {k: _setting_value(x) for k, _, x in (kv.partition("=") for kv in kvs.split(","))}))
        except ValueError:
            ap.error(f"--variant {v!r}: expected NAME:KEY=VALUE[,KEY=VALUE]")
    args.variant = variants
    if set(args.shapes) - set(SHAPES) or set(args.workloads) - set(WORKLOADS):
        ap.error(f"--shapes from {sorted(SHAPES)}, --workloads from {sorted(WORKLOADS)}")
    args.precision = args.precision or ("fp32" if args.device == "cpu" else "bf16")
    return args


def _setting_value(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0 = _now()
    runs: list[dict[str, Any]] = []
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "redis_url")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def emit(record: dict[str, Any] | None = None) -> None:  # the JSON so far, after every record
        if record is not None:
            runs.append(record)
        doc = {"command": "python -m bench.hotpath " + shlex.join(argv), "gpu": {"device": args.device, **gpu_info()},
               "machine": machine_info(), "settings": settings, "runs": runs, "wall_seconds": round(_now() - t0, 1)}
        out.write_text(json.dumps(doc, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="hotpath-") as tmp:
        for shape in args.shapes:
            run_shape(shape, args, Path(tmp), emit)
    emit()
    print(f"wrote {out}")
    for r in runs:
        print(f"{r['model']:>5} {r['workload']:>8} {r['variant']:>10}: device {r['device_rows_per_s']:>8.1f}  "
              f"predict "
              f"{r['predict_rows_per_s']:>8.1f}  queue {r['queue_rows_per_s']:>8.1f} rows/s  ratio "
              f"{r['ratio_vs_device']:.3f} (goal {r['goal']})  lost {r['lost']}  "
              f"decision diffs {r['answers_vs_predict']['decision_diffs']}")
    return 0 if all(r["lost"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
