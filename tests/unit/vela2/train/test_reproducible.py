"""vela2.train.reproducible: the CPU kernels pinned, so every x86-64 machine trains the same demo."""

from __future__ import annotations

import json
import platform

import pytest

from vela2.train import demo_model, reproducible


def test_the_suite_runs_pinned_and_the_settings_name_avx2_on_x86():
    if platform.machine().lower() in reproducible.X86:
        assert reproducible.pinned_settings() == reproducible.PINNED
        assert reproducible.PINNED["ATEN_CPU_CAPABILITY"] == "avx2"
    assert reproducible.is_pinned()  # tests/conftest.py pinned this process before torch was imported
    assert not reproducible.is_pinned({}) or not reproducible.pinned_settings()


def test_an_unpinned_process_trains_the_demo_in_a_pinned_child(monkeypatch, tmp_path):
    for key in reproducible.PINNED:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(reproducible, "pinned_settings", lambda: dict(reproducible.PINNED))
    calls = []
    monkeypatch.setattr(demo_model.subprocess, "run", lambda argv, env, check: calls.append((argv, env)))
    monkeypatch.setattr(demo_model, "build_demo_model", lambda *a, **k: pytest.fail("trained in this process"))
    assert demo_model.init_demo(tmp_path / "demo", progress=False) == tmp_path / "demo"
    [(argv, env)] = calls
    assert argv[-2:] == [str(tmp_path / "demo"), json.dumps(False)] and "init_demo(" in argv[2]
    assert all(env[k] == v for k, v in reproducible.PINNED.items())
