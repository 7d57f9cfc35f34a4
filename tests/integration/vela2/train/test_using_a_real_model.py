"""The docs' own-model walk-through (docs/model/index.md) runs as written: import a generated tiny qwen2,
train, calibrate, evaluate; the trained checkpoint beats the imported one and serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import vela2
from bench.import_rss import make_hf_dir
from tests.unit.test_docs import examples

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.integration  # subprocesses
def test_the_worked_example_runs(tmp_path):
    make_hf_dir(tmp_path / "hf", "qwen2", max_shard_size="100KB")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT)}
    [walk_through] = examples("byom")
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", walk_through], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    trained = json.loads((tmp_path / "eval.json").read_text())
    assert trained["model"] == "my-scorer" and not trained["skipped"]
    assert set(trained["tasks"]) == {"span:pii", "choice:intent", "choice:sentiment",
                                     "score:satisfaction", "set:toxicity"}
    untrained = subprocess.run([sys.executable, "-m", "vela2.cli", "eval", "--checkpoint", "ckpt/", "test.jsonl",
                                "--json", "eval0.json"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert untrained.returncode == 0, untrained.stderr[-2000:]
    before = json.loads((tmp_path / "eval0.json").read_text())["tasks"]
    assert trained["tasks"]["span:pii"]["f1"] > before["span:pii"]["f1"]
    model = vela2.load(tmp_path / "trained")
    [res] = vela2.predict(model, [json.loads((tmp_path / "test.jsonl").read_text().splitlines()[0])],
                          precision="fp32")
    assert res.status == "ok"
