"""The load tool's pure parts: nearest-rank percentiles, a point's summary, the workloads, the
command line's checks."""

from __future__ import annotations

import json

import pytest

from producer.loadtest.cli import build_parser
from producer.loadtest.report import Outcome, distribution, percentile, summarize
from producer.loadtest.workload import builtin_request, read_requests, requests
from vela2.api.schemas import parse_row
from vela2.api.systemone import parse_request


def test_percentiles_are_nearest_rank():
    values = list(range(1, 101))  # 1..100
    assert [percentile(values, p) for p in (1, 50, 90, 99, 100)] == [1, 50, 90, 99, 100]
    assert percentile([5.0], 99) == 5.0
    assert percentile([3, 1, 2], 50) == 2  # unsorted input
    assert percentile([1, 2, 3, 4], 50) == 2 and percentile([1, 2, 3, 4], 51) == 3
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match="p must be in"):
        percentile([1], 0)
    assert distribution([0.010, 0.020, 0.030], 1e3) == {"p50": 20.0, "p90": 30.0, "p99": 30.0, "max": 30.0}


def test_a_summary_counts_answers_errors_and_lost_and_what_finished_in_the_window():
    outcomes = [Outcome(0.1 * i, 0.001, 0.05, "ok", {"queue_ms": 1.0, "model_ms": 10.0}) for i in range(90)]
    outcomes += [Outcome(9.5, 0.0, 0.8, "ok", {})]  # answered after the 10 s window ended
    outcomes += [Outcome(1.0, 0.0, 0.2, "error:invalid_request", {}) for _ in range(4)]
    outcomes += [Outcome(2.0, 0.0, None, "lost", {}) for _ in range(5)]
    s = summarize(outcomes, rate=10.0, window_s=10.0)
    assert (s["sent"], s["answered"], s["ok"], s["errors"], s["lost"]) == (100, 95, 91, 4, 5)
    assert s["arrivals_per_s"] == 10.0
    assert s["completions_per_s"] == 9.4  # 94 of the 95 answers came within the window
    assert s["latency_ms"]["p50"] == 50.0 and s["latency_ms"]["max"] == 800.0
    assert s["stages_ms"]["model_ms"]["p99"] == 10.0 and s["stages_ms"]["render_ms"]["p50"] is None
    assert s["error_types"] == {"error:invalid_request": 4}


def test_built_in_workloads_are_valid_requests_with_fresh_ids():
    source = requests("rows", "vela2-demo", "run-", seed=3)
    rows = [next(source) for _ in range(50)]
    assert [r["id"] for r in rows] == [f"run-{i}" for i in range(50)]
    for r in rows:
        assert 15 <= len(parse_row(r).text.split()) <= 70
    again = requests("rows", "vela2-demo", "run-", seed=3)
    assert [next(again) for _ in range(50)] == rows  # seeded: the same run twice
    parse_request({**builtin_request("systemone", __import__("random").Random(0), "m"), "id": "x"})
    with pytest.raises(ValueError, match="workload must be one of rows, systemone"):
        next(requests("nope", "m", "p-"))


def test_a_requests_file_is_cycled_under_fresh_ids_and_a_bad_line_is_named(tmp_path):
    f = tmp_path / "reqs.jsonl"
    f.write_text(json.dumps({"id": "a", "task": "choice:x", "text": "t", "questions": []}) + "\n\n"
                 + json.dumps({"id": "b", "task": "choice:y", "text": "u", "questions": []}) + "\n")
    got = requests(str(f), "m", "p-")
    assert [(r["id"], r["task"]) for r in (next(got) for _ in range(3))] == [
        ("p-0", "choice:x"), ("p-1", "choice:y"), ("p-2", "choice:x")]
    (tmp_path / "bad.jsonl").write_text('{"id": "a"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: a request is a JSON object"):
        read_requests(tmp_path / "bad.jsonl")
    (tmp_path / "broken.jsonl").write_text('{"id": \n')
    with pytest.raises(ValueError, match=r"broken.jsonl:1 is not valid JSON"):
        read_requests(tmp_path / "broken.jsonl")


@pytest.mark.parametrize("argv, message", [
    ([], "one of the arguments --rates --loads --sequential is required"),
    (["--rates", "10,0"], "numbers > 0"),
    (["--loads", "x"], "a comma list of numbers"),
    (["--rates", "5", "--duration-s", "0"], "must be > 0"),
    (["--rates", "5", "--loads", "0.5"], "not allowed with argument"),
])
def test_the_command_line_refuses_what_it_cannot_run(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
