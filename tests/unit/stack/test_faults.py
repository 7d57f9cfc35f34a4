"""Fault injection lives outside the product: a pipeline wrapper the tests pass in (stack.faults)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest

from stack.faults import Faults, FaultyPipeline, parse_argv
from worker.runtime.warmup import WARMUP_ID


@dataclass
class Seq:
    row_id: str
    num_tokens: int = 10


class Pipeline:
    calls = 0

    def run_batch(self, model, sequences, precision, row_tokens=None):
        self.calls += 1
        return [None] * len(sequences)

    def prepare(self, model, obj):
        return "prepared"


def test_no_faults_means_the_pipeline_itself():
    pipe = Pipeline()
    assert Faults()(pipe) is pipe


def test_failures_hit_requests_never_the_warm_up_batch():
    pipe = Faults(fail_prefix="bad-", oom_above_tokens=15)(Pipeline())
    assert isinstance(pipe, FaultyPipeline)
    assert pipe.prepare(None, {}) == "prepared"  # every other step is the pipeline's own
    assert pipe.run_batch(None, [Seq(WARMUP_ID, 100)], "fp32") == [None]
    assert pipe.run_batch(None, [Seq("ok-1")], "fp32", None) == [None]
    with pytest.raises(RuntimeError, match="simulated"):
        pipe.run_batch(None, [Seq("ok-1"), Seq("bad-1")], "fp32")
    with pytest.raises(RuntimeError, match="20 padded tokens > 15"):
        pipe.run_batch(None, [Seq("ok-1"), Seq("ok-2")], "fp32")


def test_faults_cross_into_a_process_and_onto_a_command_line():
    """A Faults value is pickled into the device process and written as `python -m stack.faults`
    options; both give the same faults back."""
    faults = Faults(delay_s=0.25, fail_prefix="bad-", crash_prefix="boom-", oom_above_tokens=600)
    assert pickle.loads(pickle.dumps(faults)) == faults
    assert parse_argv([*faults.argv(), "--", "--loglevel", "INFO"]) == (faults, ["--loglevel", "INFO"])
    assert parse_argv([]) == (Faults(), [])


def test_the_product_reads_no_fault_from_the_environment():
    """No module of the worker, the producer or the model library names a test variable."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    found = [str(p.relative_to(root)) for pkg in ("vela2", "worker", "producer") for p in (root / pkg).rglob("*.py")
             if "VELA2_TEST_" in p.read_text(encoding="utf-8") and p.name != "pytest_plugin.py"]
    assert found == []
