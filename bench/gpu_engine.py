"""Engine benchmark: our token-budget batching vs batch-1 vs fixed batches of 32, and bundling.

    python -m bench.gpu_engine --out bench/results/gpu.json [--layers 36] [--copies 1] \
        [--max-batch-tokens 65536] [--row-tokens 2048] [--attn sdpa,flex]

Builds a Qwen2-layout backbone (default: hidden 4096, 36 layers, MLP 14336, 32 heads / 8 KV heads,
7.85B non-embedding parameters, the 9B export's shapes) with seeded random weights directly on the
device in bf16, with the demo tokenizer and a 2,048-token window. On the workload of bench.workload
(the seed's 230 dev rows + 10 constructed bundles per copy) it measures, in one run:

- the bf16 matmul peak: an N^3 matmul (N = 8192 on CUDA), 3 warm-ups + 10 timed (CUDA events), on
  a cold GPU (the peak every MFU here is against); then the same matmul SUSTAINED_ITERS times,
  the rate a GPU at its power cap holds (`matmul_sustained`, `engine.mfu_real_tokens_vs_sustained`);
- every arm runs the product path: vela2.scoring.pipeline.launch_batch with one batch in flight, as the
  worker's device loop drives it (batch N+1 collated and queued before batch N's outputs are
  collected; `run_ahead`), whose encode uses the fused decoder (vela2.model.fused: fused QKV / gate_up,
  layer halves compiled on CUDA) on this Qwen2 layout;
- arms over the same rendered sequences, each timed (synchronised) after one warm-up pass, with
  torch.cuda.max_memory_allocated reset before each:
    ours     vela2.scoring.pipeline.pack under --max-batch-tokens (padded tokens), one launch per batch
             (--row-tokens R: several short sequences share a padded row; a list adds arms);
    batch1   one sequence per forward, arrival order, launched kernel by kernel (CUDA graphs off);
    fixed32  consecutive batches of 32 sequences in arrival order, padded to their longest;
    ours_fp8 `ours` (headline packing and attention) at precision fp8 (vela2.model.fused);
    unfused  `ours` with vela2.model.fused.ENABLED off: transformers' own layers (the path before issue 17);
  each reports real / padded tokens, padding fraction, seconds, real tokens/s and
  MFU on real tokens = 2 x non-embedding params x real tokens / seconds / matmul peak,
  plus its warm-up pass: seconds, kernels compiled (torch.compile of flex attention) and
  compile seconds ~ warm-up - timed (a full warm-up pass runs the timed batches once more);
- --attn sdpa,flex: `ours` under each attention backend (vela2.model.attention; the first is the
  headline and also runs bundling / engine; the others run only the packed --row-tokens modes,
  as `ours_<attn>` / `ours_rows<R>_<attn>`); batch1 / fixed32 always run sdpa (unpacked rows
  of many lengths would compile a flex kernel per shape);
- bundling: the multi-question rows bundled vs `split_bundles` (each question its own sequence),
  both packed like `ours`: questions/s and the ratio;
- engine-only rows/s: vela2.predict over all rows (render + pack + forward + decode, no queue),
  the figure the queue path is later compared with;
- latency: one short row (the workload's fewest-token single-question row) through vela2.predict
  alone, warm (5 untimed calls), LATENCY_RUNS timed: p50 / p90 ms, at bf16 (and fp8 with the fp8 arm)
  under sdpa (the row its own length), and at the headline packing (flex pads a lone row to row_tokens);
- batch1_graphs and the sdpa latencies `*_graphs`: again with CUDA-graph replay of batches up to
  --cuda-graph-tokens (default: the product's vela2.model.fused.GRAPH_MAX_TOKENS; 0 skips them), the path
  predict() and the worker take, so it is the engine's `mfu_real_tokens_batch1` (the launched one is
  `mfu_real_tokens_batch1_launched`); `graphs_vs_plain`: what replay changes in the outputs. Every
  other arm runs with replay off.

`--device cpu --layers 2 --hidden 256` runs the same script end to end on a CPU (tiny shapes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.workload import is_bundle, make_workload, split_bundles, summary

log = logging.getLogger(__name__)

TARGETS = {  # engine targets of the performance issues; "min" = at least, "max" = at most
    "mfu_real_tokens": ("min", 0.75),  # issue 17 (was 0.6)
    "mfu_real_tokens_batch1": ("min", 0.45),  # issue 17
    "fp8_speedup_vs_bf16": ("min", 1.3),  # issue 17: ours_fp8 real tokens/s over the headline's
    "ratio_vs_batch1": ("min", 3.0),
    "padding_fraction": ("max", 0.08),
}
FIXED_BATCH = 32  # sequences per batch of the fixed-size baseline
SUSTAINED_ITERS = 150  # timed matmuls of the sustained peak (0.24 s of N = 8192 on an H200: its clock falls within it)
LATENCY_RUNS = 50  # timed single-request predict() calls of the latency arm (after 5 warm-ups)
ARMS = ("ours", "fp8", "unfused", "batch1", "latency", "fixed32", "bundling", "engine")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results/gpu.json", help="JSON file to write")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--layers", type=int, default=36, help="decoder layers")
    ap.add_argument("--hidden", type=int, default=4096, help="hidden size")
    ap.add_argument("--intermediate", type=int, default=None, help="MLP width (default 3.5 x hidden)")
    ap.add_argument("--heads", type=int, default=None, help="attention heads (default hidden / 128)")
    ap.add_argument("--kv-heads", type=int, default=None, help="KV heads (default heads / 4)")
    ap.add_argument("--tokenizer", choices=("bench", "demo"), default="bench",
                    help="bench: ~1.2 tokens per word like a real vocabulary (see bench_tokenizer)")
    ap.add_argument("--window", type=int, default=2048, help="config.max_window_tokens")
    ap.add_argument("--copies", type=int, default=1, help="copies of the 240-row workload")
    ap.add_argument("--seed", type=int, default=0, help="workload seed")
    ap.add_argument("--max-rows", type=int, default=None, help="only the first N rows (smoke tests)")
    ap.add_argument("--max-batch-tokens", type=int, default=65536, help="padded-token budget of `ours`")
    ap.add_argument("--row-tokens", default="0",
                    help="comma list of pack / run_batch row_tokens for our batching; 0 = one sequence per "
                         "row; the first is the headline `ours` (and bundling / engine), others `ours_rows<R>`")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="backbone weights")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16", help="run_batch precision")
    ap.add_argument("--peak-n", type=int, default=None, help="matmul size of the peak (8192 CUDA, 512 CPU)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}")
    ap.add_argument("--warmup-batches", type=int, default=0,
                    help="batches of each arm run as its warm-up (0 = one full pass)")
    ap.add_argument("--attn", default="sdpa",
                    help="comma list of attention backends (sdpa, flex) for `ours`; the first is the headline")
    ap.add_argument("--cuda-graph-tokens", type=int, default=None,
                    help="batch1_graphs / latency *_graphs run with vela2.model.fused.GRAPH_MAX_TOKENS at this "
                         "(CUDA-graph replay of sdpa batches up to this many tokens; default the product's;"
                         " 0: not run)")
    ap.add_argument("--flex-compile", choices=("static", "auto"), default="static",
                    help="flex kernels: static = one per (rows, length) shape; auto = torch.compile dynamic=None")
    args = ap.parse_args(argv)
    from vela2.model.attention import ATTENTIONS

    args.attns = args.attn.split(",")
    if set(args.attns) - set(ATTENTIONS) or len(set(args.attns)) != len(args.attns):
        ap.error(f"--attn must be distinct names from {','.join(ATTENTIONS)}; got {args.attn!r}")
    unknown = set(args.arms.split(",")) - set(ARMS)
    if unknown:
        ap.error(f"--arms: unknown {sorted(unknown)}; choose from {','.join(ARMS)}")
    args.heads = args.heads or max(1, args.hidden // 128)
    args.kv_heads = args.kv_heads or max(1, args.heads // 4)
    args.intermediate = args.intermediate or int(args.hidden * 3.5)
    try:
        modes = [int(x) for x in args.row_tokens.split(",")]
    except ValueError:
        ap.error(f"--row-tokens must be a comma list of integers; got {args.row_tokens!r}")
    args.row_modes = [m or None for m in modes]  # None: one sequence per padded row
    return args


# --- device helpers ------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 3)


def matmul_peak(device: torch.device, n: int, dtype: torch.dtype = torch.bfloat16, warmup: int = 3,
                iters: int = 10) -> dict[str, Any]:
    """Measured dense matmul throughput: (n, n) @ (n, n), `warmup` untimed then `iters` timed."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    for _ in range(warmup):
        torch.mm(a, b)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(iters):
            torch.mm(a, b)
        end.record()
        torch.cuda.synchronize(device)
        seconds = start.elapsed_time(end) / 1e3
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, b)
        seconds = time.perf_counter() - t0
    flops = 2.0 * n**3 * iters / seconds
    del a, b
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "warmup": warmup, "iters": iters,
            "seconds": round(seconds, 6), "flops_per_s": flops, "tflops": round(flops / 1e12, 3)}


