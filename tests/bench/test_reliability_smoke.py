"""The fault suite end to end at a tiny scale: real redis-server, real worker processes, the JSON
report and the exit status (bench.reliability). The full suite runs with `make reliability`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import reliability
from bench.fuzz import run_fuzz
from stack.harness import find_redis_server

FIELDS = {
    "name",
    "requests",
    "answered_ok",
    "answered_error",
    "expired",
    "lost",
    "duplicate_answers_changed",
    "seconds",
    "notes",
}


@pytest.fixture
def _need_redis_server():
    if find_redis_server() is None:
        pytest.fail("redis-server is not installed; the reliability suite needs it")


@pytest.mark.integration
@pytest.mark.usefixtures("_need_redis_server")
def test_malformed_and_oom_scenarios_lose_nothing_and_write_the_report(tmp_path: Path, demo_dir: Path):
    out = tmp_path / "reliability.json"
    argv = [
        "--only",
        "malformed,oom",
        "--scale",
        "0.05",
        "--fuzz-examples",
        "20",
        "--checkpoint",
        str(demo_dir),
        "--out",
        str(out),
    ]
    assert reliability.main(argv) == 0
    report = json.loads(out.read_text())
    names = [s["name"] for s in report["scenarios"]]
    assert names == ["malformed", "oom"]
    for s in report["scenarios"]:
        assert FIELDS <= set(s), s.keys()
        assert s["lost"] == 0 and s["duplicate_answers_changed"] == 0
        assert s["requests"] == s["answered_ok"] + s["answered_error"] + s["expired"]
        assert s["passed"] and all(c["ok"] for c in s["checks"]), s["checks"]
    malformed, oom = report["scenarios"]
    assert malformed["answered_error"] > 0 and malformed["expired"] > 0  # bad messages answered, not dropped
    assert malformed["notes"]["error_answers"]["wrongtask"].startswith("NotRegistered")
    assert oom["notes"]["raised"] > 0 and oom["answered_error"] == 2  # the two oom- requests, alone
    assert report["fuzz"]["inputs_tried"] == 4 * 20 and report["fuzz"]["crashes"] == 0


@pytest.mark.integration
@pytest.mark.usefixtures("_need_redis_server")
def test_a_lost_request_fails_the_suite(monkeypatch, tmp_path: Path, demo_dir: Path):
    def loses_one(s: reliability.Suite, out: reliability.Outcome) -> None:
        r = s.redis()
        tr = reliability.Tracker(r.url())
        tr.add(["never-sent"])
        out.settle(tr)
        tr.close()

    monkeypatch.setitem(reliability.SCENARIOS, "loses_one", loses_one)
    out = tmp_path / "r.json"
    code = reliability.main(
        ["--only", "loses_one", "--fuzz-examples", "0", "--checkpoint", str(demo_dir), "--out", str(out)]
    )
    report = json.loads(out.read_text())
    assert code == 1
    assert report["lost"] == 1 and report["scenarios"][0]["notes"]["lost_ids"] == ["never-sent"]


def test_fuzz_reports_inputs_tried_and_crashes(demo_model):
    report = run_fuzz(demo_model, examples=15, seed_=3)
    assert set(report["targets"]) == {"decode_body", "parse_row", "system_one", "render"}
    for t in report["targets"].values():
        assert t["tried"] == 15 and t["tried"] == t["accepted"] + t["refused"] + t["crashes"]
    assert report["crashes"] == 0
