"""The fault suite end to end at a tiny scale: real redis-server, real worker processes, the JSON
report and the exit status (bench.reliability). The full suite runs with `make reliability`."""

from __future__ import annotations

from bench.fuzz import run_fuzz


def test_fuzz_reports_inputs_tried_and_crashes(demo_model):
    report = run_fuzz(demo_model, examples=15, seed_=3)
    assert set(report["targets"]) == {"decode_body", "parse_row", "system_one", "render"}
    for t in report["targets"].values():
        assert t["tried"] == 15 and t["tried"] == t["accepted"] + t["refused"] + t["crashes"]
    assert report["crashes"] == 0