# --- model ---------------------------------------------------------------------------------------


BENCH_VOCAB = 1600  # WordPiece size giving ~1.2 tokens per word on the workload, like a real BPE vocab
TOKENIZER_SEED = 7919  # workload seed of the tokenizer's training text (never a benchmark seed)


def bench_tokenizer(vocab_size: int = BENCH_VOCAB):
    """The demo tokenizer's recipe (WordPiece, our special tokens first) trained on the demo corpus
    plus workload-like text, with a vocabulary small enough that rarer words split.

    Why not the demo tokenizer itself: it was trained on other words and cuts this workload into
    ~2.3 tokens per word, twice a real English BPE (~1.2), which would double every sequence and
    the windows of the long rows. With this one the seed's 230 rows render to about the seed's
    250 sequences / 147k tokens at a 2,048-token window.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from vela2.config import SpecialTokens
    from vela2.train.demo_model import corpus

    special = SpecialTokens()
    tok = Tokenizer(models.WordPiece(unk_token=special.unk, max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=True, clean_text=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special.all(),
                                        initial_alphabet=[chr(c) for c in range(32, 127)], show_progress=False)
    texts = corpus() + [r["text"] for r in make_workload(seed=TOKENIZER_SEED)]
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def build_model(args: argparse.Namespace, device: torch.device):
    """The 9B-shaped (or tiny) scorer with seeded random weights, built on `device`."""
    from vela2.model.modeling import Vela2Model
    from vela2.train.demo_model import demo_calibration, demo_config, demo_tokenizer

    tok = bench_tokenizer() if args.tokenizer == "bench" else demo_tokenizer()
    config = demo_config(
        name="vela2-bench", vocab_size=tok.get_vocab_size(), hidden_size=args.hidden,
        intermediate_size=args.intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(4096, 2 * args.window),
    )
    # The release window and overlap (the demo config shrinks both for its tiny model).
    config = dataclasses.replace(config, max_window_tokens=args.window, window_overlap_words=64,
                                 window_block_reserve_tokens=0)  # 0: an eighth of the window
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    return Vela2Model.random(config, tok, demo_calibration(), device=device, dtype=dtype, seed=0)


def count_params(model) -> dict[str, int]:
    """Backbone parameters with and without the embeddings, and the heads'."""
    backbone: nn.Module = model.backbone
    emb = {id(m.weight) for m in backbone.modules() if isinstance(m, nn.Embedding)}
    total = sum(p.numel() for p in backbone.parameters())
    embedding = sum(p.numel() for p in backbone.parameters() if id(p) in emb)
    heads = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("backbone."))
    return {"backbone": total, "embedding": embedding, "non_embedding": total - embedding, "heads": heads}


