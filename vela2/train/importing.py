"""`vela2 import`: a local transformers decoder directory becomes a Vela 2 checkpoint.

The directory holds config.json (a supported `model_type`), safetensors weights (one file or shards
with `model.safetensors.index.json`) and tokenizer.json (a fast tokenizer). The import:
- adds the special tokens of `SpecialTokens` to the tokenizer (tokens it already has keep their ids) and
  writes it with truncation and padding off (the renderer windows and pads by itself);
- refuses a tokenizer with ids past the model's embedding (vocab_size), except the special tokens the
  import adds: those ids would have no trained embedding row;
- streams the weights tensor by tensor: renamed `model.*` -> `backbone.*` (the causal LM head is
  dropped: the scorer reads hidden states), cast by the release rule (backbone Linear weights bf16,
  the rest fp32), the embedding resized to the new vocabulary with new rows = the mean embedding;
  output shards are flushed at `shard_max_bytes`, so memory holds at most one output shard plus the
  tensor being converted, never a second copy of the model;
- initialises the heads (seeded) and writes the default calibration.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

from vela2.config import LIMITS, HeadsConfig, SpecialTokens, Vela2Config, check_backbone_sizes
from vela2.errors import CheckpointError
from vela2.model.calibration import Calibration
from vela2.model.checkpoint import INDEX, WEIGHTS, _bf16_weight_names, finish, weight_files
from vela2.model.manifest import inside
from vela2.model.modeling import OptionHead, SpanHead, Vela2Model, build_backbone
from vela2.progress import Progress

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
DEFAULT_WINDOW_TOKENS = 2048
SHARD_MAX_BYTES = 2 << 30  # bytes of one output shard (and the most one holds in memory)
SPAN_DIM_MAX = 256  # width of the span head's bilinear space: min(hidden size, this)
# config.json keys of the transformers export that describe the file, not the network
_DROPPED_KEYS = ("architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype", "auto_map",
                 "quantization_config")
_OFFSET_PROBE = "Offsets map tokens back to characters: alice@example.com, +1-555-0100."


def read_hf_config(hf_dir: Path) -> dict:
    """The transformers config.json of `hf_dir`; CheckpointError when absent or of an unsupported type."""
    path = inside(hf_dir, "config.json")
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist: not a transformers model directory")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"{path} is not readable JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path} must hold a JSON object; got {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:  # the docs' list of supported backbones is this one
        raise CheckpointError(f"{path}: model_type {model_type!r} is not supported; supported: "
                              f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers"):
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CheckpointError(f"{path}: {key} must be a positive integer; got {value!r}")
    check_backbone_sizes(cfg, str(path))
    return cfg


def read_tokenizer(hf_dir: Path) -> Tokenizer:
    """The fast tokenizer of `hf_dir`, checked to give character offsets."""
    path = inside(hf_dir, "tokenizer.json")
    if not path.is_file():
        others = sorted(p.name for p in hf_dir.glob("tokenizer*")) or ["none"]
        raise CheckpointError(f"{path} does not exist (tokenizer files found: {', '.join(others)}); a fast "
                              "tokenizer is needed: AutoTokenizer.from_pretrained(...).save_pretrained(...) writes it")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises plain Exception for a corrupt file
        raise CheckpointError(f"{path} is not a readable fast tokenizer: {str(e)[:300]}") from None
    check_offsets(tok)
    return tok


def check_offsets(tok: Tokenizer) -> None:
    """CheckpointError unless `tok` maps its tokens to character offsets inside the text (rendering
    needs them to map words to tokens and spans back to characters)."""
    enc = tok.encode(_OFFSET_PROBE, add_special_tokens=False)
    offsets = list(enc.offsets)
    covered = sum(e - s for s, e in offsets)
    if not offsets or covered == 0 or any(not 0 <= s <= e <= len(_OFFSET_PROBE) for s, e in offsets):
        raise CheckpointError(f"the tokenizer gives no usable character offsets (a probe of {len(_OFFSET_PROBE)} "
                              f"characters got {len(offsets)} tokens covering {covered} characters)")


def _ids_past_embedding(tok: Tokenizer, vocab_size: int, allowed: set[str]) -> list[int]:
    """Ids of `tok` at or past `vocab_size` (no row in the model's embedding) whose token is not in `allowed`."""
    return sorted(i for t, i in tok.get_vocab(with_added_tokens=True).items() if i >= vocab_size and t not in allowed)


def default_name(hf_dir: Path) -> str:
    """The model name of an import without --name: the name of the resolved directory (so `.` works)."""
    return hf_dir.resolve().name


def check_name(name: str) -> None:
    """CheckpointError unless `name` can name a model (requests name it; its queues and keys carry it)."""
    if not name.strip():
        raise CheckpointError(f"the model name {name!r} is empty; pass --name")
    if len(name) > LIMITS.max_id_chars:
        raise CheckpointError(f"the model name has {len(name):,} characters; limit {LIMITS.max_id_chars:,} "
                              "(pass a shorter --name)")


def _target_name(name: str) -> str | None:
    """Vela 2 name of a transformers CausalLM tensor; None for the LM head (not used)."""
    if name.startswith("lm_head."):
        return None
    if name.startswith("model."):
        return "backbone." + name[len("model."):]
    raise CheckpointError(f"unexpected tensor {name!r}: a {'/'.join(SUPPORTED_MODEL_TYPES)} CausalLM export holds "
                          "model.* and lm_head.* only")


def _check_shapes_before_building(hf_dir: Path, hf_cfg: dict) -> None:
    """CheckpointError unless the weights' own headers agree with the config on the sizes that
    decide allocation (the embedding's vocab x hidden, the number of layers): read before the model is
    built or its heads allocated, so a config that lies costs nothing."""
    try:
        files = weight_files(hf_dir, " (only safetensors weights are imported)")
    except (ValueError, KeyError, TypeError, OSError, SafetensorError) as e:
        raise CheckpointError(f"the weights of {hf_dir} are not readable: {_why(e, hf_dir / WEIGHTS)}") from None
    embed = "model.embed_tokens.weight"
    if embed not in files:
        raise CheckpointError(f"the weights of {hf_dir} have no {embed}")
    try:
        with safe_open(str(files[embed]), framework="pt", device="cpu") as sf:
            shape = tuple(sf.get_slice(embed).get_shape())
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"{files[embed]}: {embed} is not readable: {_why(e, files[embed])}") from None
    want = (hf_cfg["vocab_size"], hf_cfg["hidden_size"])
    if shape != want:
        raise CheckpointError(f"{embed} is {shape[0]:,} x {shape[1]:,} in the weights; config.json says vocab_size x "
                              f"hidden_size = {want[0]:,} x {want[1]:,}" if len(shape) == 2 else
                              f"{embed} has shape {shape}; config.json says {want}")
    layers = {int(m.group(1)) for n in files if (m := re.match(r"model\.layers\.(\d+)\.", n))}
    if layers != set(range(hf_cfg["num_hidden_layers"])):
        raise CheckpointError(f"the weights hold {len(layers):,} layers; config.json says num_hidden_layers = "
                              f"{hf_cfg['num_hidden_layers']:,}")


