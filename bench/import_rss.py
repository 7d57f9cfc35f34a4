"""Peak memory of `vela2 import` on a generated transformers decoder directory.

Generates a random qwen2 / llama CausalLM of about `--params-m` million parameters (bf16, sharded
safetensors, a small BPE tokenizer trained offline), then runs the import in a child process and
reads its peak RSS (VmHWM of the child's own address space). A baseline child that only imports the same modules
gives the interpreter + torch share, so `import_peak_mb - baseline_mb` is what the import itself
held. Writes a JSON report (`--out`).

    python -m bench.import_rss --params-m 500 --out bench/results/import-rss.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_BASELINE = "import torch, safetensors, tokenizers, transformers, vela2.train.importing, vela2.cli"


def make_hf_dir(out: Path, model_type: str = "qwen2", *, hidden: int = 64, layers: int = 2, vocab: int = 640,
                intermediate: int | None = None, max_shard_size: str = "100KB", tie: bool = False,
                seed: int = 0) -> Path:
    """Write a random transformers CausalLM directory (bf16 safetensors, sharded at `max_shard_size`)
    with a BPE tokenizer trained offline on the demo corpus; no download."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM

    from vela2.train.demo_model import corpus

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(500), trainers.BpeTrainer(vocab_size=min(vocab, 600),
                                                             special_tokens=["<unk>", "<s>"]))
    heads = max(1, hidden // 64) * 2
    cfg = AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=hidden,
                               intermediate_size=intermediate or 2 * hidden, num_hidden_layers=layers,
                               num_attention_heads=heads, num_key_value_heads=heads // 2,
                               max_position_embeddings=1024, tie_word_embeddings=tie)
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out, max_shard_size=max_shard_size)
    tok.save(str(out / "tokenizer.json"))
    return out


# Printed by each measured child: VmHWM is the peak RSS of the process's own address space (since its
# exec), unlike getrusage's ru_maxrss, which a child inherits from the parent it was forked from.
_PRINT_PEAK = "; print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"


def _child_peak_mb(code: str, *args: str) -> float:
    """Peak RSS (MB) of a fresh interpreter running `code` (then printing its VmHWM in kB)."""
    proc = subprocess.run([sys.executable, "-c", code + _PRINT_PEAK, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"measured child exited with {proc.returncode}: {proc.stderr[-2000:]}")
    return int(proc.stdout.split()[-1]) / 1024


def measure(params_m: float, model_type: str = "qwen2", shard_max_mb: int = 64, vocab: int = 32_000) -> dict[str, Any]:
    """Generate a model of about `params_m` million parameters (hidden 1024, `vocab` tokens) and
    measure the import's peak RSS."""
    hidden = 1024
    per_layer = 4 * hidden * hidden + 3 * hidden * 2816  # attention (upper bound) + MLP
    layers = max(1, round((params_m * 1e6 - 2 * vocab * hidden) / per_layer))
    with tempfile.TemporaryDirectory() as tmp:
        hf = make_hf_dir(Path(tmp) / "hf", model_type, hidden=hidden, layers=layers, vocab=vocab,
                         intermediate=2816, max_shard_size="200MB")
        weights_mb = sum(p.stat().st_size for p in hf.glob("*.safetensors")) / 2**20
        baseline = _child_peak_mb(_BASELINE)
        peak = _child_peak_mb(f"{_BASELINE}; import sys; from vela2.train.importing import import_hf; "
                              f"import_hf(sys.argv[1], sys.argv[2], shard_max_bytes={shard_max_mb << 20})",
                              str(hf), str(Path(tmp) / "out"))
        out_mb = sum(p.stat().st_size for p in (Path(tmp) / "out").glob("*.safetensors")) / 2**20
    return {"model_type": model_type, "layers": layers, "hidden": hidden, "vocab": vocab,
            "hf_weights_mb": round(weights_mb, 1), "checkpoint_weights_mb": round(out_mb, 1),
            "shard_max_mb": shard_max_mb, "baseline_mb": round(baseline, 1), "import_peak_mb": round(peak, 1),
            "import_over_baseline_mb": round(peak - baseline, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params-m", type=float, default=300.0, help="model size in millions of parameters")
    p.add_argument("--model-type", default="qwen2")
    p.add_argument("--shard-max-mb", type=int, default=64)
    p.add_argument("--vocab", type=int, default=32_000)
    p.add_argument("--out")
    args = p.parse_args(argv)
    report = measure(args.params_m, args.model_type, args.shard_max_mb, args.vocab)
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