# --- arms ----------------------------------------------------------------------------------------


def fixed_batches(n: int, size: int) -> list[list[int]]:
    """Consecutive batches of `size` indices in arrival order (the last may be shorter)."""
    return [list(range(k, min(k + size, n))) for k in range(0, n, size)]


def batch_padded(lengths: list[int], batch: list[int], row_tokens: int | None = None, attn: str = "sdpa") -> int:
    """Tokens one padded forward computes, as pipeline.collate lays the batch out: rows x longest row
    (a row is one sequence, or with `row_tokens` the sequences pipeline.plan_rows puts together).
    Under flex, rows are at least row_tokens long, rounded up to whole 128-token tiles (Vela2Model.encode).
    """
    from vela2.model.attention import padded_length
    from vela2.text.packing import plan_rows

    sub = [lengths[i] for i in batch]
    rows = [[k] for k in range(len(sub))] if row_tokens is None else plan_rows(sub, row_tokens)
    longest = max(sum(sub[k] for k in row) for row in rows)
    if attn == "flex":
        longest = padded_length(max(longest, row_tokens or 0))
    return len(rows) * longest


def padded_cost(lengths: list[int], batches: list[list[int]], row_tokens: int | None = None,
                attn: str = "sdpa") -> int:
    """Tokens the padded forwards of all batches compute."""
    return sum(batch_padded(lengths, b, row_tokens, attn) for b in batches)