def import_hf(hf_dir: str | Path, out: str | Path, *, name: str | None = None, window: int | None = None,
              seed: int = 0, shard_max_bytes: int = SHARD_MAX_BYTES, progress: bool | None = False) -> Path:
    """Write the Vela 2 checkpoint of a local transformers decoder directory to `out` (must be empty).

    `name` (default: the directory's name) names the model and its queues; `window` is
    max_window_tokens (default min(2048, the backbone's max_position_embeddings)); `seed`
    initialises the heads; `progress`: the tensors converted, on stderr (vela2.progress: None = a
    bar on a terminal, else lines; False = none). Returns `out`.
    """
    hf_dir, out = Path(hf_dir), Path(out)
    hf_cfg = read_hf_config(hf_dir)
    tok = read_tokenizer(hf_dir)
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"{out} is not empty; import writes a new checkpoint directory")
    name = default_name(hf_dir) if name is None else name
    check_name(name)
    _check_shapes_before_building(hf_dir, hf_cfg)
    old_vocab = int(hf_cfg["vocab_size"])
    new_vocab, new_ids = _add_special_tokens(tok, old_vocab)
    config = _vela2_config(hf_cfg, name, new_vocab, window)
    with torch.device("meta"):  # names, shapes and release dtypes only: no memory
        shape_model = Vela2Model(config, tok, Calibration(), build_backbone(config))
    expected = {n: tuple(t.shape) for n, t in shape_model.state_dict().items()}
    bf16 = _bf16_weight_names(shape_model)
    del shape_model
    torch.manual_seed(seed)
    heads = _initial_heads(config)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        writer = _ShardWriter(out, shard_max_bytes)
        embedding = _Embedding(old_vocab, new_vocab, new_ids)
        _convert_weights(hf_dir, hf_cfg["model_type"], writer, expected, bf16, embedding, progress)
        for n, t in heads.items():
            writer.add(n, t)
        missing = sorted(set(expected) - writer.names)
        if missing:
            raise CheckpointError(f"the weights lack {len(missing)} tensors of the backbone, e.g. {missing[:3]}")
        writer.close()
        config.write(out)
        tok.save(str(out / "tokenizer.json"))
        Calibration().write(out)
        finish(out)  # the manifest (the checkpoint's identity) and readable files
    except BaseException:
        _remove_partial(out, created)  # a failed import leaves no half checkpoint that blocks the retry
        raise
    log.info("imported %s (%s, %d tensors) to %s", hf_dir, hf_cfg["model_type"], len(writer.names), out)
    return out


