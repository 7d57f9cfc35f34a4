"""Where one ~64k-token forward of the 9B shape spends its time, by kernel class.

    python -m bench.gpu_profile --out bench/results/gpu-profile.json [--variants transformers:bf16,fused:bf16,fused:fp8]
    python -m bench.gpu_profile --single --attn sdpa --variants transformers:bf16,fused:bf16,graphs:bf16 \
        --out bench/results/gpu-profile-batch1.json

Builds the model of bench.gpu_engine (random bf16 weights, Qwen2 layout, 9B shapes by default),
renders the seed-like mix and packs its first batch the way `ours` does (--max-batch-tokens
padded tokens in rows of --row-tokens), or with --single one sequence alone (the workload's
mean length, unpacked: batch1's shape). For each variant (path:precision; path "transformers" runs
the backbone's own forward, vela2.model.fused.ENABLED off; "fused" the product's fused decoder; "graphs"
the fused decoder replayed as a CUDA graph, vela2.model.fused.GRAPH_MAX_TOKENS on, sdpa only) it runs
`vela2.scoring.pipeline.run_batch` on that batch: warm-ups (compiles), --iters timed with CUDA events
(median), then one run under torch.profiler. Kernels are put in classes by name:

    gemm         cuBLAS / CUTLASS / nvjet matrix kernels (bf16 GEMMs, fp8 _scaled_mm)
    attention    sdpa (fmha / flash) and flex attention (inductor's flex template)
    elementwise  everything else: norms, rotary, SiLU * up, residual adds, casts, copies, quantisation
    idle         the span from the first kernel's start to the last kernel's end not covered by any kernel

and each class gets ms, its share of the span, us per real token and, for gemm, the achieved rate
(2 x non-embedding parameters x padded tokens / GEMM time). The twelve longest kernels of each
variant are listed by name so the classification can be checked.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

CLASSES = ("gemm", "attention", "elementwise", "idle")
ATTENTION_MARKS = ("flex_attention", "fmha", "flash", "attention")
GEMM_MARKS = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "scaled_mm", "f8f8bf16", "_mm_", "sm90_")


def kernel_class(name: str) -> str:
    """gemm, attention or elementwise, from a CUDA kernel's name (attention first: CUTLASS fmha
    kernels carry 'cutlass' too; inductor's pointwise / reduction kernels start 'triton_' and are
    elementwise unless a template ('triton_tem') of a matmul)."""
    n = name.lower()
    if any(m in n for m in ATTENTION_MARKS):
        return "attention"
    if n.startswith("triton_") and not (n.startswith("triton_tem") and "mm" in n):
        return "elementwise"
    if any(m in n for m in GEMM_MARKS):
        return "gemm"
    return "elementwise"


def breakdown(kernels: list[tuple[str, float, float]]) -> dict[str, float]:
    """ms per class over kernels (name, start_us, end_us); idle = span - union of kernel intervals."""
    out = dict.fromkeys(CLASSES, 0.0)
    if not kernels:
        return out
    for name, start, end in kernels:
        out[kernel_class(name)] += (end - start) / 1e3
    busy, cur_s, cur_e = 0.0, None, None
    for _, start, end in sorted(kernels, key=lambda k: k[1]):
        if cur_e is None or start > cur_e:
            if cur_e is not None and cur_s is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = start, end
        else:
            cur_e = max(cur_e, end)
    if cur_e is not None and cur_s is not None:
        busy += cur_e - cur_s
    span = max(e for _, _, e in kernels) - min(s for _, s, _ in kernels)
    out["idle"] = (span - busy) / 1e3
    out["span"] = span / 1e3
    return out


def profile_variant(model, sequences: list, row_tokens: int | None, precision: str, iters: int,
                    non_embedding: int, padded: int, real: int, peak_flops: float) -> dict[str, Any]:
    """Warm up, time `iters` run_batch calls (median, CUDA events), profile one; the class table."""
    from torch.profiler import ProfilerActivity, profile

    from vela2.scoring.pipeline import run_batch

    for _ in range(2):  # compiles (first call) and first-use costs of new shapes
        run_batch(model, sequences, precision, row_tokens)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run_batch(model, sequences, precision, row_tokens)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_batch(model, sequences, precision, row_tokens)
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
               and not e.name.startswith("Memcpy") and not e.name.startswith("Memset")]
    ms = breakdown(kernels)
    span = ms.pop("span", 0.0)
    forward_ms = statistics.median(times)
    by_name: dict[str, float] = {}
    for name, s, e in kernels:
        by_name[name] = by_name.get(name, 0.0) + (e - s) / 1e3
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {
        "forward_ms_median": round(forward_ms, 3),
        "forward_ms_all": [round(t, 3) for t in times],
        "real_tokens_per_s": round(real / forward_ms * 1e3, 1),
        "mfu_real_tokens": round(2.0 * non_embedding * real / (forward_ms / 1e3) / peak_flops, 4),
        "profiled_span_ms": round(span, 3),
        "kernels": len(kernels),
        "classes": {c: {"ms": round(ms[c], 3), "share": round(ms[c] / span, 4) if span else None,
                        "us_per_real_token": round(ms[c] * 1e3 / real, 4)} for c in CLASSES},
        "gemm_tflops": round(2.0 * non_embedding * padded / (ms["gemm"] / 1e3) / 1e12, 1) if ms["gemm"] else None,
        "top_kernels": [{"name": n[:160], "ms": round(t, 3), "class": kernel_class(n)} for n, t in top],
    }


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, profile each variant, write the JSON, print the table."""
    from bench import gpu_engine
    from bench.workload import make_workload
    from vela2.model import fused
    from vela2.text.packing import pack, plan_rows

    ap = argparse.ArgumentParser(prog="python -m bench.gpu_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results/gpu-profile.json")
    ap.add_argument("--variants", default="transformers:bf16,fused:bf16,fused:fp8",
                    help="comma list of path:precision, path transformers or fused, precision bf16 / fp8 / fp32")
    ap.add_argument("--attn", default="flex", choices=("sdpa", "flex"))
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--max-batch-tokens", type=int, default=65536)
    ap.add_argument("--row-tokens", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--single", action="store_true", help="one sequence alone (batch1's shape) instead of a batch")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    variants = [tuple(v.split(":")) for v in args.variants.split(",")]
    bad = [v for v in variants if len(v) != 2 or v[0] not in ("transformers", "fused", "graphs")]
    if bad:
        ap.error(f"--variants must be path:precision with path transformers, fused or graphs; got {args.variants!r}")

    margs = gpu_engine.parse_args(["--layers", str(args.layers), "--hidden", str(args.hidden)])
    device = torch.device("cuda")
    peak = gpu_engine.matmul_peak(device, 8192)
    model = gpu_engine.build_model(margs, device).set_attention(args.attn)
    params = gpu_engine.count_params(model)
    preps, _ = gpu_engine.prepare_all(model, make_workload(seed=0, copies=1))
    sequences = [s for p in preps for s in p.sequences]
    lengths = [s.num_tokens for s in sequences]
    row_tokens: int | None = args.row_tokens
    if args.single:
        mean = sum(lengths) / len(lengths)
        first = [min(range(len(lengths)), key=lambda i: abs(lengths[i] - mean))]
        row_tokens, rows, padded = None, 1, lengths[first[0]]
    else:
        first = pack(lengths, args.max_batch_tokens, args.row_tokens)[0]
        rows = len(plan_rows([lengths[i] for i in first], args.row_tokens))
        padded = rows * args.row_tokens
    batch = [sequences[i] for i in first]
    real = sum(lengths[i] for i in first)
    log.info("batch: %d sequences in %d rows: %d real / %d padded tokens", len(batch), rows, real, padded)
    results = {}
    for path, precision in variants:
        fused.ENABLED = path != "transformers"
        fused.GRAPH_MAX_TOKENS = 1 << 30 if path == "graphs" else 0
        t0 = time.perf_counter()
        results[f"{path}:{precision}"] = r = profile_variant(model, batch, row_tokens, precision, args.iters,
                                                             params["non_embedding"], padded, real, peak["flops_per_s"])
        log.info("%s:%s: %.1f ms, MFU %.3f (%.0f s with compiles)", path, precision, r["forward_ms_median"],
                 r["mfu_real_tokens"], time.perf_counter() - t0)
    fused.ENABLED, fused.GRAPH_MAX_TOKENS = True, 0
    import transformers

    doc = {
        "command": "python -m bench.gpu_profile " + " ".join(argv if argv is not None else sys.argv[1:]),
        "gpu": {"name": torch.cuda.get_device_name(device), "torch": torch.__version__,
                "transformers": transformers.__version__},
        "model": {"hidden": args.hidden, "layers": args.layers, "non_embedding_params": params["non_embedding"],
                  "attention": args.attn},
        "batch": {"sequences": len(batch), "rows": rows, "row_tokens": row_tokens, "real_tokens": real,
                  "padded_tokens": padded},
        "matmul_peak_tflops": peak["tflops"],
        "variants": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{'variant':<20} {'ms':>8} {'MFU':>6} " + " ".join(f"{c + ' ms (share)':>22}" for c in CLASSES)
          + f" {'GEMM TFLOP/s':>12}")
    for name, r in results.items():
        cells = " ".join(f"{r['classes'][c]['ms']:>12.1f} ({r['classes'][c]['share'] or 0:>5.1%})" for c in CLASSES)
        print(f"{name:<20} {r['forward_ms_median']:>8.1f} {r['mfu_real_tokens']:>6.3f} {cells} "
              f"{r['gemm_tflops'] or 0:>12.1f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
