"""Static configuration: request limits, the checkpoint config dataclass and its defaults."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vela2.errors import CheckpointError

TASK_TYPES = ("choice", "score", "set", "span")
# run_batch precisions: bf16 (GEMMs and attention in bf16), fp32, or fp8 (opt-in: backbone GEMMs in float8
# e4m3, per-channel weight / per-token activation scales; vela2.model.fused), never a default
PRECISIONS = ("bf16", "fp32", "fp8")
DEFAULT_MAX_BATCH_TOKENS = 16_384  # padded tokens (longest x count) per device batch, everywhere


def install_hint(extra: str) -> str:
    """How to install one of vela2's extras, as every message that needs one says it: vela2 is not on
    PyPI, it is installed from a checkout or from the wheel `make dist` builds."""
    return f"pip install -e '.[{extra}]' -c constraints.txt in a checkout, or 'dist/<wheel>[{extra}]'"


def default_precision(device: str) -> str:
    """The serving precision when none is given: bf16 on CUDA, fp32 elsewhere."""
    return "bf16" if str(device).startswith("cuda") else "fp32"


@dataclass(frozen=True)
class Limits:
    """Hard limits on one request; anything above gets a `limit_exceeded` error naming the value."""

    max_text_chars: int = 2_000_000  # characters of one row's text (all SystemOne fields together)
    max_text_words: int = 65_536  # words after splitting; longer texts are refused, never truncated
    max_questions: int = 32  # question blocks bundled over one text
    max_options: int = 64  # options of one choice / score / set question
    max_labels: int = 64  # labels of one span question
    max_item_chars: int = 256  # characters of one option or label
    max_question_chars: int = 4_000  # characters of one question text
    max_id_chars: int = 256  # characters of a request id
    max_tasks: int = 32  # tasks of one SystemOne request
    max_fields: int = 32  # fields of one SystemOne JSON input
    max_message_bytes: int = 8_000_000  # bytes of one queue message (the worker refuses larger ones)
    max_request_tokens: int = 2_000_000  # tokens of all sequences of one request (windows x blocks)
    max_deadline_s: float = 30 * 86_400.0  # a request's deadline_s (seconds until it expires unscored)


LIMITS = Limits()


@dataclass(frozen=True)
class SpecialTokens:
    """Marker tokens the renderer inserts; each must be a single token in the tokenizer."""

    pad: str = "[PAD]"
    bos: str = "[BOS]"
    question: str = "[Q]"  # opens a question block
    sep: str = "[SEP]"  # ends the question text, before the options / labels
    option: str = "[OPT]"  # one after each option's text; the option head reads it
    abstain: str = "[ABS]"  # the abstain marker of choice / score blocks
    label: str = "[LBL]"  # one after each span label's text; the span head reads it
    unk: str = "[UNK]"

    def all(self) -> list[str]:
        """Every special token, in field order."""
        return list(asdict(self).values())


# Bounds on a backbone's sizes, checked before anything is built or allocated (a config with
# hidden_size 1e6 or 100k layers must be one line, not gigabytes allocated and a traceback). Generous:
# the largest open decoders are well inside them.
BACKBONE_BOUNDS = {
    "hidden_size": 65_536, "num_hidden_layers": 1_024, "intermediate_size": 1 << 20,
    "num_attention_heads": 1_024, "num_key_value_heads": 1_024, "vocab_size": 1 << 23,
    "max_position_embeddings": 1 << 24, "head_dim": 4_096,
}
MAX_BACKBONE_PARAMS = 1e12  # layers x (4 h^2 + 3 h x intermediate) + vocab x h, estimated


def check_backbone_sizes(backbone: dict[str, Any], where: str) -> None:
    """CheckpointError naming the key, the value and the bound when a size of `backbone` (a
    transformers config dict) is not a positive integer within BACKBONE_BOUNDS, or the model it
    describes exceeds MAX_BACKBONE_PARAMS parameters."""
    for key, bound in BACKBONE_BOUNDS.items():
        if key not in backbone or backbone[key] is None:
            continue
        value = backbone[key]
        low = 0 if key == "num_hidden_layers" else 1  # 0 layers: the embedding and heads alone (queue benchmarks)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= bound:
            raise CheckpointError(f"{where}: {key} must be an integer in [{low}, {bound:,}]; got {value!r}")
    h = int(backbone.get("hidden_size") or 0)
    layers = int(backbone.get("num_hidden_layers") or 0)
    inter = int(backbone.get("intermediate_size") or 4 * h)
    params = layers * (4 * h * h + 3 * h * inter) + int(backbone.get("vocab_size") or 0) * h
    if params > MAX_BACKBONE_PARAMS:
        raise CheckpointError(f"{where}: the sizes describe ~{params:.3g} parameters, more than "
                              f"{MAX_BACKBONE_PARAMS:.0e}")


@dataclass(frozen=True)
class HeadsConfig:
    """Widths of the option and span heads."""

    option_hidden: int  # width of the option head's hidden layer
    span_dim: int  # width of the bilinear word x label space of span head v2


@dataclass(frozen=True)
class Vela2Config:
    """The checkpoint's config.json: backbone (a transformers decoder config) plus our heads."""

    name: str  # model name; SystemOne requests must name it
    backbone: dict[str, Any]  # a transformers config dict: model_type qwen2 / llama / ...
    heads: HeadsConfig
    special_tokens: SpecialTokens = field(default_factory=SpecialTokens)
    max_window_tokens: int = 2048  # longest sequence one window may have (context + longest block)
    window_overlap_words: int = 64  # words shared by consecutive windows of a long text
    window_block_reserve_tokens: int = 0  # tokens kept for question blocks; 0: max_window_tokens // 8
    model_type: str = "vela2"

    def __post_init__(self) -> None:
        if self.max_window_tokens - 1 - self.block_reserve_tokens < 16:
            raise CheckpointError(
                f"window_block_reserve_tokens {self.block_reserve_tokens:,} leaves less than 16 text tokens in "
                f"a window of max_window_tokens {self.max_window_tokens:,}"
            )

    @property
    def block_reserve_tokens(self) -> int:
        """Tokens of a window kept for question blocks (the set value, else a window's eighth)."""
        return self.window_block_reserve_tokens or self.max_window_tokens // 8

    @property
    def hidden_size(self) -> int:
        """Width of the backbone's hidden states."""
        return int(self.backbone.get("hidden_size") or self.backbone["n_embd"])

    def to_dict(self) -> dict[str, Any]:
        """The config as config.json holds it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Vela2Config:
        """The config of a config.json object; CheckpointError when it is not one of ours."""
        if d.get("model_type") != "vela2":
            raise CheckpointError(f"config.json model_type must be 'vela2'; got {d.get('model_type')!r}")
        for key in ("name", "backbone", "heads"):
            if key not in d:
                raise CheckpointError(f"config.json lacks the key {key!r}")
        if not isinstance(d["backbone"], dict) or not isinstance(d["heads"], dict):
            raise CheckpointError("config.json: backbone and heads must be JSON objects")
        check_backbone_sizes(d["backbone"], "config.json backbone")
        for key, value in d["heads"].items():
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= BACKBONE_BOUNDS["hidden_size"]:
                raise CheckpointError(f"config.json heads: {key} must be an integer in "
                                      f"[1, {BACKBONE_BOUNDS['hidden_size']:,}]; got {value!r}")
        return cls(
            name=d["name"],
            backbone=dict(d["backbone"]),
            heads=HeadsConfig(**d["heads"]),
            special_tokens=SpecialTokens(**d.get("special_tokens", {})),
            max_window_tokens=int(d.get("max_window_tokens", 2048)),
            window_overlap_words=int(d.get("window_overlap_words", 64)),
            window_block_reserve_tokens=int(d.get("window_block_reserve_tokens", 0)),
        )

    @classmethod
    def read(cls, path: str | Path) -> Vela2Config:
        """The config.json of checkpoint directory `path`; CheckpointError when absent, or when `path`
        is a transformers model directory (its message says how to import it: every command that
        loads a checkpoint reads its config here first)."""
        p = Path(path) / "config.json"
        if not p.is_file():
            raise CheckpointError(f"{p} does not exist")
        d = json.loads(p.read_text())
        if isinstance(d, dict) and isinstance(d.get("model_type"), str) and d["model_type"] != "vela2":
            out = Path(path).resolve().with_name(f"{Path(path).resolve().name}-vela2")
            raise CheckpointError(f"config.json model_type must be 'vela2'; got {d['model_type']!r}: {path} is a "
                                  f"transformers model directory, not a Vela 2 checkpoint; import it first with "
                                  f"`vela2 import {path} {out}` and pass {out}")
        return cls.from_dict(d)

    def write(self, path: str | Path) -> None:
        """Write config.json into checkpoint directory `path`."""
        (Path(path) / "config.json").write_text(json.dumps(self.to_dict(), indent=2) + "\n")
