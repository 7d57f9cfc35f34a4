"""worker.runtime.startup.use_compile_cache: where torch.compile's caches go (settings.compile_cache_dir)."""

from __future__ import annotations

import os

import pytest

from vela2.errors import ConfigError
from worker.runtime.startup import use_compile_cache

VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE")


def test_the_caches_go_under_the_directory_and_stay_on(tmp_path, monkeypatch):
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    use_compile_cache(str(tmp_path / "cc"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cc" / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "cc" / "triton")
    assert (tmp_path / "cc" / "inductor").is_dir() and (tmp_path / "cc" / "triton").is_dir()
    assert os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1" and os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    assert list((tmp_path / "cc" / "inductor").iterdir()) == []  # the write test leaves nothing behind


def test_none_leaves_torch_its_own_and_an_unwritable_directory_is_named(tmp_path, monkeypatch):
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    use_compile_cache(None)
    assert not any(name in os.environ for name in VARS)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match=rf"compile_cache_dir {blocker}/cc: cannot write there"):
        use_compile_cache(str(blocker / "cc"))
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
