"""Fault injection lives outside the engine: a pipeline wrapper, applied only when asked for."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from worker import faults


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


def test_nothing_set_means_the_pipeline_itself():
    pipe = Pipeline()
    assert faults.wrap(pipe, {}) is pipe
    assert faults.Faults.from_env({"VELA2_TEST_FAIL_ID_PREFIX": ""}) is None


def test_failures_hit_requests_never_the_warm_up_batch():
    pipe = faults.wrap(Pipeline(), {faults.TEST_FAIL_ENV: "bad-", faults.TEST_OOM_ENV: "15"})
    assert pipe.prepare(None, {}) == "prepared"  # every other step is the pipeline's own
    assert pipe.run_batch(None, [Seq(faults.WARMUP_ID, 100)], "fp32") == [None]
    assert pipe.run_batch(None, [Seq("ok-1")], "fp32", None) == [None]
    with pytest.raises(RuntimeError, match="simulated"):
        pipe.run_batch(None, [Seq("ok-1"), Seq("bad-1")], "fp32")
    with pytest.raises(RuntimeError, match="20 padded tokens > 15"):
        pipe.run_batch(None, [Seq("ok-1"), Seq("ok-2")], "fp32")
