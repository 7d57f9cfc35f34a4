"""The fault suite end to end at a tiny scale: real redis-server, real worker processes, the JSON
report and the exit status (bench.faults). The full suite runs with `make reliability`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.faults import registry
from bench.faults.accounting import Tracker
from bench.faults.cli import main
from bench.faults.context import Suite
from bench.faults.report import Outcome
from bench.faults.runner import cpu_hogs
from stack.harness import find_redis_server
from vela2.wire import keys

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
    assert main(argv) == 0
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
    assert malformed["notes"]["error_answers"]["wrongtask"].startswith("invalid_request")  # refused by the channel
    assert malformed["notes"]["dead_letter_entries"] == malformed["notes"]["injected"]["unanswerable_items"]
    assert oom["notes"]["raised"] > 0 and oom["answered_error"] == 2  # the two oom- requests, alone
    assert report["fuzz"]["inputs_tried"] == 4 * 20 and report["fuzz"]["crashes"] == 0


@pytest.mark.integration
@pytest.mark.usefixtures("_need_redis_server")
def test_queue_items_and_bad_id_scenarios_pass_at_a_tiny_scale(tmp_path: Path, demo_dir: Path):
    out = tmp_path / "reliability.json"
    argv = ["--only", "queue_items,bad_id", "--scale", "0.05", "--fuzz-examples", "0", "--checkpoint", str(demo_dir),
            "--out", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    items, bad_id = report["scenarios"]
    assert [items["name"], bad_id["name"]] == ["queue_items", "bad_id"]
    for s in report["scenarios"]:
        assert FIELDS <= set(s) and s["run"] == 1
        assert s["passed"] and s["lost"] == 0 and s["duplicate_answers_changed"] == 0, s["checks"]
    plain = items["notes"]["plain"]
    assert "envelope headers must be an object; got list" in plain["error_answers"]["qiplain-hlist"]
    assert any("nested deeper than 64 levels" in r for r in plain["dead_letter_reasons"])
    assert "protocol 1" in plain["error_answers"]["qiplain-proto1"]
    assert "differs from its message id" in plain["error_answers"]["qiplain-mm-head"]
    assert plain["error_answers"]["qiplain-mm-body"] == plain["error_answers"]["qiplain-mm-head"]
    # the TLS run happened, or says why not (never silently)
    tls = [c for c in items["checks"] if c["check"].startswith("[tls]") or "rediss://" in c["check"]]
    assert tls and all(c["ok"] for c in tls) and ("tls" in items["notes"] or tls[0].get("skipped"))
    assert len(bad_id["notes"]["dead_letter_reasons"]) == 2
    assert all("not valid Unicode" in r for r in bad_id["notes"]["dead_letter_reasons"])
    assert bad_id["notes"]["duplicates_skipped"] == 0


@pytest.mark.integration
@pytest.mark.usefixtures("_need_redis_server")
def test_repeat_reports_every_run_and_fails_when_one_run_loses(monkeypatch, tmp_path: Path, demo_dir: Path):
    calls = []

    def flaky(s: Suite, out: Outcome) -> None:
        calls.append(out.run)
        r = s.redis()
        tr = Tracker(r.url())
        tr.add([f"sent-{out.run}"])
        r.client().set(keys.result_key(f"sent-{out.run}"), json.dumps({"status": "SUCCESS"}))
        if out.run == 2:
            tr.add(["never-sent"])  # the second run loses one
        out.settle(tr)
        tr.close()

    monkeypatch.setitem(registry.SCENARIOS, "flaky", flaky)
    out = tmp_path / "r.json"
    code = main(["--only", "flaky", "--repeat", "3", "--cpu-hog", "1", "--fuzz-examples", "0",
                             "--checkpoint", str(demo_dir), "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 1 and calls == [1, 2, 3]
    assert [(s["run"], s["lost"], s["passed"]) for s in report["scenarios"]] == [(1, 0, True), (2, 1, False),
                                                                                   (3, 0, True)]
    assert report["runs"]["flaky"]["lost"] == [0, 1, 0] and report["lost"] == 1
    assert report["repeat"] == 3 and report["cpu_hog"] == 1


@pytest.mark.integration
def test_cpu_hogs_run_beside_and_stop_with_the_block():
    with cpu_hogs(2, max_s=60) as hogs:
        assert len(hogs) == 2 and all(h.poll() is None for h in hogs)
    assert all(h.poll() is not None for h in hogs)
    with cpu_hogs(1, max_s=0.2) as hogs:  # bounded on its own too
        assert hogs[0].wait(30) == 0


@pytest.mark.integration
@pytest.mark.usefixtures("_need_redis_server")
def test_a_lost_request_fails_the_suite(monkeypatch, tmp_path: Path, demo_dir: Path):
    def loses_one(s: Suite, out: Outcome) -> None:
        r = s.redis()
        tr = Tracker(r.url())
        tr.add(["never-sent"])
        out.settle(tr)
        tr.close()

    monkeypatch.setitem(registry.SCENARIOS, "loses_one", loses_one)
    out = tmp_path / "r.json"
    code = main(
        ["--only", "loses_one", "--fuzz-examples", "0", "--checkpoint", str(demo_dir), "--out", str(out)]
    )
    report = json.loads(out.read_text())
    assert code == 1
    assert report["lost"] == 1 and report["scenarios"][0]["notes"]["lost_ids"] == ["never-sent"]




def test_one_tenant_exhausting_its_quota_leaves_the_other_unaffected(tmp_path: Path, demo_dir: Path):
    out = tmp_path / "reliability.json"
    argv = ["--only", "tenant_quota", "--scale", "0.2", "--fuzz-examples", "0", "--checkpoint", str(demo_dir),
            "--out", str(out)]
    assert main(argv) == 0
    (s,) = json.loads(out.read_text())["scenarios"]
    assert s["passed"] and s["lost"] == 0, s["checks"]
    noisy = s["notes"]["noisy"]
    assert noisy["by_status"].get("429") and set(noisy["refused_quotas"]) <= {"quota requests_per_s", "quota queued"}
    assert s["requests"] == s["answered_ok"] >= s["notes"]["quiet"]["sent"]


def test_a_cell_down_stalls_only_its_own_ids_and_loses_nothing(tmp_path: Path, demo_dir: Path):
    out = tmp_path / "reliability.json"
    argv = ["--only", "cell_down", "--scale", "0.2", "--fuzz-examples", "0", "--checkpoint", str(demo_dir),
            "--out", str(out)]
    assert main(argv) == 0
    (s,) = json.loads(out.read_text())["scenarios"]
    assert s["passed"] and s["lost"] == 0 and s["duplicate_answers_changed"] == 0, s["checks"]
    assert s["requests"] == s["answered_ok"] == sum(s["notes"]["requests_per_cell"])
    assert all(s["notes"]["requests_per_cell"]) and s["notes"]["cell_a_answers_while_b_down"] > 0
