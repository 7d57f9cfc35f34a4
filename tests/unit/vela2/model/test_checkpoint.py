"""Checkpoint I/O: stored dtypes, save -> load round trips (single file and sharded) giving the same
outputs, bf16-held models, and the errors of broken checkpoint directories."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

import vela2
from vela2.errors import CheckpointError, PrecisionError
from vela2.model import checkpoint
from vela2.model.checkpoint import INDEX, WEIGHTS
from vela2.train.demo_model import sample_rows

ROWS = [dict(r, logits=True, units=True) for r in sample_rows() if r["id"] != "demo-long"]


def outputs(model, precision: str = "fp32") -> list[list[float]]:
    """Every raw number the rows produce: option logits and span unit logits, flattened per row."""
    out = []
    for res in vela2.predict(model, ROWS, precision=precision):
        assert res.status == "ok"
        vals: list[float] = []
        for a in res.answers:
            vals += a.logits or []
            if a.units:
                for v in a.units.logits.values():
                    vals += v
        out.append(vals)
    return out


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        assert torch.equal(sa[k], sb[k]), k


@pytest.fixture(scope="module")
def reference_outputs(demo_model):
    return outputs(demo_model)


def test_files_and_stored_dtypes(demo_dir, demo_model):
    assert {p.name for p in demo_dir.iterdir()} == {"config.json", WEIGHTS, "tokenizer.json", "calibration.json",
                                                    "manifest.json", "description.txt", "held-out.json"}
    linear = {f"backbone.{n}.weight" for n, m in demo_model.backbone.named_modules() if isinstance(m, nn.Linear)}
    assert len(linear) >= 7 * demo_model.config.backbone["num_hidden_layers"]  # q k v o gate up down
    with safe_open(str(demo_dir / WEIGHTS), framework="pt") as f:
        names = set(f.keys())
        assert names == set(demo_model.state_dict())
        for name in names:
            want = torch.bfloat16 if name in linear else torch.float32
            assert f.get_slice(name).get_dtype() == {torch.bfloat16: "BF16", torch.float32: "F32"}[want], name
    # heads and embeddings / norms are among the fp32 ones
    assert any(n.startswith("option_head.") for n in names) and any(n.startswith("span_head.") for n in names)
    assert any("embed" in n for n in names) and any("norm" in n for n in names)


def test_loaded_model_dtypes(demo_model):
    assert demo_model.backbone_dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in demo_model.option_head.parameters())
    assert all(p.dtype == torch.float32 for p in demo_model.span_head.parameters())
    assert not demo_model.training
    assert demo_model.name == "vela2-demo"
    assert not any(b.is_meta for b in demo_model.buffers())


def test_round_trip_same_outputs(demo_model, tmp_path, reference_outputs):
    vela2.save(demo_model, tmp_path / "copy")
    again = vela2.load(tmp_path / "copy", dtype=torch.float32)
    assert_same_state(demo_model, again)
    assert again.config == demo_model.config and again.calibration == demo_model.calibration
    assert again.tokenizer.to_str() == demo_model.tokenizer.to_str()
    assert outputs(again) == reference_outputs


@pytest.mark.parametrize("shard_max_bytes", [None, 100_000])
def test_every_written_file_is_world_readable(demo_model, tmp_path, shard_max_bytes):
    # safetensors writes its files 0600: a serving container running as another user could not
    # read the weights of a checkpoint that `vela2 train` / `init-demo` wrote
    path = tmp_path / "ckpt"
    vela2.save(demo_model, path, shard_max_bytes=shard_max_bytes)
    files = list(path.iterdir())
    assert any(f.suffix == ".safetensors" for f in files)
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in files} == {f.name: oct(0o644) for f in files}


def test_sharded_round_trip(demo_model, tmp_path, reference_outputs):
    path = tmp_path / "sharded"
    vela2.save(demo_model, path, shard_max_bytes=100_000)
    shards = sorted(path.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 3
    assert all(s.name.endswith(f"-of-{len(shards):05d}.safetensors") for s in shards)
    assert not (path / WEIGHTS).exists()
    index = json.loads((path / INDEX).read_text())
    assert set(index["weight_map"]) == set(demo_model.state_dict())
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    stored = {}
    for s in shards:
        stored.update(load_file(str(s)))
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in stored.values())
    for name, fname in index["weight_map"].items():
        with safe_open(str(path / fname), framework="pt") as f:
            assert name in f.keys()
    again = vela2.load(path, dtype=torch.float32)
    assert_same_state(demo_model, again)
    assert outputs(again) == reference_outputs

    # saving unsharded into the same directory removes the stale shards and index
    vela2.save(demo_model, path)
    assert not list(path.glob("model-*-of-*.safetensors")) and not (path / INDEX).exists()
    assert_same_state(demo_model, vela2.load(path))


def test_bf16_held_model(demo_dir, demo_model):
    m16 = vela2.load(demo_dir, dtype=torch.bfloat16)
    assert m16.backbone_dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in m16.option_head.parameters())
    with pytest.raises(PrecisionError, match="fp32 needs the backbone held in float32"):
        vela2.predict(m16, ROWS[:1], precision="fp32")
    r16 = vela2.predict(m16, ROWS, precision="bf16")
    r32 = vela2.predict(demo_model, ROWS, precision="fp32")
    for a, b in zip(r16, r32, strict=True):
        assert a.status == b.status == "ok"
        for x, y in zip(a.answers, b.answers, strict=True):
            assert x.probs.keys() == y.probs.keys()
            assert max(abs(x.probs[k] - y.probs[k]) for k in x.probs) < 0.1


def _copy(demo_dir, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(demo_dir, dst)
    return dst


def test_missing_tensor(demo_dir, tmp_path):
    path = _copy(demo_dir, tmp_path)
    state = load_file(str(path / WEIGHTS))
    gone = "span_head.bias"
    del state[gone]
    save_file(state, str(path / WEIGHTS))
    with pytest.raises(CheckpointError, match=r"missing \['span_head.bias'\] \(1\), unexpected \[\] \(0\)"):
        vela2.load(path)


def test_missing_tensor_in_sharded_index(demo_model, tmp_path):
    path = tmp_path / "sharded"
    vela2.save(demo_model, path, shard_max_bytes=100_000)
    index = json.loads((path / INDEX).read_text())
    del index["weight_map"]["option_head.out.weight"]
    (path / INDEX).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"missing \['option_head.out.weight'\]"):
        vela2.load(path)


def test_unexpected_and_misshapen_tensors(demo_dir, tmp_path):
    path = _copy(demo_dir, tmp_path)
    state = load_file(str(path / WEIGHTS))
    save_file({**state, "extra.weight": torch.zeros(2)}, str(path / WEIGHTS))
    with pytest.raises(CheckpointError, match=r"unexpected \['extra.weight'\] \(1\)"):
        vela2.load(path)
    state["option_head.out.weight"] = torch.zeros(1, 3)
    save_file(state, str(path / WEIGHTS))
    with pytest.raises(CheckpointError, match=r"option_head.out.weight: stored shape \(1, 3\); config expects"):
        vela2.load(path)


@pytest.mark.parametrize("missing", ["config.json", "tokenizer.json", WEIGHTS])
def test_missing_files(demo_dir, tmp_path, missing):
    path = _copy(demo_dir, tmp_path)
    (path / missing).unlink()
    with pytest.raises(CheckpointError):
        vela2.load(path)


def test_bad_config(demo_dir, tmp_path):
    path = _copy(demo_dir, tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(CheckpointError, match="model_type must be 'vela2'; got 'llama'"):
        vela2.load(path)
    del cfg["name"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="lacks the key 'name'"):
        vela2.load(path)


def test_save_of_a_bf16_held_model_keeps_release_dtypes(demo_dir, tmp_path):
    m16 = vela2.load(demo_dir, dtype=torch.bfloat16)
    vela2.save(m16, tmp_path / "from16")
    a, b = load_file(str(demo_dir / WEIGHTS)), load_file(str(tmp_path / "from16" / WEIGHTS))
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        if a[k].dtype == torch.bfloat16 or k.startswith(("option_head", "span_head")):
            assert torch.equal(a[k], b[k]), k  # bf16 weights and fp32 heads survive exactly
        else:
            np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), rtol=1e-2, atol=1e-6)


def test_the_digest_names_the_bytes_of_weights_calibration_tokenizer_and_config(demo_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(demo_dir, copy)
    first = checkpoint.digest(demo_dir)
    assert len(first) == 32 and checkpoint.digest(copy) == first  # same bytes, same identity
    assert checkpoint.digest(copy, random_weights=True) != first
    cal = json.loads((copy / "calibration.json").read_text())
    (copy / "calibration.json").write_text(json.dumps(cal, indent=2))  # same calibration, other bytes
    recalibrated = checkpoint.digest(copy)
    assert recalibrated != first
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    assert checkpoint.digest(copy) not in (first, recalibrated)


def test_predict_names_the_model_its_digest_and_the_precision_in_every_answer(demo_dir, demo_model):
    row = {"id": "id-1", "task": "choice:boolq", "text": "Is the sky blue?",
           "questions": [{"question": "Is it?", "options": ["yes", "no"]}]}
    for precision in ("fp32", "bf16"):
        (res,) = vela2.predict(demo_model, [row], precision=precision)
        assert res.to_json_dict()["served_by"] == {"name": demo_model.name, "digest": checkpoint.digest(demo_dir),
                                                   "precision": precision, "batch_invariant": False}


@pytest.mark.parametrize(("edit", "message"), [
    (lambda cfg: cfg["backbone"].update(hidden_size=1e6),
     "config.json backbone: hidden_size must be an integer in [1, 65,536]; got 1000000.0"),
    (lambda cfg: cfg["backbone"].update(num_hidden_layers=100_000),
     "num_hidden_layers must be an integer in [0, 1,024]; got 100000"),
    (lambda cfg: cfg["heads"].update(option_hidden=10**9), "heads: option_hidden must be an integer in"),
    (lambda cfg: cfg["backbone"].update(hidden_size=65_536, intermediate_size=1 << 20, num_hidden_layers=1_024),
     "parameters, more than 1e+12"),
])
def test_config_sizes_are_bounded_before_anything_is_built(demo_dir, tmp_path, edit, message):
    path = _copy(demo_dir, tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=re.escape(message)):
        vela2.load(path)


def test_a_config_that_disagrees_with_the_stored_shapes_allocates_nothing(demo_dir, tmp_path, monkeypatch):
    path = _copy(demo_dir, tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["backbone"]["intermediate_size"] = 4096
    (path / "config.json").write_text(json.dumps(cfg))
    allocated = []
    monkeypatch.setattr(torch.nn.Module, "to_empty", lambda self, **kw: allocated.append(kw))
    with pytest.raises(CheckpointError, match=r"stored shape \(\d+, \d+\); config expects \((4096, \d+|\d+, 4096)\)"):
        vela2.load(path)
    assert allocated == []


@pytest.mark.parametrize("name", ["tokenizer.json", "config.json", WEIGHTS])
def test_a_file_linking_out_of_the_checkpoint_is_refused(demo_dir, tmp_path, name):
    path = _copy(demo_dir, tmp_path)
    outside = tmp_path / f"outside-{name}"
    shutil.move(path / name, outside)
    (path / name).symlink_to(outside)
    with pytest.raises(CheckpointError, match=f"a link to {re.escape(str(outside))}, outside"):
        vela2.load(path)