def run_ahead(model, sequences: list, batches: list[list[int]], precision: str,
              row_tokens: int | None = None) -> None:
    """`batches` (indices into `sequences`) through vela2.scoring.pipeline.run_ahead: one batch in flight, as the
    worker's device loop runs them."""
    from vela2.scoring import pipeline

    for _ in pipeline.run_ahead(model, ([sequences[i] for i in b] for b in batches), precision, row_tokens):
        pass


def time_batches(model, sequences: list, batches: list[list[int]], precision: str,
                 warmup_batches: int = 0, row_tokens: int | None = None) -> dict[str, Any]:
    """Run `batches` once as a warm-up (all, or the first `warmup_batches`), then once timed, each
    pass through `run_ahead` (one batch in flight, as in the worker).

    Also reports the warm-up's seconds and the kernels torch.compile built in each pass (flex
    attention compiles per new shape, in the warm-up; a compile in the timed pass is a bug).
    """
    from vela2.model.attention import compile_stats

    device = model.device
    warm = batches if warmup_batches <= 0 else batches[:warmup_batches]
    graphs0 = compile_stats()["unique_graphs"]
    _sync(device)
    t0 = time.perf_counter()
    run_ahead(model, sequences, warm, precision, row_tokens)
    _sync(device)
    warmup_s = time.perf_counter() - t0
    graphs1 = compile_stats()["unique_graphs"]
    _reset_peak(device)
    _sync(device)
    t0 = time.perf_counter()
    run_ahead(model, sequences, batches, precision, row_tokens)
    _sync(device)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_memory_gib": _peak_gib(device), "warmup_seconds": warmup_s,
            "warmup_compiles": graphs1 - graphs0, "timed_compiles": compile_stats()["unique_graphs"] - graphs1,
            "compile_seconds_est": max(0.0, warmup_s - seconds) if len(warm) == len(batches) else None}


def arm_stats(name: str, lengths: list[int], batches: list[list[int]], timing: dict[str, Any],
              non_embedding: int, peak_flops: float, row_tokens: int | None = None,
              attn: str = "sdpa") -> dict[str, Any]:
    """Tokens, padding, throughput and MFU of one timed arm."""
    real = sum(lengths[i] for b in batches for i in b)
    per_batch = [batch_padded(lengths, b, row_tokens, attn) for b in batches]
    padded = sum(per_batch)
    s = timing["seconds"]
    return {
        "arm": name,
        "attention": attn,
        "row_tokens": row_tokens,
        "sequences": sum(len(b) for b in batches),
        "batches": len(batches),
        "max_batch_padded_tokens": max(per_batch),
        "real_tokens": real,
        "padded_tokens": padded,
        "padding_fraction": round(1.0 - real / padded, 4),
        "seconds": round(s, 4),
        "real_tokens_per_s": round(real / s, 1),
        "padded_tokens_per_s": round(padded / s, 1),
        "mfu_real_tokens": round(2.0 * non_embedding * real / s / peak_flops, 4),
        "mfu_padded_tokens": round(2.0 * non_embedding * padded / s / peak_flops, 4),
        "peak_memory_gib": timing["peak_memory_gib"],
        "warmup_seconds": None if (w := timing.get("warmup_seconds")) is None else round(w, 4),
        "warmup_compiles": timing.get("warmup_compiles"),
        "timed_compiles": timing.get("timed_compiles"),
        "compile_seconds_est": None if (c := timing.get("compile_seconds_est")) is None else round(c, 3),
    }


def prepare_all(model, rows: list[dict]) -> tuple[list, float]:
    """Validate and render every row (raises on a bad one: the workload must be valid)."""
    from vela2.scoring.pipeline import prepare

    t0 = time.perf_counter()
    preps = [prepare(model, r) for r in rows]
    return preps, time.perf_counter() - t0


