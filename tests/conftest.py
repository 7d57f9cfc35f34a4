"""Fixtures of every test: the demo checkpoint and its model.

The demo is trained (about two minutes on one core) once per version of the code that makes it
(`vela2/`, and torch / transformers / tokenizers) and kept under `$XDG_CACHE_HOME/vela2-tests/demo/
<digest>/` (~/.cache by default): later runs, other clones of the same code and every xdist worker
copy it instead of training again, and a change to `vela2/` trains a new one, so the demo's tests
always measure the model the code under test makes.

Process fixtures (redis-server, workers, the HTTP route) live in tests/integration/conftest.py; a
unit test starts no process (tests/unit/conftest.py holds it to that).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repo root first: the checkout under test, not an installed copy
    sys.path.insert(0, str(ROOT))

import vela2  # noqa: E402

DEMO_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vela2-tests" / "demo"


def demo_digest() -> str:
    """The identity of the code that makes the demo: every file of vela2/, the versions of the
    libraries it trains with, the machine's architecture."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "vela2").rglob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for dist in ("torch", "transformers", "tokenizers"):
        h.update(f"{dist}=={version(dist)}\0".encode())
    h.update(platform.machine().encode())
    return h.hexdigest()[:16]


def copy_of_cached_demo(dest: Path) -> Path:
    """A copy at `dest` of the demo checkpoint of this code, trained now if no earlier run (or xdist
    worker) did; copied under the lock, so that no other session removes it meanwhile."""
    DEMO_CACHE.mkdir(parents=True, exist_ok=True)
    digest = demo_digest()
    done = DEMO_CACHE / digest / "ckpt"
    with FileLock(str(DEMO_CACHE / "train.lock")):
        if not (done / "config.json").exists():
            for old in DEMO_CACHE.iterdir():  # demos of older code: never used again
                if old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)
            partial = DEMO_CACHE / digest / "partial"
            shutil.rmtree(partial, ignore_errors=True)
            vela2.init_demo(partial)
            partial.rename(done)
        return Path(shutil.copytree(done, dest))


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo checkpoint directory: a copy of the cached demo of this code (tests may write in it).

    VELA2_TEST_DEMO_DIR=DIR copies a checkpoint `vela2 init-demo` already wrote instead (an inner loop
    while the demo's code changes in ways that cannot change the model; CI never sets it)."""
    dest = tmp_path_factory.mktemp("demo") / "ckpt"
    if given := os.environ.get("VELA2_TEST_DEMO_DIR"):
        return Path(shutil.copytree(given, dest))
    return copy_of_cached_demo(dest)


@pytest.fixture(scope="session")
def untrained_demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model before training (seeded random weights) as a checkpoint: what the tests of
    `vela2 train` start from."""
    from vela2.model.checkpoint import save
    from vela2.train.demo_model import untrained_demo_model

    path = tmp_path_factory.mktemp("demo-untrained") / "ckpt"
    save(untrained_demo_model(), path)
    return path


@pytest.fixture(scope="session")
def demo_model(demo_dir: Path):
    """The demo model held in float32 (runs precision fp32 and bf16). Tests must not mutate it (a test
    that swaps its calibration restores it)."""
    import torch

    return vela2.load(demo_dir, dtype=torch.float32)
