"""worker.runtime.device in this process: launch then collect equals run_batch; the thread device gives
run_batch's own outputs."""

from __future__ import annotations

import numpy as np

from bench.queue_bench import short_rows
from vela2.scoring import pipeline
from vela2.scoring.pipeline import launch_batch, prepare, run_batch
from worker.runtime.device import ThreadDevice


def _same(left, right) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        assert a.options.keys() == b.options.keys() and a.spans.keys() == b.spans.keys()
        for q in a.options:
            np.testing.assert_allclose(a.options[q], b.options[q], rtol=1e-5, atol=1e-6)
        for q in a.spans:
            np.testing.assert_allclose(a.spans[q], b.spans[q], rtol=1e-5, atol=1e-6)


def _batches(demo_model, prefix: str, n: int = 12, size: int = 4) -> list[list]:
    seqs = [s for r in short_rows(n, prefix) for s in prepare(demo_model, r).sequences]
    return [seqs[i : i + size] for i in range(0, len(seqs), size)]


def test_launch_then_collect_equals_run_batch(demo_model):
    """launch_batch queues a batch and Launched.outputs() collects it later: run_batch's outputs,
    with a second batch launched before the first is collected."""
    first, second, *_ = _batches(demo_model, "lc-")
    a, b = launch_batch(demo_model, first, "fp32"), launch_batch(demo_model, second, "fp32")
    assert a.done() and b.done()  # on a CPU the work is done at launch
    _same(a.outputs(), run_batch(demo_model, first, "fp32"))
    _same(b.outputs(), run_batch(demo_model, second, "fp32"))


def test_thread_device_gives_run_batch_outputs(demo_model):
    dev = ThreadDevice(pipeline, demo_model, "fp32", None)
    try:
        batch = _batches(demo_model, "td-")[0]
        _same(dev.submit(batch).result(60).outputs, run_batch(demo_model, batch, "fp32"))
    finally:
        dev.close()


