"""A checkpoint's identity computed when it is written (manifest.json) and checked cheaply at start:
every writer writes it, a start reads no weight byte, a changed byte is caught by the full check,
a changed small file or layout by the cheap one, and a checkpoint without a manifest still loads."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

import vela2
from vela2.cli import main as vela2_main
from vela2.errors import CheckpointError
from vela2.model import checkpoint, manifest
from vela2.model.manifest import INDEX, MANIFEST, WEIGHTS


def _copy(demo_dir, tmp_path, name="ckpt"):
    return shutil.copytree(demo_dir, tmp_path / name)


def _flip_last_weight_byte(path):
    """One bit of the last weight of the file: same size, same header."""
    with open(path, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))


def _no_weight_reads(monkeypatch):
    """Fail any full hash of a safetensors file (a start must read headers only)."""
    real = manifest.file_hash

    def guarded(path, limit_bps=None):
        assert not str(path).endswith(".safetensors"), f"hashed {path} in full"
        return real(path, limit_bps)

    monkeypatch.setattr(manifest, "file_hash", guarded)


@pytest.mark.parametrize("shard_max_bytes", [None, 100_000])
def test_save_writes_a_manifest_whose_digest_is_every_bytes(demo_model, tmp_path, shard_max_bytes):
    vela2.save(demo_model, tmp_path / "c", shard_max_bytes=shard_max_bytes)
    written = manifest.read(tmp_path / "c")
    assert written is not None and written["digest"] == checkpoint.digest(tmp_path / "c")
    weights = [n for n in written["files"] if n.endswith(".safetensors")]
    assert (weights == [WEIGHTS]) if shard_max_bytes is None else len(weights) > 1
    assert all(written["files"][n]["header_blake2b"] for n in weights)
    assert {"config.json", "tokenizer.json", "calibration.json"} <= set(written["files"])
    assert oct((tmp_path / "c" / MANIFEST).stat().st_mode & 0o777) == "0o644"


def test_the_demo_checkpoint_has_a_manifest(demo_dir):
    assert manifest.read(demo_dir)["digest"] == checkpoint.digest(demo_dir)


def test_a_start_takes_the_digest_from_the_manifest_without_reading_the_weights(demo_dir, monkeypatch):
    _no_weight_reads(monkeypatch)
    identity = manifest.identify(demo_dir)
    assert identity.manifest is not None and identity.digest == manifest.read(demo_dir)["digest"]
    model = vela2.load(demo_dir)  # load names the same digest, the same way
    assert model.digest == identity.digest


def test_a_changed_weight_byte_passes_the_cheap_check_and_fails_the_full_one(demo_dir, tmp_path, capsys):
    path = _copy(demo_dir, tmp_path)
    recorded = manifest.read(path)
    assert manifest.verify(path, recorded) is None
    _flip_last_weight_byte(path / WEIGHTS)
    assert manifest.identify(path).digest == recorded["digest"]  # cheap: the same size and header
    problem = manifest.verify(path, recorded)
    assert problem is not None and problem.startswith(f"{WEIGHTS}: its bytes hash to ")
    assert checkpoint.digest(path) != recorded["digest"]
    assert vela2_main(["manifest", str(path), "--check"]) == 1
    assert "DIFFERS from its manifest: model.safetensors: its bytes hash to" in capsys.readouterr().out
    assert vela2_main(["manifest", str(path)]) == 0  # the change was meant: rewrite it
    assert manifest.read(path)["digest"] == checkpoint.digest(path)
    assert vela2_main(["manifest", str(path), "--check"]) == 0
    assert "every byte agrees with its manifest" in capsys.readouterr().out


@pytest.mark.parametrize("change", ["calibration", "header", "size", "new shard", "no manifest", "bad json"])
def test_a_stale_or_missing_manifest_falls_back_to_hashing_every_byte(demo_model, tmp_path, caplog, change):
    path = tmp_path / "c"
    vela2.save(demo_model, path, shard_max_bytes=100_000)
    first = sorted(path.glob("model-*.safetensors"))[0]
    if change == "calibration":  # a small file: hashed in full by the cheap check
        cal = json.loads((path / "calibration.json").read_text())
        (path / "calibration.json").write_text(json.dumps(cal, indent=3))
    elif change == "header":  # the same size, another layout
        data = bytearray(first.read_bytes())
        at = data.index(b'"dtype"')
        data[at + 1] = ord("D")
        first.write_bytes(bytes(data))
    elif change == "size":
        with open(first, "ab") as f:
            f.write(b"\0")
    elif change == "new shard":
        index = json.loads((path / INDEX).read_text())
        name = next(iter(index["weight_map"]))
        index["weight_map"][name] = "model-extra.safetensors"
        shutil.copy(first, path / "model-extra.safetensors")
        (path / INDEX).write_text(json.dumps(index))
    elif change == "no manifest":
        (path / MANIFEST).unlink()
    else:
        (path / MANIFEST).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="vela2.model.manifest"):
        identity = manifest.identify(path)
    assert identity.manifest is None and identity.digest == checkpoint.digest(path)
    assert f"`vela2 manifest {path}` writes a manifest" in caplog.text


def test_an_index_naming_a_file_outside_the_checkpoint_is_refused(demo_model, tmp_path):
    path = tmp_path / "c"
    vela2.save(demo_model, path, shard_max_bytes=100_000)
    index = json.loads((path / INDEX).read_text())
    index["weight_map"][next(iter(index["weight_map"]))] = "../elsewhere.safetensors"
    (path / INDEX).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="must be a file of the directory itself"):
        manifest.identify(path)


def test_calibrate_rewrites_the_manifest_without_hashing_the_weights_again(demo_dir, tmp_path, monkeypatch):
    from vela2.train import calibrate

    path = _copy(demo_dir, tmp_path)
    dev = tmp_path / "dev.jsonl"
    dev.write_text(json.dumps({"id": "a", "task": "choice:t", "text": "t"}) + "\n")
    fitted = vela2.load(path).calibration
    fitted.temperatures["choice:t"] = 2.5  # what the fit found (the fit itself: test_calibrate)
    monkeypatch.setattr(calibrate, "calibrate", lambda model, rows, precision, progress=None: (
        fitted, {"tasks": {"choice:t": {}}, "skipped": [], "n_rows": 1}))
    monkeypatch.setattr(calibrate, "format_report", lambda report: "")
    before = manifest.read(path)["digest"]
    _no_weight_reads(monkeypatch)
    assert calibrate.calibrate_command(str(path), str(dev)) == 0
    monkeypatch.undo()
    after = manifest.read(path)
    assert after["digest"] != before and after["digest"] == checkpoint.digest(path)
    assert manifest.cheap_check(path, after) is None


def test_manifest_command_refuses_a_directory_that_is_not_a_checkpoint(tmp_path, capsys):
    assert vela2_main(["manifest", str(tmp_path)]) == 2
    assert "is not a Vela 2 checkpoint (no config.json)" in capsys.readouterr().err
    assert vela2_main(["manifest", str(tmp_path), "--check"]) == 2


def test_random_weights_digest_reads_no_weights(demo_dir, monkeypatch):
    _no_weight_reads(monkeypatch)
    assert manifest.identify(demo_dir, random_weights=True).digest != manifest.read(demo_dir)["digest"]