def _add_special_tokens(tok: Tokenizer, old_vocab: int) -> tuple[int, list[int]]:
    """Add the special tokens of `SpecialTokens` to `tok` (truncation and padding turned off); returns
    the new vocabulary size and the ids of the embedding rows that get the mean embedding.
    CheckpointError when `tok` has ids past the model's `old_vocab` embedding rows besides them."""
    specials = SpecialTokens()
    n_tokens = len(tok.get_vocab(with_added_tokens=True))
    beyond = _ids_past_embedding(tok, old_vocab, set(specials.all()))
    if beyond:
        raise CheckpointError(
            f"the tokenizer has {n_tokens:,} tokens; the model's vocab_size is {old_vocab:,}: {len(beyond):,} "
            f"token ids ({beyond[0]}..{beyond[-1]}) have no row in the model's embedding. Use the tokenizer "
            "saved with these weights")
    before = set(tok.get_vocab(with_added_tokens=True))
    tok.add_special_tokens(specials.all())
    tok.no_truncation()  # a tokenizer.json saved with truncation / padding on would cut or pad every
    tok.no_padding()  # text the renderer encodes
    ids = tok.get_vocab(with_added_tokens=True)
    new_vocab = max(old_vocab, max(ids.values()) + 1)
    # rows that get the mean embedding: every row past the stored embedding (only special tokens land
    # there, checked above) and the tokens the import added that landed on unused rows of an embedding
    # padded beyond the tokenizer
    new_ids = sorted({ids[t] for t in specials.all() if t not in before} | set(range(old_vocab, new_vocab)))
    return new_vocab, new_ids


