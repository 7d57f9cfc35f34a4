"""bench.gpu_engine end to end on this CPU (a tiny shape, through its own process)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # bench/ is not an installed package; run from the repository
    sys.path.insert(0, str(ROOT))


# --- bench.gpu_engine ----------------------------------------------------------------------------


def test_gpu_engine_runs_end_to_end_on_cpu(tmp_path):
    from bench import gpu_engine as ge

    out = tmp_path / "gpu.json"
    argv = ["--device", "cpu", "--layers", "1", "--hidden", "64", "--window", "256", "--max-rows", "12",
            "--max-batch-tokens", "2048", "--dtype", "fp32", "--precision", "fp32", "--warmup-batches", "1",
            "--row-tokens", "0,512", "--cuda-graph-tokens", "4096", "--out", str(out)]
    assert ge.main(argv) == 0
    doc = json.loads(out.read_text())
    assert {"command", "gpu", "model", "workload", "matmul_peak", "engine", "bundling", "arms"} <= set(doc)
    assert doc["command"].startswith("python -m bench.gpu_engine --device cpu")
    assert {"name", "torch", "transformers"} <= set(doc["gpu"])
    eng = doc["engine"]
    for key in ("mfu_real_tokens", "ratio_vs_batch1", "ratio_vs_fixed32", "padding_fraction",
                "real_tokens_per_s", "rows_per_s_engine", "matmul_peak_tflops", "targets", "meets_targets"):
        assert key in eng, key
    assert set(eng["targets"]) == {"mfu_real_tokens", "mfu_real_tokens_batch1", "fp8_speedup_vs_bf16",
                                   "ratio_vs_batch1", "padding_fraction"}
    assert {"fp8_speedup_vs_bf16", "speedup_vs_unfused", "mfu_real_tokens_batch1", "latency_p50_ms"} <= set(eng)
    # CPU: no CUDA graphs, the *_graphs arms run the same eager path under their own names
    assert set(eng["latency_p50_ms"]) == {"fp32_sdpa", "fp8_sdpa", "fp32_sdpa_graphs", "fp8_sdpa_graphs"}
    arms = doc["arms"]
    assert {"ours", "ours_rows512", "ours_fp8", "unfused", "batch1", "batch1_graphs", "fixed32", "bundled",
            "single", "engine_predict", "latency", "graphs_vs_plain"} <= set(arms)
    # CPU: the same eager path twice, so nothing may differ
    assert {p: (v["max_abs_logit_diff"], v["argmax_diffs"]) for p, v in arms["graphs_vs_plain"].items()} == {
        "fp32": (0.0, 0), "fp8": (0.0, 0)}
    assert arms["graphs_vs_plain"]["fp32"]["option_questions"] > 0
    assert arms["ours_fp8"]["precision"] == "fp8" and arms["unfused"]["precision"] == "fp32"
    real = {arms[a]["real_tokens"] for a in ("ours", "ours_rows512", "ours_fp8", "unfused", "batch1", "fixed32")}
    assert real == {doc["workload"]["real_tokens"]}  # every arm runs the same sequences
    assert arms["batch1"]["padding_fraction"] == 0.0
    assert arms["ours"]["padding_fraction"] <= arms["fixed32"]["padding_fraction"]
    assert arms["engine_predict"]["errors"] == 0 and arms["engine_predict"]["rows"] == 12
    assert doc["workload"]["windowed_rows"] >= 1  # a 256-token window cuts the longer rows
    b = doc["bundling"]
    assert b["questions"] > b["rows"] > 0 and b["ratio_vs_single"] > 0
    assert arms["single"]["questions"] == arms["bundled"]["questions"] == b["questions"]
    assert b["single_real_tokens"] > b["bundled_real_tokens"]  # the shared text is rendered once


# --- bench.gpu_profile -----------------------------------------------------------------------------


