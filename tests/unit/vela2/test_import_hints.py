"""A transformers directory that was never imported, given where a Vela 2 checkpoint goes (`vela2 eval`,
`vela2 predict`, `vela2.load`, a worker's --checkpoint: all read its config.json through
Vela2Config.read), fails with the `vela2 import` command that makes one; `vela2 import` takes
exactly the backbones SUPPORTED_MODEL_TYPES lists and names that list when it refuses one (issue 40)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import vela2
from vela2.cli import build_parser, cmd_import, main
from vela2.config import Vela2Config
from vela2.errors import CheckpointError
from vela2.train.importing import SUPPORTED_MODEL_TYPES, read_hf_config

ROW = {"id": "r-1", "task": "choice:boolq", "text": "It rained.", "questions": [{"options": ["yes", "no"]}],
       "gold": [0]}


def transformers_dir(root: Path, model_type: str | None = "qwen2", name: str = "Qwen2-0.5B") -> Path:
    """A transformers model directory as exported (its config.json; nothing else is read first)."""
    path = root / name
    path.mkdir()
    cfg = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2,
           "num_attention_heads": 2, "intermediate_size": 32, "torch_dtype": "bfloat16"}
    if model_type is not None:
        cfg["model_type"] = model_type
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("command", ["eval", "predict"])
def test_eval_and_predict_on_a_transformers_directory_say_how_to_import_it(tmp_path, capsys, command):
    hf = transformers_dir(tmp_path)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROW) + "\n")
    assert main([command, "--checkpoint", str(hf), str(rows)]) == 2
    err = capsys.readouterr().err
    out = tmp_path.resolve() / "Qwen2-0.5B-vela2"
    assert err.startswith(f"vela2 {command}: config.json model_type must be 'vela2'; got 'qwen2'"), err
    how = f"is a transformers model directory, not a Vela 2 checkpoint; import it first with `vela2 import {hf} {out}`"
    assert how in err and "Traceback" not in err
    suggested = build_parser().parse_args(["import", str(hf), str(out)])  # the command as the CLI spells it
    assert suggested.func is cmd_import and (suggested.hf_dir, suggested.out) == (str(hf), str(out))


def test_every_loader_gives_the_hint(tmp_path, monkeypatch):
    hf = transformers_dir(tmp_path, "llama", "Llama-3.2-1B")
    for read in (Vela2Config.read, vela2.load):
        with pytest.raises(CheckpointError, match=r"`vela2 import \S+Llama-3.2-1B \S+Llama-3.2-1B-vela2`"):
            read(hf)
    monkeypatch.chdir(hf)  # "." names the directory by its own name
    with pytest.raises(CheckpointError, match=r"`vela2 import \. /\S+/Llama-3.2-1B-vela2` and pass"):
        Vela2Config.read(".")


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_import_takes_each_supported_backbone(tmp_path, model_type):
    assert read_hf_config(transformers_dir(tmp_path, model_type))["model_type"] == model_type


@pytest.mark.parametrize("model_type", ["mistral", "gpt2", "vela2", None])
def test_import_refuses_any_other_naming_exactly_the_supported_list(tmp_path, model_type):
    hf = transformers_dir(tmp_path, model_type)
    with pytest.raises(CheckpointError) as refused:
        read_hf_config(hf)
    message = str(refused.value)
    assert message == (f"{hf / 'config.json'}: model_type {model_type!r} is not supported; supported: "
                       f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    assert SUPPORTED_MODEL_TYPES == ("qwen2", "llama")  # the docs' "Supported backbones" list: change both
