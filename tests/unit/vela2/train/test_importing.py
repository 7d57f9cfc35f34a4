"""vela2 import: generated qwen2 / llama directories (single file and sharded) become checkpoints that
load, compute the same hidden states as transformers, answer, and train; clear errors; peak memory."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import AutoModel

import vela2
import vela2.model.checkpoint
import vela2.model.manifest
from bench.import_rss import make_hf_dir
from vela2.cli import main
from vela2.config import SpecialTokens, Vela2Config
from vela2.errors import CheckpointError
from vela2.text.rendering import plain_text_tokenizer
from vela2.train.importing import check_offsets, import_hf
from vela2.train.synthetic import labelled_rows
from vela2.train.training import TrainOptions, labelled_examples, train


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {
        "qwen2-sharded": make_hf_dir(root / "qwen2", "qwen2", max_shard_size="100KB"),
        "llama-single": make_hf_dir(root / "llama", "llama", max_shard_size="1GB", seed=1),
    }


@pytest.mark.parametrize("kind", ["qwen2-sharded", "llama-single"])
def test_import_loads_matches_transformers_and_answers(hf_dirs, kind, tmp_path):
    hf = hf_dirs[kind]
    assert (hf / "model.safetensors.index.json").is_file() == kind.endswith("sharded")
    out = tmp_path / "ckpt"
    assert main(["import", str(hf), str(out), "--name", "tiny", "--window", "512"]) == 0
    model = vela2.load(out)
    assert model.name == "tiny" and model.config.max_window_tokens == 512
    for f in out.iterdir():  # world-readable: a serving container may run as another user
        assert f.stat().st_mode & 0o444 == 0o444, f
    # every special token is in the tokenizer; new embedding rows hold the mean of the old ones
    hf_model = AutoModel.from_pretrained(hf, dtype=torch.float32)
    old = hf_model.get_input_embeddings().weight
    emb = model.backbone.embed_tokens.weight
    hf_vocab = Tokenizer.from_file(str(hf / "tokenizer.json")).get_vocab_size()
    new = [model.tokenizer.token_to_id(token) for token in SpecialTokens().all()]
    assert sorted(new) == list(range(hf_vocab, hf_vocab + len(new)))  # appended after the tokenizer's own
    torch.testing.assert_close(emb[new], old.mean(0).expand(len(new), -1))
    torch.testing.assert_close(emb[:hf_vocab], old[:hf_vocab])
    # the backbone computes what transformers computes on a causal sequence of old tokens
    ids = torch.tensor([model.tokenizer.encode("Alice from Acme asked for a refund.").ids])
    pos = torch.arange(ids.shape[1])[None]
    zeros = torch.zeros_like(ids)
    with torch.no_grad():
        ours = model.encode(ids, pos, zeros, zeros, "fp32")
        theirs = hf_model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    [res] = vela2.predict(model, labelled_rows(1, seed=4), precision="fp32")
    assert res.status == "ok"


def test_imported_heads_train(hf_dirs, tmp_path):
    model = vela2.load(import_hf(hf_dirs["qwen2-sharded"], tmp_path / "ckpt"))
    examples, skipped = labelled_examples(model, labelled_rows(40, seed=7))
    assert not skipped
    losses = train(model, examples, TrainOptions(epochs=4, lr=1e-2, progress=False))
    assert losses[-1] < losses[0]


def test_unsupported_model_type(hf_dirs, tmp_path):
    hf = tmp_path / "gpt"
    shutil.copytree(hf_dirs["llama-single"], hf)
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="model_type 'gpt2' is not supported; supported: qwen2, llama"):
        import_hf(hf, tmp_path / "out")


def test_missing_tokenizer(hf_dirs, tmp_path, capsys):
    hf = tmp_path / "notok"
    shutil.copytree(hf_dirs["llama-single"], hf)
    (hf / "tokenizer.json").unlink()
    assert main(["import", str(hf), str(tmp_path / "out")]) == 2
    assert "tokenizer.json does not exist" in capsys.readouterr().err


def test_tokenizer_without_offsets():
    # a word-level model without a pre-tokenizer sees the whole probe as one unknown "word"; the
    # offsets then cover it, so an all-zero offsets tokenizer is emulated by a stand-in
    class NoOffsets:
        def encode(self, text, add_special_tokens=False):
            return type("Enc", (), {"offsets": [(0, 0)] * 5})()

    with pytest.raises(CheckpointError, match="no usable character offsets"):
        check_offsets(NoOffsets())  # type: ignore[arg-type]
    check_offsets(Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))


def test_import_refuses_a_non_empty_output(hf_dirs, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(CheckpointError, match="is not empty"):
        import_hf(hf_dirs["llama-single"], tmp_path / "out")


def _copy_with_tokenizer(src: Path, dst: Path, edit) -> Path:
    """A copy of the directory `src` whose tokenizer.json `edit(tokenizer)` changed."""
    shutil.copytree(src, dst)
    tok = Tokenizer.from_file(str(dst / "tokenizer.json"))
    edit(tok)
    tok.save(str(dst / "tokenizer.json"))
    return dst


def test_tokenizer_past_the_embedding_is_refused(hf_dirs, tmp_path):
    """Tokens past vocab_size would have no trained embedding row (before: uninitialised memory)."""
    vocab = json.loads((hf_dirs["llama-single"] / "config.json").read_text())["vocab_size"]

    def grow(tok: Tokenizer) -> None:
        tok.add_tokens([f"extra{k}" for k in range(vocab + 10 - tok.get_vocab_size(with_added_tokens=True))])

    hf = _copy_with_tokenizer(hf_dirs["llama-single"], tmp_path / "big", grow)
    with pytest.raises(CheckpointError, match=f"the tokenizer has {vocab + 10} tokens; the model's vocab_size is "
                                              f"{vocab}: 10 token ids"):
        import_hf(hf, tmp_path / "out")


def test_special_tokens_past_the_embedding_get_the_mean_row(hf_dirs, tmp_path):
    """A tokenizer filling the embedding and already holding our special tokens (ids past vocab_size):
    those rows are the mean embedding, finite and the same on every import."""
    vocab = json.loads((hf_dirs["llama-single"] / "config.json").read_text())["vocab_size"]

    def fill(tok: Tokenizer) -> None:
        tok.add_tokens([f"fill{k}" for k in range(vocab - tok.get_vocab_size(with_added_tokens=True))])
        tok.add_special_tokens(SpecialTokens().all())

    hf = _copy_with_tokenizer(hf_dirs["llama-single"], tmp_path / "full", fill)
    a, b = import_hf(hf, tmp_path / "a"), import_hf(hf, tmp_path / "b")
    assert vela2.model.checkpoint.digest(a) == vela2.model.checkpoint.digest(b)
    # the import wrote the identity beside the weights: a start takes it from there
    assert vela2.model.manifest.read(a)["digest"] == vela2.model.checkpoint.digest(a)
    model = vela2.load(a)
    emb = model.backbone.embed_tokens.weight
    assert emb.shape[0] == vocab + len(SpecialTokens().all())
    old = AutoModel.from_pretrained(hf, dtype=torch.float32).get_input_embeddings().weight
    torch.testing.assert_close(emb[vocab:], old.mean(0).expand(emb.shape[0] - vocab, -1))


def test_import_turns_truncation_and_padding_off(hf_dirs, tmp_path):
    def enable(tok: Tokenizer) -> None:
        tok.enable_truncation(max_length=16)
        tok.enable_padding(length=64)

    hf = _copy_with_tokenizer(hf_dirs["llama-single"], tmp_path / "trunc", enable)
    out = import_hf(hf, tmp_path / "out")
    saved = json.loads((out / "tokenizer.json").read_text())
    assert saved["truncation"] is None and saved["padding"] is None
    text = " ".join(["alice asked acme for a refund"] * 10)
    model = vela2.load(out)
    assert len(model.tokenizer.encode(text, add_special_tokens=False).ids) > 16


def test_plain_text_tokenizer_turns_truncation_and_padding_off(hf_dirs):
    """Checkpoints written before the import turned them off still encode whole strings, unpadded."""
    tok = Tokenizer.from_file(str(hf_dirs["llama-single"] / "tokenizer.json"))
    text = " ".join(["alice asked acme for a refund"] * 10)
    whole = tok.encode(text, add_special_tokens=False).ids
    tok.enable_truncation(max_length=16)
    tok.enable_padding(length=512)
    plain = plain_text_tokenizer(tok)
    assert plain.truncation is None and plain.padding is None
    assert plain.encode(text, add_special_tokens=False).ids == whole


def test_import_of_dot_is_named_by_the_directory(hf_dirs, tmp_path, monkeypatch):
    hf = tmp_path / "my-model"
    shutil.copytree(hf_dirs["llama-single"], hf)
    monkeypatch.chdir(hf)
    assert Vela2Config.read(import_hf(".", tmp_path / "out")).name == "my-model"


@pytest.mark.parametrize(("name", "pattern"), [("", "the model name '' is empty; pass --name"),
                                               ("m" * 300, "the model name has 300 characters; limit 256")])
def test_import_refuses_a_bad_name(hf_dirs, tmp_path, name, pattern):
    with pytest.raises(CheckpointError, match=re.escape(pattern)):
        import_hf(hf_dirs["llama-single"], tmp_path / "out", name=name)


def _break_config(key: str | None):
    def edit(d: Path) -> None:
        if key is None:
            (d / "config.json").write_text("{")
            return
        cfg = json.loads((d / "config.json").read_text())
        del cfg[key]
        (d / "config.json").write_text(json.dumps(cfg))
    return edit


def _lfs_pointers(d: Path) -> None:
    for f in d.glob("*.safetensors"):
        f.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 12345\n")


def _set_config(**values):
    def edit(d: Path) -> None:
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, **values}))
    return edit


def _index_names(target: str):
    """The index names `target` for one tensor (a path out of the directory); a file is there."""
    def edit(d: Path) -> None:
        index = json.loads((d / "model.safetensors.index.json").read_text())
        first = next(iter(index["weight_map"]))
        source = d / index["weight_map"][first]
        if not target.startswith("/"):
            shutil.copy(source, d.parent / Path(target).name)  # what the import must not copy
        index["weight_map"][first] = target
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return edit


def _shard_links_out(d: Path) -> None:
    shard = sorted(d.glob("model-*.safetensors"))[0]
    outside = d.parent / "elsewhere.safetensors"
    shutil.move(shard, outside)
    shard.symlink_to(outside)


def _truncate_weights(d: Path) -> None:
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(1000)


@pytest.mark.parametrize(("kind", "edit", "message"), [
    ("llama-single", _break_config(None), "config.json is not readable JSON"),
    ("llama-single", _break_config("vocab_size"), "vocab_size must be a positive integer; got None"),
    ("llama-single", lambda d: (d / "tokenizer.json").write_text('{"version": "1.0", "trunc'),
     "tokenizer.json is not a readable fast tokenizer"),
    ("llama-single", _truncate_weights, "are not readable"),
    # files out of the directory: never read, never copied (issue 38)
    ("qwen2-sharded", _index_names("../secret.safetensors"), "must be a file of the directory itself (no path)"),
    ("qwen2-sharded", _index_names("/etc/passwd"), "must be a file of the directory itself (no path)"),
    ("qwen2-sharded", _shard_links_out, "outside"),
    # sizes checked before anything is built or allocated
    ("llama-single", _set_config(hidden_size=1e6), "hidden_size must be a positive integer; got 1000000.0"),
    ("llama-single", _set_config(num_hidden_layers=100_000),
     "num_hidden_layers must be an integer in [0, 1,024]; got 100000"),
    ("llama-single", _set_config(intermediate_size=10**9), "intermediate_size must be an integer in"),
    ("llama-single", _set_config(hidden_size=4096), "in the weights; config.json says vocab_size x hidden_size"),
    ("llama-single", _set_config(num_hidden_layers=7), "layers; config.json says num_hidden_layers = 7"),
    ("qwen2-sharded", _lfs_pointers, "is a git-lfs pointer file, not the weights: run `git lfs pull`"),
    ("llama-single", _lfs_pointers, "is a git-lfs pointer file, not the weights: run `git lfs pull`"),
])
def test_broken_directories_give_one_line_errors(hf_dirs, tmp_path, capsys, kind, edit, message):
    hf = tmp_path / "broken"
    shutil.copytree(hf_dirs[kind], hf)
    edit(hf)
    assert main(["import", str(hf), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    # nothing half-written is left to block the retry: the same error again, not "is not empty"
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    (tmp_path / "empty").mkdir()
    assert main(["import", str(hf), str(tmp_path / "empty")]) == 2
    assert message in capsys.readouterr().err and (tmp_path / "empty").is_dir()
    assert not any((tmp_path / "empty").iterdir())  # a directory given empty stays, emptied


def test_default_window_error_names_max_position_embeddings(hf_dirs, tmp_path):
    hf = tmp_path / "short"
    shutil.copytree(hf_dirs["llama-single"], hf)
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 40}))
    with pytest.raises(CheckpointError, match=re.escape("the default window min(2048, max_position_embeddings) "
                                                        "is 40: the model's max_position_embeddings (40)")):
        import_hf(hf, tmp_path / "out")