def _vela2_config(hf_cfg: dict, name: str, new_vocab: int, window: int | None) -> Vela2Config:
    """The checkpoint's config: the transformers config as the backbone's (file-only keys dropped,
    the vocabulary grown to `new_vocab`), heads sized to the hidden size, the window checked (None:
    min(2048, max_position_embeddings))."""
    backbone = {k: v for k, v in hf_cfg.items() if k not in _DROPPED_KEYS}
    backbone["vocab_size"] = new_vocab
    hidden = int(backbone["hidden_size"])
    max_pos = int(backbone.get("max_position_embeddings", DEFAULT_WINDOW_TOKENS))
    if window is None:
        window = min(DEFAULT_WINDOW_TOKENS, max_pos)
        if window < 64:
            raise CheckpointError(f"the default window min({DEFAULT_WINDOW_TOKENS}, max_position_embeddings) is "
                                  f"{window}: the model's max_position_embeddings ({max_pos}) is below the "
                                  "smallest window, 64 tokens")
    elif not 64 <= window <= max_pos:
        raise CheckpointError(f"--window must be in [64, max_position_embeddings = {max_pos}]; got {window}")
    return Vela2Config(name=name, backbone=backbone,
                       heads=HeadsConfig(option_hidden=hidden, span_dim=min(hidden, SPAN_DIM_MAX)),
                       max_window_tokens=window, window_overlap_words=min(64, window // 16))


def _initial_heads(config: Vela2Config) -> dict[str, torch.Tensor]:
    """Freshly initialised option and span heads (torch's seeded RNG), fp32, by checkpoint name."""
    hidden = config.hidden_size
    return {f"{prefix}.{n}": p.detach().float()
            for prefix, mod in (("option_head", OptionHead(hidden, config.heads.option_hidden)),
                                ("span_head", SpanHead(hidden, config.heads.span_dim)))
            for n, p in mod.named_parameters()}


@dataclass(frozen=True)
class _Embedding:
    """How the stored (old_vocab, H) embedding grows to (new_vocab, H): `new_ids` get the mean row."""

    old_vocab: int
    new_vocab: int
    new_ids: list[int]


def _convert_weights(hf_dir: Path, model_type: str, writer: _ShardWriter, expected: dict[str, tuple[int, ...]],
                     bf16: set[str], embedding: _Embedding, progress: bool | None = False) -> None:
    """Stream the backbone's tensors of `hf_dir` into `writer`, one at a time: renamed, checked against
    the `expected` shapes, cast by the release rule (`bf16` names bf16, the rest fp32), the
    embedding resized. The causal LM head is dropped. `progress`: the tensors read, on stderr."""
    try:
        files = weight_files(hf_dir, " (only safetensors weights are imported)")
    except (ValueError, KeyError, TypeError, OSError, SafetensorError) as e:
        raise CheckpointError(f"the weights of {hf_dir} are not readable: {_why(e, hf_dir / WEIGHTS)}") from None
    with Progress("import", len(files), unit="tensor", show=progress) as bar:
        for name_in, path in sorted(files.items(), key=lambda kv: (str(kv[1]), kv[0])):
            _convert_tensor(name_in, path, model_type, writer, expected, bf16, embedding)
            bar.update(1)


def _convert_tensor(name_in: str, path: Path, model_type: str, writer: _ShardWriter,
                    expected: dict[str, tuple[int, ...]], bf16: set[str], embedding: _Embedding) -> None:
    """One tensor of `_convert_weights` into `writer` (none for the causal LM head)."""
    target = _target_name(name_in)
    if target is None:
        return
    if target not in expected:
        raise CheckpointError(f"tensor {name_in!r} has no place in a {model_type} backbone of this config")
    dtype = torch.bfloat16 if target in bf16 else torch.float32
    try:
        with safe_open(str(path), framework="pt", device="cpu") as sf:  # reopened per tensor: no mapping held
            if target.endswith("embed_tokens.weight"):
                t = _resized_embedding(sf.get_slice(name_in), embedding.old_vocab, embedding.new_vocab,
                                       embedding.new_ids)
            else:
                t = sf.get_tensor(name_in).to(dtype)
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"{path}: tensor {name_in!r} is not readable: {_why(e, path)}") from None
    if tuple(t.shape) != expected[target]:
        raise CheckpointError(f"{name_in}: shape {tuple(t.shape)}; the config expects {expected[target]}")
    writer.add(target, t.contiguous())


def _remove_partial(out: Path, created: bool) -> None:
    """Remove what a failed import wrote: `out` itself when the import created it, else its contents
    (it was empty before: import_hf refuses a directory that is not)."""
    import shutil

    if created:
        shutil.rmtree(out, ignore_errors=True)
        return
    for child in out.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


EMBEDDING_CHUNK_ROWS = 8192  # rows of the stored embedding read at a time (no second full copy)


def _resized_embedding(stored, old_vocab: int, new_vocab: int, new_ids: list[int]) -> torch.Tensor:
    """(new_vocab, H) fp32 embedding from a safetensors slice of the stored (old_vocab, H) one: the old
    rows, read in chunks of EMBEDDING_CHUNK_ROWS, with the mean of the old rows in `new_ids` (which
    holds every row past the old ones: no row is left uninitialised)."""
    old, hidden = stored.get_shape()
    if old != old_vocab:
        raise CheckpointError(f"the stored embedding has {old:,} rows; the config's vocab_size is {old_vocab:,}")
    if set(range(old, new_vocab)) - set(new_ids):
        raise ValueError(f"rows {old}..{new_vocab - 1} past the stored embedding must all be in new_ids")
    out = torch.empty((new_vocab, hidden), dtype=torch.float32)
    for a in range(0, old, EMBEDDING_CHUNK_ROWS):
        b = min(old, a + EMBEDDING_CHUNK_ROWS)
        out[a:b].copy_(stored[a:b])
    mean = out[:old].mean(0)  # (H,)
    out[new_ids] = mean
    return out


_LFS_POINTER = b"version https://git-lfs"  # how a git-lfs pointer file starts (a clone without `git lfs pull`)


def _is_lfs_pointer(path: Path) -> bool:
    try:
        with open(path, "rb") as f:  # closed at once: the import may go on to open other files
            return f.read(len(_LFS_POINTER)) == _LFS_POINTER
    except OSError:  # a directory, unreadable: not a pointer
        return False


def _why(e: BaseException, path: Path | None = None) -> str:
    """A one-line reason for an unreadable weight file; a git-lfs pointer is said as such."""
    if path is not None and not path.exists():
        return f"{path.name} does not exist (a shard missing from the download?)"
    if path is not None and _is_lfs_pointer(path):
        return "it is a git-lfs pointer file, not the weights: run `git lfs pull` in the model directory"
    text = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
    return f"{text} (a truncated or corrupt download?)"


class _ShardWriter:
    """Writes tensors to numbered shards of at most `max_bytes` each, then the index."""

    def __init__(self, out: Path, max_bytes: int):
        self.out, self.max_bytes = out, max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.size = 0
        self.files: list[tuple[str, list[str]]] = []  # (temporary file name, tensor names)
        self.names: set[str] = set()
        self.total = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        nbytes = t.numel() * t.element_size()
        if self.pending and self.size + nbytes > self.max_bytes:
            self._flush()
        self.pending[name] = t
        self.size += nbytes
        self.total += nbytes
        self.names.add(name)

    def _flush(self) -> None:
        fname = f"part-{len(self.files):05d}.safetensors.tmp"
        save_file(self.pending, str(self.out / fname), metadata={"format": "pt"})
        self.files.append((fname, list(self.pending)))
        self.pending, self.size = {}, 0

    def close(self) -> None:
        self._flush()
        n = len(self.files)
        weight_map = {}
        for k, (tmp, names) in enumerate(self.files):
            final = WEIGHTS if n == 1 else f"model-{k + 1:05d}-of-{n:05d}.safetensors"
            (self.out / tmp).rename(self.out / final)
            weight_map.update(dict.fromkeys(names, final))
        if n > 1:
            (self.out / INDEX).write_text(json.dumps({"metadata": {"total_size": self.total},
                                                      "weight_map": weight_map}, indent=2))


def import_command(hf_dir: str, out: str, *, name: str | None = None, window: int | None = None) -> int:
    """`vela2 import`: write the checkpoint and say what it holds."""
    path = import_hf(hf_dir, out, name=name, window=window, progress=None)
    config = Vela2Config.read(path)
    print(f"imported {hf_dir} ({config.backbone['model_type']}, {config.backbone['num_hidden_layers']} layers, "
          f"hidden {config.hidden_size}, vocabulary {config.backbone['vocab_size']}) as {config.name!r} to {path}")
    print("its heads are untrained: `vela2 train` them before serving answers that mean anything")
    return 0
