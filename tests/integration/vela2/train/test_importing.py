"""vela2 import streams a sharded checkpoint: its peak memory, measured in a process of its own."""

from __future__ import annotations

from bench.import_rss import measure


def test_streamed_import_peak_memory():
    """A ~150M-parameter model (~290 MB bf16, an 8k vocabulary: the layers dominate) imports holding
    well under one copy of it (a non-streamed import holds at least one: its state dict)."""
    report = measure(150, shard_max_mb=32, vocab=8_000)
    assert report["hf_weights_mb"] > 250
    assert report["import_over_baseline_mb"] < 0.75 * report["hf_weights_mb"], report


