"""Latency of online traffic on one device, as a web backend sees it (issue 36's method), with the
hot path's device-alone rate measured in the same run as the yardstick.

    python -m bench.latency --out bench/results/gpu-latency.json                 # the GPU machine: 9b, 1.5b
    python -m bench.latency --device cpu --shapes tiny --tokenizer demo --loads 0.5 --duration-s 5 \
        --warmup-s 1 --cold-s 3 --sequential 20 --out /tmp/latency.json          # a smoke run on a CPU

For each shape (random weights in the layout of bench.gpu_engine; bench.hotpath's SHAPES):
device_rows_per_s   bench.hotpath.device_alone over the short rows (5-60 words, one question; the
                    `short1` workload): run_ahead with one batch in flight, rendered beforehand.
ready_s             a fresh worker (the hot-path settings: max_wait_ms 20, row_tokens 2048, sdpa, 4
                    render processes) from launch to ready.
cold                open-loop load at --cold-load of the device-alone rate for the first --cold-s
                    seconds after ready (no warm-up): what autoscaling's new worker serves first.
sequential          --sequential requests one at a time: a request alone, end to end.
points              open-loop Poisson load at each of --loads x the device-alone rate: --warmup-s,
                    then --duration-s measured, from --processes client processes of
                    producer.AsyncClient (producer.loadtest, what `vela2 loadtest` runs): p50 / p90 / p99
                    / max from each request's due time, completions vs arrivals, the answers' stages.
worker              the worker's batches and rows per batch over the run (its engine stats).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.faults.redis import metric
from bench.hotpath import (
    SHAPES,
    _free_device,
    add_serving_arguments,
    device_alone,
    parse_shapes,
    shape_arguments,
    shapes_report,
)
from bench.queue_bench import (
    READY_TIMEOUT_S,
    bench_redis,
    short_rows,
    start_vela2_worker,
    write_bench_checkpoint,
)
from producer.loadtest.openloop import Plan, Target, run_point, run_sequential
from producer.loadtest.report import line, summarize

log = logging.getLogger("bench.latency")


def goals(shape: str) -> dict[str, float]:
    """Issue 36's goals for a shape (ms, and ratios)."""
    if shape == "9b":
        return {"sequential_p50_ms": 15, "load_0.8_p50_ms": 60, "load_0.8_p99_ms": 150, "load_0.95_p99_ms": 500,
                "cold_p99_vs_steady_0.5": 1.5}
    if shape == "1.5b":
        return {"sequential_p50_ms": 8}
    return {}


def _requests_file(path: Path, n: int, seed: int) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for row in short_rows(n, "lat-", seed=seed):
            f.write(json.dumps({k: v for k, v in row.items() if k != "id"}) + "\n")
    return path


