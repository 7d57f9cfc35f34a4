"""The fault suite's parts that need no process (bench.faults): the fuzz, the report's summary
figures, the accounting of stored answers, the command line's choices. The suite end to end:
tests/integration/bench/test_reliability.py; the full suite runs with `make reliability`."""

from __future__ import annotations

from bench.faults.fuzz import run_fuzz


def test_fuzz_reports_inputs_tried_and_crashes(demo_model):
    report = run_fuzz(demo_model, examples=15, seed_=3)
    assert set(report["targets"]) == {"decode_body", "parse_row", "system_one", "render"}
    for t in report["targets"].values():
        assert t["tried"] == 15 and t["tried"] == t["accepted"] + t["refused"] + t["crashes"]
    assert report["crashes"] == 0


def test_the_scenarios_keep_their_names_and_order():
    from bench.faults import registry

    assert list(registry.SCENARIOS) == [
        "sigkill", "sigterm", "redis_restart", "malformed", "oversized", "oom", "duplicate", "visibility", "poison",
        "redis_down", "redis_full", "bad_id", "queue_items", "deep_body", "start_failures",
        "tenant_quota", "cell_down"]
    assert list(registry.AMQP_SCENARIOS) == [
        "sigkill", "sigterm", "broker_drop", "broker_restart", "duplicate", "poison", "malformed"]
    assert registry.table(True) is registry.AMQP_SCENARIOS and registry.table(False) is registry.SCENARIOS


def test_the_tracker_counts_statuses_lost_and_changed_answers():
    import json

    import fakeredis

    from bench.faults.accounting import Tracker, classify, error_message, error_type
    from bench.faults.report import Outcome
    from vela2.wire import keys

    tr = Tracker("redis://127.0.0.1:1/0")  # a client connects on first use: swapped for a fake
    tr.r = fakeredis.FakeRedis()
    ok = json.dumps({"vela2": {"status": "ok"}})
    err = json.dumps({"vela2": {"status": "error", "error": {"type": "invalid_request", "message": "no text"}}})
    tr.r.set(keys.result_key("a"), ok)
    tr.r.set(keys.result_key("b"), err)
    tr.r.set(keys.result_key("c"), json.dumps({"status": "SUCCESS"}))  # Celery's own
    tr.add(["a", "b", "c", "d"])
    tr.add(["a"])  # known ids are not added twice
    assert tr.poll() == 1 and tr.missing() == ["d"]
    tr.r.set(keys.result_key("a"), err)  # a changed answer
    out = Outcome("x")
    raws = out.settle(tr)
    assert (out.requests, out.answered_ok, out.answered_error, out.lost, out.duplicate_answers_changed) == (
        4, 1, 2, 1, 1)
    assert out.notes["lost_ids"] == ["d"] and not out.to_json()["passed"]
    assert classify(raws["c"]) == "ok" and classify(None) is None and classify(b"not json") == "error"
    assert error_type(raws["b"]) == "invalid_request" and error_message(raws["b"]) == "invalid_request: no text"


def test_the_summary_fails_a_run_that_lost_one_and_lists_every_run():
    from bench.faults.report import Outcome, summarize, table

    runs = [Outcome("a", run=1, requests=3, answered_ok=3), Outcome("a", run=2, requests=3, answered_ok=2, lost=1)]
    skipped = Outcome("b", requests=1, answered_ok=1)
    skipped.skip("a claim", "not here")
    report = summarize({"scenarios": [o.to_json() for o in [*runs, skipped]], "fuzz": {"crashes": 0,
                                                                                         "inputs_tried": 4}})
    assert report["lost"] == 1 and report["changed"] == 0 and not report["passed"]
    assert report["runs"]["a"]["lost"] == [0, 1] and report["runs"]["a"]["passed"] == [True, False]
    assert report["runs"]["b"]["passed"] == [True]
    lines = table(report)
    assert "FAILED" in lines[2] and lines[-1] == "fuzz: 4 inputs tried, 0 crashes"
    assert summarize({"scenarios": [runs[0].to_json()], "soak": {"lost": 1}})["passed"] is False


def test_the_command_line_refuses_unknown_scenarios_and_bad_options(capsys):
    import pytest

    from bench.faults.cli import main, parser, scenario_names, worker_settings

    for argv in (["--only", "sigkill,nope"], ["--broker", "redis://127.0.0.1:6379/0"], ["--repeat", "0"],
                 ["--broker", "amqp://g:g@127.0.0.1:5672", "--only", "redis_full"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
    assert "unknown scenarios ['nope']" in capsys.readouterr().err
    p = parser()
    assert scenario_names(p, p.parse_args(["--only", "none"])) == []
    assert scenario_names(p, p.parse_args(["--only", "oom, malformed"])) == ["oom", "malformed"]
    assert scenario_names(p, p.parse_args(["--broker", "amqp://g:g@h:5672"]))[2] == "broker_drop"
    assert worker_settings(p.parse_args(["--cpu-processes", "1", "--device-process", "1"])) == {
        "cpu_processes": 1, "device_process": 1}
    assert worker_settings(p.parse_args([])) == {}


def test_the_fault_suite_modules_stay_small():
    """One concept per module, a function on one screen (the product code's house rule)."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[3] / "bench" / "faults"
    found = []
    for path in sorted(package.glob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 600:
            found.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                found.append(f"{path.name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert found == []
