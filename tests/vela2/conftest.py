"""Session fixtures shared by the vela2 tests: the demo checkpoint (written once) and its model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import vela2


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo checkpoint directory, written once per session by `vela2.init_demo`."""
    return vela2.init_demo(tmp_path_factory.mktemp("demo") / "ckpt")


@pytest.fixture(scope="session")
def demo_model(demo_dir: Path):
    """The demo model held in float32 (runs precision fp32 and bf16). Tests must not mutate it
    (a test that swaps its calibration restores it)."""
    return vela2.load(demo_dir, dtype=torch.float32)