def device_rate(shape: str, ckpt: Path, rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The device-alone rate over `rows` (bench.hotpath.device_alone), the model freed after."""
    import vela2
    from vela2.model.checkpoint import serving_dtype

    model = vela2.load(ckpt, device=args.device, dtype=serving_dtype(args.precision), random_weights=True)
    dev = device_alone(model, rows, args)
    model.to("meta")
    del model
    _free_device(args.device)
    log.info("%s: device alone %.1f rows/s", shape, dev["rows_per_s"])
    return dev


def batch_counts(port: int) -> tuple[float, float]:
    """(batches, sequences) the worker ran so far, from its metrics endpoint (vela2_batch_size)."""
    counts = [metric(port, f"vela2_batch_size_{part}") for part in ("count", "sum")]
    if None in counts:
        raise RuntimeError(f"the worker's metrics on port {port} do not answer vela2_batch_size")
    return counts[0] or 0.0, counts[1] or 0.0


def serve_and_measure(shape: str, ckpt: Path, workload: Path, rate: float, args: argparse.Namespace,
                      work: Path) -> dict[str, Any]:
    """A fresh worker: ready time, the cold window, requests one at a time, then each load."""
    from stack.harness import free_port
    from vela2.config import Vela2Config

    model_name = Vela2Config.read(ckpt).name
    out: dict[str, Any] = {}
    port = free_port()
    with bench_redis(work / f"redis-{shape}", args.redis_url) as (url, what, _):
        settings = {"redis_url": url, "checkpoint": ckpt, "device": args.device, "precision": args.precision,
                    "max_batch_tokens": args.max_batch_tokens, "max_wait_ms": args.max_wait_ms,
                    "max_buffered": args.max_buffered, "row_tokens": args.row_tokens, "attn": args.attn,
                    "cpu_processes": args.cpu_processes, "target_p99_ms": args.target_p99_ms, "random_weights": 1,
                    "metrics_port": port}
        w = start_vela2_worker(f"lat-{shape}", work, settings)
        try:
            w.wait_ready(READY_TIMEOUT_S)
            out["ready_s"] = round(w.ready_s or 0.0, 1)
            target = Target(model_name, redis_url=url, timeout_s=args.timeout_s)

            def measured(tag: str, load: float, warmup_s: float, duration_s: float) -> dict[str, Any]:
                """One open-loop point, with the worker's batches over it (warm-up included)."""
                plan = Plan(target, str(workload), f"{shape}-{tag}-", args.seed, load * rate, 1, warmup_s,
                            duration_s, 0.0)
                b0, s0 = batch_counts(port)
                point = summarize(run_point(plan, args.processes), load * rate, duration_s)
                b1, s1 = batch_counts(port)
                return {**point, "load": load, "batches": int(b1 - b0),
                        "rows_per_batch": round((s1 - s0) / (b1 - b0), 2) if b1 > b0 else None}

            if args.cold_s:
                out["cold"] = measured("cold", args.cold_load, 0.0, args.cold_s)
                log.info("%s cold %s", shape, line(out["cold"]))
            if args.sequential:
                plan = Plan(target, str(workload), f"{shape}-seq-", args.seed, 1.0, 1, 0.0, 0.0, 0.0)
                seq = run_sequential(plan, args.sequential)
                out["sequential"] = {**summarize(seq, 0.0, max(o.due_s for o in seq) or 1.0),
                                     "sequential": args.sequential}
                log.info("%s %s", shape, line(out["sequential"]))
            out["points"] = []
            for load in args.loads:
                out["points"].append(measured(f"l{load}", load, args.warmup_s, args.duration_s))
                log.info("%s load %.2f: %s; %s rows / batch", shape, load, line(out["points"][-1]),
                         out["points"][-1]["rows_per_batch"])
        finally:
            w.terminate(120)
        # the engine's counts, with its last RECENT_BATCHES batches (those of the last point)
        out["worker"] = {"redis": what, "stats": w.engine_stats() or {}}
    return out


def verdict(shape: str, record: dict[str, Any]) -> dict[str, Any]:
    """Each goal of the shape with the figure measured and whether it holds."""
    points = {p["load"]: p for p in record.get("points", [])}
    got: dict[str, float | None] = {
        "sequential_p50_ms": (record.get("sequential") or {}).get("latency_ms", {}).get("p50"),
        "load_0.8_p50_ms": points.get(0.8, {}).get("latency_ms", {}).get("p50"),
        "load_0.8_p99_ms": points.get(0.8, {}).get("latency_ms", {}).get("p99"),
        "load_0.95_p99_ms": points.get(0.95, {}).get("latency_ms", {}).get("p99"),
    }
    steady = points.get(record.get("cold", {}).get("load"), {}).get("latency_ms", {}).get("p99")
    cold = record.get("cold", {}).get("latency_ms", {}).get("p99")
    got["cold_p99_vs_steady_0.5"] = round(cold / steady, 2) if cold and steady else None
    return {k: {"goal": v, "got": got.get(k), "met": got.get(k) is not None and got[k] <= v}  # type: ignore[operator]
            for k, v in goals(shape).items()}


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="9b,1.5b", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default=None, help="default bf16 on cuda, fp32 on cpu")
    ap.add_argument("--loads", default="0.5,0.8,0.95", help="fractions of the device-alone rate, comma list")
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--duration-s", type=float, default=45.0)
    ap.add_argument("--cold-s", type=float, default=15.0, help="the window right after ready (0: none)")
    ap.add_argument("--cold-load", type=float, default=0.5)
    ap.add_argument("--sequential", type=int, default=200, help="requests one at a time (0: none)")
    ap.add_argument("--processes", type=int, default=4, help="client processes")
    ap.add_argument("--short-rows", type=int, default=2000, help="rows the device-alone rate is measured on")
    ap.add_argument("--device-rate", type=float, default=0.0,
                    help="rows/s to take as the device-alone rate instead of measuring it (one shape)")
    add_serving_arguments(ap)
    ap.add_argument("--target-p99-ms", type=float, default=0.0)
    ap.add_argument("--cpu-processes", type=int, default=4, help="worker render / decode processes")
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--out", default="bench/results/gpu-latency.json")
    args = ap.parse_args(argv)
    args.loads = [float(x) for x in args.loads.split(",") if x]
    parse_shapes(ap, args)
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    report = shapes_report("bench.latency", argv, args.device)
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="vela2-latency-") as tmp:
        work = Path(tmp)
        for shape in args.shapes:
            shape_args = argparse.Namespace(**{**vars(shape_arguments(shape, args, f"vela2-lat-{shape}")),
                                               "copies": 1, "max_rows": None})
            ckpt = write_bench_checkpoint(work / f"ckpt-{shape}", shape_args)
            rows = short_rows(args.short_rows, "dev-", seed=args.seed)
            dev = ({"rows_per_s": args.device_rate, "given": True} if args.device_rate
                   else device_rate(shape, ckpt, rows, shape_args))
            workload = _requests_file(work / f"requests-{shape}.jsonl", 4000, args.seed + 1)
            record = {"device_rows_per_s": dev["rows_per_s"], "device": dev,
                      **serve_and_measure(shape, ckpt, workload, dev["rows_per_s"], shape_args, work)}
            record["goals"] = verdict(shape, record)
            report["shapes"][shape] = record
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")  # each shape: a partial run counts
    lost = sum(p["lost"] for s in report["shapes"].values()
               for p in [*s.get("points", []), *[s[k] for k in ("cold", "sequential") if k in s]])
    log.info("wrote %s (lost %d)", out, lost)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