def _meets(measured: dict[str, Any]) -> dict[str, bool | None]:
    out: dict[str, bool | None] = {}
    for key, (kind, bound) in TARGETS.items():
        v = measured.get(key)
        out[key] = None if v is None else (v >= bound if kind == "min" else v <= bound)
    return out


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """The whole benchmark; returns the JSON document (also written to --out)."""
    import transformers

    import vela2
    import vela2.model.attention
    import vela2.model.fused
    from vela2.text.packing import pack

    device = torch.device(args.device)
    arms = set(args.arms.split(","))
    vela2.model.attention.COMPILE_DYNAMIC = False if args.flex_compile == "static" else None
    if args.cuda_graph_tokens is None:
        args.cuda_graph_tokens = vela2.model.fused.GRAPH_MAX_TOKENS
    product_graph_tokens, vela2.model.fused.GRAPH_MAX_TOKENS = vela2.model.fused.GRAPH_MAX_TOKENS, 0  # graph_arms only
    t_start = time.perf_counter()
    rows = make_workload(seed=args.seed, copies=args.copies)
    if args.max_rows:
        rows = rows[: args.max_rows]
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32  # the peak in the backbone's dtype
    peak = matmul_peak(device, args.peak_n or (8192 if device.type == "cuda" else 512), dtype)
    log.info("matmul peak %.1f TFLOP/s", peak["tflops"])
    # the same matmul 150 times: a GPU at its power cap lowers its clock (H200: 1,980 -> ~1,440 MHz at
    # 700 W), so a long forward's GEMMs cannot hold the cold burst's rate; reported beside it, MFU
    # stays against the burst peak (the targets' definition)
    sustained = matmul_peak(device, peak["n"], dtype, iters=SUSTAINED_ITERS) if device.type == "cuda" else None

    t0 = time.perf_counter()
    model = build_model(args, device)
    _sync(device)
    build_s = time.perf_counter() - t0
    params = count_params(model)
    log.info("model built in %.1f s: %.3fB non-embedding parameters", build_s, params["non_embedding"] / 1e9)

    preps, render_s = prepare_all(model, rows)
    sequences = [s for p in preps for s in p.sequences]  # arrival order, windows in order
    lengths = [s.num_tokens for s in sequences]
    n_questions = sum(len(r["questions"]) for r in rows)
    log.info("%d rows -> %d sequences, %d tokens (rendered in %.2f s)", len(rows), len(sequences),
             sum(lengths), render_s)

    def timed(name: str, batches: list[list[int]], row_tokens: int | None = None, attn: str = "sdpa",
              precision: str = args.precision) -> dict[str, Any]:
        model.set_attention(attn)
        log.info("arm %s (%s attention, %s): %d batches", name, attn, precision, len(batches))
        timing = time_batches(model, sequences, batches, precision, args.warmup_batches, row_tokens)
        st = arm_stats(name, lengths, batches, timing, params["non_embedding"], peak["flops_per_s"], row_tokens,
                       attn)
        st["precision"] = precision
        log.info("arm %s: %.1f real tokens/s, MFU %.3f, padding %.3f, %.2f s; warm-up %.1f s, %d kernels compiled",
                 name, st["real_tokens_per_s"], st["mfu_real_tokens"], st["padding_fraction"], st["seconds"],
                 st["warmup_seconds"], st["warmup_compiles"])
        return st

    results: dict[str, Any] = {}
    headline = args.row_modes[0]
    head_attn = args.attns[0]
    by_attention: dict[str, dict[str, Any]] = {}
    if "ours" in arms:
        for attn in args.attns:
            for k, mode in enumerate(args.row_modes):
                if attn != head_attn and mode is None:
                    log.info("skipping ours without --row-tokens under %s: only packed rows run every backend", attn)
                    continue
                name = ("ours" if k == 0 else f"ours_rows{mode or 0}") + ("" if attn == head_attn else f"_{attn}")
                results[name] = timed(name, pack(lengths, args.max_batch_tokens, mode), mode, attn)
                by_attention.setdefault(attn, {})[name] = {key: results[name][key] for key in (
                    "row_tokens", "mfu_real_tokens", "mfu_padded_tokens", "padding_fraction", "real_tokens_per_s",
                    "seconds", "peak_memory_gib", "warmup_seconds", "warmup_compiles", "timed_compiles",
                    "compile_seconds_est")}
    if "fp8" in arms:
        results["ours_fp8"] = timed("ours_fp8", pack(lengths, args.max_batch_tokens, headline), headline, head_attn,
                                    precision="fp8")
    if "unfused" in arms:
        vela2.model.fused.ENABLED = False
        try:
            results["unfused"] = timed("unfused", pack(lengths, args.max_batch_tokens, headline), headline, head_attn)
        finally:
            vela2.model.fused.ENABLED = True
    plans: dict[str, Callable[[], list[list[int]]]] = {
        "batch1": lambda: [[i] for i in range(len(sequences))],
        "fixed32": lambda: fixed_batches(len(sequences), FIXED_BATCH),
    }
    for name, plan in plans.items():
        if name in arms:
            results[name] = timed(name, plan())  # sdpa: unpacked rows of many lengths
    model.set_attention(head_attn)  # bundling and engine run the headline backend

    bundling: dict[str, Any] = {}
    if "bundling" in arms:
        bundling = bundling_arm(model, rows, args, params["non_embedding"], peak["flops_per_s"])
        results["bundled"], results["single"] = bundling.pop("arms")

    latency: dict[str, Any] = {}
    if "latency" in arms:
        # sdpa, the row its own length (a worker's default; batch1's path), then the headline packing
        # (under flex a lone row is padded to row_tokens), then sdpa with CUDA-graph replay
        configs = [(p, "sdpa", None) for p in [args.precision, *(["fp8"] if "fp8" in arms else [])]]
        if head_attn != "sdpa" or headline:
            configs.append((args.precision, head_attn, headline))
        for precision, attn, row_tokens in configs:
            model.set_attention(attn)
            latency[f"{precision}_{attn}" + (f"_rows{row_tokens}" if row_tokens else "")] = latency_arm(
                model, rows, precision, row_tokens)
        model.set_attention(head_attn)
        results["latency"] = latency

    engine_rows: dict[str, Any] = {}
    if "engine" in arms:
        _reset_peak(device)
        _sync(device)
        t0 = time.perf_counter()
        res = vela2.predict(model, rows, precision=args.precision, max_batch_tokens=args.max_batch_tokens,
                            row_tokens=headline)
        _sync(device)
        s = time.perf_counter() - t0
        errors = [r for r in res if r.status.value != "ok"]
        for r in errors[:5]:
            log.warning("row %s failed: %s", r.id, r.error)
        engine_rows = {"arm": "engine_predict", "rows": len(rows), "questions": n_questions,
                       "seconds": round(s, 4), "rows_per_s": round(len(rows) / s, 2),
                       "questions_per_s": round(n_questions / s, 2), "errors": len(errors),
                       "peak_memory_gib": _peak_gib(device)}
        results["engine_predict"] = engine_rows

    if args.cuda_graph_tokens:  # last: a CUDA-graph failure is recorded, and every other arm is already in
        graph_arms(model, results, latency, rows, sequences, args,
                   lambda: timed("batch1_graphs", plans["batch1"]()))

    engine: dict[str, Any] = {
        "matmul_peak_tflops": peak["tflops"],
        "matmul_sustained_tflops": sustained["tflops"] if sustained else None,
        "non_embedding_params": params["non_embedding"],
        "max_batch_tokens": args.max_batch_tokens,
        "row_tokens": headline,
        "attention": head_attn,
        "by_attention": by_attention,
        "rows_per_s_engine": engine_rows.get("rows_per_s"),
        "render_rows_per_s": round(len(rows) / render_s, 1),
        "render_tokens_per_s": round(sum(lengths) / render_s, 1),
    }
    if "ours" in results:
        ours = results["ours"]
        engine.update({k: ours[k] for k in ("mfu_real_tokens", "padding_fraction", "real_tokens_per_s",
                                            "peak_memory_gib")})
        if sustained:
            engine["mfu_real_tokens_vs_sustained"] = round(
                ours["mfu_real_tokens"] * peak["flops_per_s"] / sustained["flops_per_s"], 4)
        for base in ("batch1", "fixed32"):
            if base in results:
                engine[f"ratio_vs_{base}"] = round(ours["real_tokens_per_s"] / results[base]["real_tokens_per_s"], 3)
        if "ours_fp8" in results:
            fp8_tps = results["ours_fp8"]["real_tokens_per_s"]
            engine["fp8_real_tokens_per_s"] = fp8_tps
            engine["fp8_speedup_vs_bf16"] = round(fp8_tps / ours["real_tokens_per_s"], 3)
        if "unfused" in results:
            engine["speedup_vs_unfused"] = round(ours["real_tokens_per_s"] / results["unfused"]["real_tokens_per_s"], 3)
    if "batch1" in results:  # the product's path: replayed when that arm ran
        engine["mfu_real_tokens_batch1_launched"] = results["batch1"]["mfu_real_tokens"]
        engine["mfu_real_tokens_batch1"] = results.get("batch1_graphs", {}).get(
            "mfu_real_tokens", results["batch1"]["mfu_real_tokens"])
    if latency:
        engine["latency_p50_ms"] = {p: v["p50_ms"] for p, v in latency.items() if isinstance(v, dict)}
    engine["targets"] = {k: f"{'>=' if kind == 'min' else '<='} {v}" for k, (kind, v) in TARGETS.items()}
    engine["meets_targets"] = _meets(engine)

    ws = summary(rows)
    doc = {
        "command": "python -m bench.gpu_engine " + shlex.join(argv),
        "argv": list(sys.argv),
        "gpu": {
            "device": str(device),
            "name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
        "model": {
            "layout": "qwen2", "hidden": args.hidden, "layers": args.layers, "intermediate": args.intermediate,
            "heads": args.heads, "kv_heads": args.kv_heads, "vocab": model.tokenizer.get_vocab_size(),
            "dtype": args.dtype, "precision": args.precision, "attention": args.attns,
            "fused_decoder": vela2.model.fused.supported(model.backbone) is None, "compiled": vela2.model.fused.COMPILE,
            "flex_compile": args.flex_compile,
            "max_window_tokens": model.config.max_window_tokens, "params": params,
            "build_seconds": round(build_s, 2),
        },
        "workload": {
            "seed": args.seed, "copies": args.copies, "rows": len(rows), "bundled_rows": ws["bundled_rows"],
            "questions": n_questions, "words": ws["words"], "sequences": len(sequences),
            "windowed_rows": sum(len(p.sequences) > 1 for p in preps), "real_tokens": sum(lengths),
            "longest_sequence": max(lengths), "render_seconds": round(render_s, 3),
        },
        "matmul_peak": peak,
        "matmul_sustained": sustained,
        "engine": engine,
        "bundling": bundling,
        "arms": results,
        "wall_seconds": round(time.perf_counter() - t_start, 1),
    }
    vela2.model.fused.GRAPH_MAX_TOKENS = product_graph_tokens
    return doc


def graph_arms(model, results: dict[str, Any], latency: dict[str, Any], rows: list[dict], sequences: list,
               args: argparse.Namespace, batch1: Callable[[], dict[str, Any]]) -> None:
    """batch1 and the sdpa latencies again with CUDA-graph replay (vela2.model.fused.GRAPH_MAX_TOKENS), and
    what replay changes in the outputs (`graphs_vs_plain`); an exception (a capture that fails on this
    torch) is recorded as the arm's result."""
    import vela2.model.fused

    arms = set(args.arms.split(","))
    precisions = [args.precision, *(["fp8"] if "fp8" in arms else [])]
    model.set_attention("sdpa")
    try:
        vela2.model.fused.GRAPH_MAX_TOKENS = args.cuda_graph_tokens
        if "batch1" in arms:
            results["batch1_graphs"] = batch1()
        if "latency" in arms:
            for precision in precisions:
                latency[f"{precision}_sdpa_graphs"] = latency_arm(model, rows, precision, None)
        results["graphs_vs_plain"] = {p: graphs_vs_plain(model, sequences, p, args.cuda_graph_tokens)
                                      for p in precisions}
    except Exception as e:  # the benchmark reports it and keeps the other arms
        log.exception("CUDA-graph arms failed")
        results.setdefault("batch1_graphs", {"error": f"{type(e).__name__}: {e}"})
        latency.setdefault("graphs_error", f"{type(e).__name__}: {e}")
    finally:
        vela2.model.fused.GRAPH_MAX_TOKENS = 0
        model.set_attention(args.attns[0])


def graphs_vs_plain(model, sequences: list, precision: str, graph_tokens: int, n: int = 48) -> dict[str, Any]:
    """Each of `n` sequences (spread over the lengths) alone through run_batch, replayed as a CUDA graph
    and launched plainly: the largest |logit diff| and the questions whose option argmax differs."""
    import vela2.model.fused
    from vela2.scoring.pipeline import run_batch

    by_length = sorted(sequences, key=lambda s: s.num_tokens)
    picked = [by_length[i * len(by_length) // n] for i in range(min(n, len(by_length)))]
    diff, flips, questions = 0.0, 0, 0
    for seq in picked:
        vela2.model.fused.GRAPH_MAX_TOKENS = graph_tokens
        (replayed,) = run_batch(model, [seq], precision)
        vela2.model.fused.GRAPH_MAX_TOKENS = 0
        (plain,) = run_batch(model, [seq], precision)
        for q, logits in plain.options.items():
            diff = max(diff, float(np.abs(replayed.options[q] - logits).max()))
            flips += int(replayed.options[q].argmax() != logits.argmax())
            questions += 1
        for q, logits in plain.spans.items():
            diff = max(diff, float(np.abs(replayed.spans[q] - logits).max()))
    vela2.model.fused.GRAPH_MAX_TOKENS = graph_tokens
    return {"sequences": len(picked), "option_questions": questions, "max_abs_logit_diff": diff,
            "argmax_diffs": flips}


def latency_arm(model, rows: list[dict], precision: str, row_tokens: int | None) -> dict[str, Any]:
    """Single-request latency: the fewest-token single-question row through vela2.predict alone, warm."""
    import vela2
    from vela2.scoring.pipeline import prepare

    singles = [r for r in rows if len(r["questions"]) == 1]
    tokens = [sum(s.num_tokens for s in prepare(model, r).sequences) for r in singles]
    k = min(range(len(singles)), key=tokens.__getitem__)
    row = singles[k]
    for _ in range(5):
        vela2.predict(model, [row], precision=precision, row_tokens=row_tokens)
    ms = []
    for _ in range(LATENCY_RUNS):
        t0 = time.perf_counter()
        vela2.predict(model, [row], precision=precision, row_tokens=row_tokens)  # results on the host: synced
        ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    log.info("latency %s: %s, %d tokens: p50 %.2f ms", precision, row["id"], tokens[k], ms[len(ms) // 2])
    return {"row": row["id"], "task": row["task"], "tokens": tokens[k], "runs": len(ms),
            "p50_ms": round(ms[len(ms) // 2], 3), "p90_ms": round(ms[int(len(ms) * 0.9)], 3),
            "min_ms": round(ms[0], 3)}


def bundling_arm(model, rows: list[dict], args: argparse.Namespace, non_embedding: int,
                 peak_flops: float) -> dict[str, Any]:
    """Multi-question rows bundled (one sequence per window) vs every question as its own row."""
    from vela2.text.packing import pack

    bundled_rows = [r for r in rows if is_bundle(r)]
    if not bundled_rows:
        return {"rows": 0, "questions": 0, "arms": (None, None)}
    out: dict[str, Any] = {"rows": len(bundled_rows)}
    stats = []
    for name, subset in (("bundled", bundled_rows), ("single", split_bundles(bundled_rows))):
        preps, render_s = prepare_all(model, subset)
        seqs = [s for p in preps for s in p.sequences]
        lengths = [s.num_tokens for s in seqs]
        mode = args.row_modes[0]
        batches = pack(lengths, args.max_batch_tokens, mode)
        timing = time_batches(model, seqs, batches, args.precision, args.warmup_batches, mode)
        st = arm_stats(name, lengths, batches, timing, non_embedding, peak_flops, mode, args.attns[0])
        questions = sum(len(p.row.questions) for p in preps)
        st.update({"rows": len(subset), "questions": questions, "render_seconds": round(render_s, 4),
                   "questions_per_s": round(questions / timing["seconds"], 2)})
        stats.append(st)
        log.info("bundling %s: %d questions in %.2f s (%d tokens)", name, questions, st["seconds"],
                 st["real_tokens"])
    bundled, single = stats
    out.update({
        "questions": bundled["questions"],
        "bundled_questions_per_s": bundled["questions_per_s"],
        "single_questions_per_s": single["questions_per_s"],
        "ratio_vs_single": round(bundled["questions_per_s"] / single["questions_per_s"], 3),
        "bundled_real_tokens": bundled["real_tokens"],
        "single_real_tokens": single["real_tokens"],
        "token_ratio_single_vs_bundled": round(single["real_tokens"] / bundled["real_tokens"], 3),
        "arms": (bundled, single),
    })
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the benchmark, write the JSON, print the headline figures."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    doc = run(args, argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({"engine": doc["engine"], "bundling": doc["bundling"]}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
