"""What batch-invariant mode costs and whether it holds, on the GPU (issue 41).

    python -m bench.gpu_invariant --out bench/results/gpu-invariant.json [--layers 36] [--chunks 512,1024]

On the 9B-shaped random model of bench.gpu_engine (bf16 weights, the bench tokenizer, a 2,048-token
window), in one run, each arm after a warm-up pass (compiles) and timed with one batch in flight
(vela2.scoring.pipeline.run_ahead, as the worker drives the device):

- headline: the engine workload (bench.workload, --copies) packed under --max-batch-tokens; the
  default mode as the engine headline runs it (sdpa, packed rows of --row-tokens) vs invariant mode
  at each chunk size in --chunks (vela2.model.invariant.CHUNK_TOKENS of the device); at bf16, and at
  fp8 with the product's chunk;
- hot path: the workload's short single-question sequences (at most --short-tokens) in batches of
  --hot-batch-tokens, the size a latency-bound worker runs; default vs invariant;
- batch-1 latency: one short row alone through predict(), p50 / p90 of --latency-runs, default (which
  replays a CUDA graph) vs invariant;
- invariance (with the product's chunk): --check-rows rows scored batched together, shuffled in
  small batches and each alone: rows whose answer (every logit and probability) differs from the
  batched one, per mode and precision (invariant mode: 0 expected; the default mode: the batch-shape
  effect).

The JSON is rewritten after each section, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.gpu_engine import build_model, prepare_all
from bench.workload import make_workload

log = logging.getLogger("bench.gpu_invariant")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_invariant", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/gpu-invariant.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--tokenizer", choices=("bench", "demo"), default="bench")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--copies", type=int, default=1, help="copies of the engine workload (headline)")
    ap.add_argument("--max-rows", type=int, default=None, help="only the first N rows (smoke tests)")
    ap.add_argument("--max-batch-tokens", type=int, default=65536)
    ap.add_argument("--row-tokens", type=int, default=2048, help="the default mode's packed rows")
    ap.add_argument("--chunks", default="512,1024", help="invariant chunk sizes (CHUNK_TOKENS) to time")
    ap.add_argument("--short-tokens", type=int, default=384, help="a hot-path sequence has at most this many")
    ap.add_argument("--hot-batch-tokens", type=int, default=4096)
    ap.add_argument("--latency-runs", type=int, default=20)
    ap.add_argument("--check-rows", type=int, default=48)
    ap.add_argument("--fp8", type=int, default=1, help="1: the fp8 headline and fp8 invariance too")
    args = ap.parse_args(argv)
    args.heads = args.heads or max(1, args.hidden // 128)  # as bench.gpu_engine: the 9B export's shapes
    args.kv_heads = args.kv_heads or max(1, args.heads // 4)
    args.intermediate = args.intermediate or int(args.hidden * 3.5)
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_pass(model: Any, sequences: list, batches: list[list[int]], precision: str, invariant: bool,
               row_tokens: int | None) -> dict[str, Any]:
    """A warm-up pass, then a timed one: seconds and real tokens/s."""
    from vela2.scoring import pipeline

    def one_pass() -> float:
        _sync(model.device)
        t0 = time.perf_counter()
        for _ in pipeline.run_ahead(model, ([sequences[i] for i in b] for b in batches), precision,
                                    None if invariant else row_tokens, batch_invariant=invariant):
            pass
        _sync(model.device)
        return time.perf_counter() - t0

    warm = one_pass()
    seconds = one_pass()
    tokens = sum(sequences[i].num_tokens for b in batches for i in b)
    return {"seconds": round(seconds, 4), "warmup_seconds": round(warm, 2), "real_tokens": tokens,
            "real_tokens_per_s": round(tokens / seconds, 1), "batches": len(batches)}


def compare_modes(model: Any, sequences: list, batches: list[list[int]], precision: str, chunks: list[int],
                  row_tokens: int | None) -> dict[str, Any]:
    """The default mode vs invariant mode at each chunk size: tokens/s and the ratio."""
    from vela2.model import invariant

    out: dict[str, Any] = {"default": timed_pass(model, sequences, batches, precision, False, row_tokens)}
    for chunk in chunks:
        invariant.CHUNK_TOKENS[model.device.type] = chunk
        arm = timed_pass(model, sequences, batches, precision, True, row_tokens)
        arm["vs_default"] = round(arm["real_tokens_per_s"] / out["default"]["real_tokens_per_s"], 4)
        out[f"invariant_chunk{chunk}"] = arm
        log.info("%s chunk %d: %.3f of the default mode's tokens/s", precision, chunk, arm["vs_default"])
    return out


def latency(model: Any, row: dict, invariant: bool, runs: int) -> dict[str, float]:
    """p50 / p90 ms of predict() on one row alone (5 warm calls first)."""
    import vela2

    times = []
    for k in range(5 + runs):
        _sync(model.device)
        t0 = time.perf_counter()
        vela2.predict(model, [row], precision="bf16", batch_invariant=invariant)
        if k >= 5:
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"p50_ms": round(statistics.median(times), 2), "p90_ms": round(times[int(0.9 * (len(times) - 1))], 2)}


def invariance(model: Any, rows: list[dict], precision: str, invariant: bool) -> dict[str, Any]:
    """Rows whose answer (logits, probabilities, decisions, spans) differs from the batched answer when
    scored shuffled in small batches or alone."""
    import vela2

    def answers(results: list) -> list[str]:
        return [json.dumps({k: v for k, v in r.to_json_dict().items() if k != "timings"}, sort_keys=True)
                for r in results]

    rows = [dict(r, logits=True, units=True) for r in rows]
    batched = answers(vela2.predict(model, rows, precision=precision, batch_invariant=invariant))
    order = list(range(len(rows)))
    random.Random(0).shuffle(order)
    small = answers(vela2.predict(model, [rows[i] for i in order], precision=precision, max_batch_tokens=3000,
                                  batch_invariant=invariant))
    shuffled = [""] * len(rows)
    for k, i in enumerate(order):
        shuffled[i] = small[k]
    alone = [answers(vela2.predict(model, [r], precision=precision, batch_invariant=invariant))[0] for r in rows]
    return {"rows": len(rows),
            "differ_shuffled_small_batches": sum(a != b for a, b in zip(batched, shuffled, strict=True)),
            "differ_alone": sum(a != b for a, b in zip(batched, alone, strict=True))}


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    from vela2.model import fused, invariant
    from vela2.text.packing import pack

    device = torch.device(args.device)
    doc: dict[str, Any] = {"command": "python -m bench.gpu_invariant " + shlex.join(argv), "argv": argv,
                           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
                           "torch": torch.__version__, "sections": {}}
    out = Path(args.out)

    def save(section: str, value: Any) -> None:
        doc["sections"][section] = value
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")

    t0 = time.perf_counter()
    model = build_model(args, device)
    rows = make_workload(seed=0, copies=args.copies)[: args.max_rows]
    preps, _ = prepare_all(model, rows)
    sequences = [s for p in preps for s in p.sequences]
    lengths = [s.num_tokens for s in sequences]
    doc["model"] = {"layers": args.layers, "hidden": args.hidden, "build_s": round(time.perf_counter() - t0, 1),
                    "sequences": len(sequences), "tokens": sum(lengths)}
    chunks = [int(c) for c in args.chunks.split(",")]
    product_chunk = invariant.chunk_tokens(device)
    headline = pack(lengths, args.max_batch_tokens, args.row_tokens)
    save("headline_bf16", compare_modes(model, sequences, headline, "bf16", chunks, args.row_tokens))
    short = [i for i, n in enumerate(lengths) if n <= args.short_tokens]
    hot = [[short[k] for k in b] for b in pack([lengths[i] for i in short], args.hot_batch_tokens)]
    save("hot_path_bf16", compare_modes(model, sequences, hot, "bf16", chunks, None))
    single = min((r for r in rows if len(r["questions"]) == 1), key=lambda r: len(r["text"]))
    save("batch1_latency_bf16", {"default_graphs": latency(model, single, False, args.latency_runs),
                                 **{f"invariant_chunk{c}": (invariant.CHUNK_TOKENS.update({device.type: c}),
                                                            latency(model, single, True, args.latency_runs))[1]
                                    for c in chunks}})
    invariant.CHUNK_TOKENS[device.type] = product_chunk  # the product's own from here on
    check_rows = rows[: args.check_rows]
    precisions = ["bf16", "fp8"] if args.fp8 and fused.supported(model.backbone) is None else ["bf16"]
    save("invariance", {p: {"invariant": invariance(model, check_rows, p, True),
                            "default": invariance(model, check_rows, p, False)} for p in precisions})
    if "fp8" in precisions:
        save("headline_fp8", compare_modes(model, sequences, headline, "fp8", [product_chunk], args.row_tokens))
    doc["wall_seconds"] = round(time.perf_counter() - t0, 1)
    save("done", True)
    return doc


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    run(parse_args(argv), argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
