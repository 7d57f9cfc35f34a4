"""`vela2 jobs submit --wait` and `vela2 backfill` report progress on a stderr that is no terminal
(what make and CI show): a first line, whole lines (no bar), a last line at the total; stdout keeps
only what scripts read (the job id, the summary). In process, on fakeredis with the FakeWorker's
thread answering."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest

from producer.backfill import cli as backfill_cli
from producer.backfill import run as backfill_run
from producer.client import Client
from producer.jobs import cli as jobs_cli
from producer.testing import FakeWorker

MODEL = "vela2-demo"


@pytest.fixture
def redis() -> Iterator[fakeredis.FakeRedis]:
    r = fakeredis.FakeRedis()
    yield r
    r.flushall()


def _rows(path: Path, n: int) -> Path:
    rows = [{"id": f"r-{i}", "task": "choice:boolq", "text": f"text {i}",
             "questions": [{"question": "Is it?", "options": ["yes", "no"]}]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _progress(err: str, label: str) -> list[str]:
    assert "\r" not in err, err  # no bar off a terminal
    return [line for line in err.splitlines() if line.startswith(f"{label}: ")]


def test_jobs_wait_follows_the_job_in_progress_lines_and_stdout_keeps_the_id(redis, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(jobs_cli, "Client", lambda url, **kw: Client(redis=redis, **kw))
    src = _rows(tmp_path / "in.jsonl", 6)
    with FakeWorker(redis, MODEL):
        assert jobs_cli.main(["submit", str(src), "--wait", "--model", MODEL]) == 0
    out, err = capsys.readouterr()
    [job] = out.split()
    assert job.startswith("batch_")
    lines = _progress(err, f"job {job}")
    assert len(lines) >= 2, err
    assert lines[0].startswith(f"job {job}: line ") and lines[0].endswith("0 s elapsed")
    last = lines[-1]
    assert last.startswith(f"job {job}: line 6/6 (100%), ") and "done in" in last, last
    assert "status completed" in last and "ok 6" in last and "error 0" in last


def test_backfill_reports_its_lines_unless_told_not_to(redis, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(backfill_run, "Client", lambda url, **kw: Client(**{**kw, "redis": redis}))
    src = _rows(tmp_path / "in.jsonl", 8)
    with FakeWorker(redis, MODEL):
        assert backfill_cli.main([str(src), str(tmp_path / "out.jsonl"), "--model", MODEL, "--poll-s", "0.01"]) == 0
        out, err = capsys.readouterr()
        lines = _progress(err, "backfill")
        assert len(lines) >= 2 and lines[0] == "backfill: line 0/8 (0%), 0 s elapsed", err
        assert lines[-1].startswith("backfill: line 8/8 (100%), ") and "done in" in lines[-1], lines
        assert len(out.splitlines()) == 1 and out.startswith("backfill: 8 rows: ok 8")  # stdout: the summary alone

        assert backfill_cli.main([str(src), str(tmp_path / "again.jsonl"), "--model", MODEL, "--poll-s", "0.01",
                                  "--no-progress"]) == 0
        out, err = capsys.readouterr()
        assert _progress(err, "backfill") == [] and len(out.splitlines()) == 1
