"""Checkpoint directories: config.json, model.safetensors (or shards + index), tokenizer.json,
calibration.json. Release weights keep backbone Linear / Conv1D weights in bf16, everything else
(embeddings, norms, biases, heads) in fp32. Loading never touches the network.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer
from torch import nn

from vela2.config import Vela2Config
from vela2.errors import CheckpointError
from vela2.model import loading, manifest
from vela2.model.calibration import Calibration
from vela2.model.manifest import INDEX, WEIGHTS
from vela2.model.modeling import Vela2Model, build_backbone

log = logging.getLogger(__name__)



def digest(path: str | Path, *, random_weights: bool = False) -> str:
    """The checkpoint's identity (32 hex digits): blake2b over the bytes of its config, tokenizer,
    calibration and weight files, in name order, hashed from every byte now (vela2.model.manifest;
    a start takes it from the checkpoint's manifest instead: `manifest.identify`). A re-calibrated or
    re-trained checkpoint gets a new digest even under the same model name; every stored answer
    carries it (RowResult.served_by). With `random_weights` (benchmarks) the weights are not read
    and the digest says so."""
    return manifest.full_digest(path, random_weights=random_weights)


def _bf16_weight_names(model: Vela2Model) -> set[str]:
    """Names of backbone matmul weights (nn.Linear and GPT-2 style Conv1D) stored in bf16."""
    names = set()
    for mod_name, mod in model.backbone.named_modules():
        if isinstance(mod, nn.Linear) or type(mod).__name__ == "Conv1D":
            names.add(f"backbone.{mod_name}.weight")
    return names


def release_state_dict(model: Vela2Model) -> dict[str, torch.Tensor]:
    """The state dict as stored: backbone matmul weights bf16, the rest fp32, contiguous, on CPU."""
    bf16 = _bf16_weight_names(model)
    out = {}
    for name, t in model.state_dict().items():
        dtype = torch.bfloat16 if name in bf16 else torch.float32
        out[name] = t.detach().to("cpu", dtype).contiguous()
    return out


def save(model: Vela2Model, path: str | Path, *, shard_max_bytes: int | None = None) -> None:
    """Write a checkpoint directory; with `shard_max_bytes`, weights go to shards plus an index."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.config.write(path)
    model.tokenizer.save(str(path / "tokenizer.json"))
    model.calibration.write(path)
    state = release_state_dict(model)
    for stale in [path / WEIGHTS, path / INDEX, *path.glob("model-*-of-*.safetensors")]:
        stale.unlink(missing_ok=True)
    if shard_max_bytes is None:
        save_file(state, str(path / WEIGHTS), metadata={"format": "pt"})
        finish(path)
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > shard_max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    total = sum(t.numel() * t.element_size() for t in state.values())
    (path / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    finish(path)


def finish(path: Path) -> None:
    """The last step of every checkpoint writer: its manifest (the identity, hashed now so that a
    start need not) and its files made world-readable."""
    manifest.write(path)
    make_readable(path)


def make_readable(path: Path) -> None:
    """Every file of the checkpoint directory `path` world-readable (0644): a serving container
    usually runs as another user than the one who wrote it, and safetensors writes its files 0600."""
    for p in path.iterdir():
        if p.is_file():
            os.chmod(p, 0o644)


def weight_files(path: Path, missing_hint: str = "") -> dict[str, Path]:
    """tensor name -> file holding it, from the shard index or the single safetensors file (a Vela 2
    checkpoint, or a transformers directory being imported); `missing_hint` ends the error's message.
    Every file must be a regular file of `path` itself (vela2.model.manifest.inside)."""
    if (path / INDEX).is_file():  # every shard confined to the directory, before any is opened
        return {name: path / fname for name, fname in manifest.index_map(path).items()}
    if (path / WEIGHTS).is_file():
        weights = manifest.inside(path, WEIGHTS)
        with safe_open(str(weights), framework="pt") as f:
            return dict.fromkeys(f.keys(), weights)
    raise CheckpointError(f"{path} holds neither {WEIGHTS} nor {INDEX}{missing_hint}")


def load(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
         *, random_weights: bool = False, checkpoint_digest: str | None = None,
         progress: Callable[[int, int], None] | None = None) -> Vela2Model:
    """Load a checkpoint directory onto `device`.

    `dtype` is the dtype the backbone is held in: float32 (runs precision fp32 and bf16 autocast,
    from the stored bf16 matmul weights upcast exactly) or bfloat16 (bf16 only, half the memory).
    Heads are always fp32. The model is built on the meta device, so a 9B export needs no
    random initialisation and no second copy in host memory.
    `random_weights=True` (benchmarks only) ignores stored weights and builds seeded random ones
    on the device: a config + tokenizer directory is then enough to serve a 9B-shaped model.
    `checkpoint_digest`: the checkpoint's `digest` when the caller has it already (else taken from
    its manifest, checked cheaply, or hashed: vela2.model.manifest.identify).
    `progress(bytes read, bytes in all)` hears the weights' reading (vela2.model.loading.read_into).
    """
    path = Path(path)
    manifest.inside(path, "config.json")
    config = Vela2Config.read(path)
    tok_path = manifest.inside(path, "tokenizer.json")
    if not tok_path.is_file():
        raise CheckpointError(f"{tok_path} does not exist")
    tokenizer = Tokenizer.from_file(str(tok_path))
    calibration = Calibration.read(path)
    if random_weights:
        log.warning("%s: serving RANDOM weights (benchmark mode), not the stored ones", config.name)
        model = Vela2Model.random(config, tokenizer, calibration, device=device, dtype=dtype)
        model.digest = checkpoint_digest or manifest.identify(path, random_weights=True).digest
        return model
    with torch.device("meta"):
        model = Vela2Model(config, tokenizer, calibration, build_backbone(config))
    # the backbone in its serving dtype before memory is given to it: one copy, never a float32
    # model cast afterwards; heads stay float32
    model.backbone.to(dtype)
    expected = set(model.state_dict())
    files = weight_files(path)
    missing, unexpected = expected - set(files), set(files) - expected
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint tensors do not match the config: missing {sorted(missing)[:5]} "
            f"({len(missing)}), unexpected {sorted(unexpected)[:5]} ({len(unexpected)})"
        )
    loading.plan(files, dict(model.state_dict()))  # every stored shape checked before memory is allocated
    model.to_empty(device=device)
    t0 = time.monotonic()
    nbytes = loading.read_into(dict(model.state_dict(keep_vars=True)), files, progress=progress)
    seconds = time.monotonic() - t0
    _rebuild_rotary(model.backbone, device)
    model.backbone.to(dtype)  # the rebuilt rotary buffers, as the backbone holds them
    model.eval()
    model.digest = checkpoint_digest or manifest.identify(path).digest
    log.info("loaded %s from %s on %s (%s backbone; %.2f GB of weights in %.2f s, %.2f GB/s), digest %s",
             config.name, path, device, dtype, nbytes / 1e9, seconds, nbytes / 1e9 / max(seconds, 1e-9), model.digest)
    return model


def serving_dtype(precision: str) -> torch.dtype:
    """The backbone dtype every serving path (CLI, worker, parity) loads for a precision:
    bf16 holds the backbone in bfloat16 (half the memory, no per-call weight casts), fp32 in float32;
    fp8 holds it in bfloat16 too (the fp8 copies are quantised from it at the first fp8 batch).
    """
    return torch.float32 if precision == "fp32" else torch.bfloat16


def _rebuild_rotary(backbone: nn.Module, device) -> None:
    """Recompute non-persistent buffers (rotary inv_freq) that meta construction left empty."""
    for name, mod in list(backbone.named_modules()):
        if hasattr(mod, "inv_freq") and hasattr(mod, "config"):
            fresh = type(mod)(config=mod.config).to(device)
            parent = backbone.get_submodule(name.rsplit(".", 1)[0]) if "." in name else backbone
            setattr(parent, name.rsplit(".", 1)[-1], fresh)
    leftover = [n for n, b in backbone.named_buffers() if b.is_meta]
    if leftover:
        raise CheckpointError(f"buffers left uninitialised after loading: {leftover[:5]}")
