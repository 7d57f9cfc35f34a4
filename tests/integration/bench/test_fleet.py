"""bench.fleet end to end, tiny: one and two cells of real redis-servers, a fake worker process and a
producer process per cell; the JSON says what it promises (per-cell Redis figures, ratios beside the
goals, what bounded each run) and nothing was lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stack.harness import find_redis_server

ROOT = Path(__file__).resolve().parents[3]
RUN_TIMEOUT_S = 240


def test_fleet_over_one_and_two_cells_answers_everything(tmp_path):
    if find_redis_server() is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    out = tmp_path / "fleet.json"
    argv = ["--cells", "1", "2", "--seconds", "2", "--warmup-s", "1", "--workers-per-cell", "1",
            "--producers-per-cell", "1", "--batch", "16", "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "bench.fleet", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(out.read_text())
    assert got["command"] == "python -m bench.fleet " + " ".join(argv)
    assert got["machine"]["cpu_count"] >= 1 and got["redis"]["persistence"].startswith("none")
    assert set(got["runs"]) == {"1", "2"} and got["lost"] == 0
    for n in (1, 2):
        run = got["runs"][str(n)]
        assert run["cells"] == n and run["fake_workers"] == n and run["producers"] == n
        assert run["lost"] == 0 and run["not_ok"] == 0
        assert run["answered"] == run["submitted"] > 0 and run["answered_in_window"] > 0
        assert run["requests_per_s"] > 0 and run["stored_by_fake_workers"] == run["submitted"]
        assert [c["cell"] for c in run["per_cell"]] == [f"c{i}" for i in range(n)]
        for cell in run["per_cell"]:
            assert cell["commands_per_s"] > 0 and 0 < cell["redis_main_thread_cpu"] < 1.5
            assert cell["slots_share"] == pytest.approx(1 / n, abs=1e-3)
        assert run["redis_commands_per_request"] > 3 and run["redis_cpu_us_per_request"] > 0
        assert set(run["cores_used"]) == {"redis", "fake_workers", "producers"}
        assert run["machine"]["cpu_count"] >= 1 and len(run["machine"]["loadavg_1_5_15_at_end"]) == 3
        assert got["bound_by"][str(n)] == run["bound_by"] and run["bound_by"].split(":")[0] in {
            "redis", "machine CPU", "fake workers", "producers", "neither"}
        assert got["one_cell_carries"][str(n)]["requests_per_s"] == run["requests_per_s_per_cell"]
    two = got["ratios"]["2"]
    assert two["goal"] == 1.8 and isinstance(two["met"], bool) and two["throughput_ratio"] > 0
    assert got["ratios"]["4"]["met"] is None  # not run: said so, not guessed
