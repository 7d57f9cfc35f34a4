"""Getting a process ready to serve: the warm-up batches a worker runs before it says it is ready
(the worst batch, measured for the visibility rule; short rows shaped like traffic), and the garbage
collector's freeze of what start-up made."""

from __future__ import annotations

import gc
import logging
import sys
import time
from typing import Any

from vela2.text.packing import pack
from worker.settings import EngineSettings

log = logging.getLogger(__name__)

WARMUP_ID = "vela2-warmup"  # the id of the worker's start-up rows (faults spare them)

# Allocations between two young collections while serving (Python's default is 700). Requests live
# for a second or so in a worker (buffered, rendered, batched, stored), so at 700 they outlived
# young collections by the thousand and their survivors set off full collections: on the H200
# host 15 of them, ~0.1 s each with the GIL held, in a 10 s phase of short rows (bench.hotpath's
# `worker_gc`). A young collection of this many objects takes a millisecond or two.
SERVING_GC_THRESHOLD = 20_000


def freeze_startup_objects() -> None:
    """Move everything start-up made (imports, the tokenizer, the model's Python objects) out of the
    garbage collector's reach, so a full collection walks only what serving allocates (without it
    each walked them all, ~0.2 s on the 2-core CPU machine), and collect the young generation every
    SERVING_GC_THRESHOLD allocations instead of every 700."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(SERVING_GC_THRESHOLD, *gc.get_threshold()[1:])


WARMUP_WORDS = (
    "Alice from Acme wrote to the support team about order 4471 and the refund was sent "
    "on Monday while the weather in the city stayed green and quiet"
).split()
WARMUP_TRAFFIC_ROWS = (2, 5)  # batches of this many packed rows of short rows run at start-up on a GPU (below)


def warmup_row(max_window_tokens: int) -> dict[str, Any]:
    """A long synthetic row (choice + span blocks) whose windows fill `max_window_tokens`."""
    words = WARMUP_WORDS
    n = max_window_tokens * 2
    return {
        "id": WARMUP_ID,
        "task": "choice:warmup",
        "text": " ".join(words[i % len(words)] for i in range(n)),
        "questions": [
            {"question": "Is the customer satisfied?", "options": ["yes", "no"]},
            {"task": "span:warmup", "labels": ["person", "company"]},
        ],
    }


def measure_worst_batch_s(model: Any, settings: EngineSettings, pipeline: Any = None) -> float:
    """Run one batch at `max_batch_tokens` (copies of the longest window of `warmup_row`) twice;
    returns the second, warm time in seconds (the first pays one-off start-up costs)."""
    if pipeline is None:
        import vela2.scoring.pipeline as pipeline
    prep = pipeline.prepare(model, warmup_row(model.config.max_window_tokens))
    longest = max(prep.sequences, key=lambda s: s.num_tokens)
    batch = [longest] * max(1, settings.max_batch_tokens // longest.num_tokens)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        pipeline.run_batch(model, batch, settings.precision, settings.row_tokens or None)
        _synchronize(model)
        times.append(time.perf_counter() - t0)
    # and one short sequence alone: the first small batch would otherwise pay its own one-off costs
    # (kernel choices for small shapes; measured on an H200: 0.5-1.3 s for a first batch of a few rows)
    short = pipeline.prepare(model, {**warmup_row(model.config.max_window_tokens), "text": "Alice from Acme wrote"})
    pipeline.run_batch(model, short.sequences, settings.precision, settings.row_tokens or None)
    _synchronize(model)
    log.info(
        "warm-up batch: %d x %d tokens in %.3f s (first %.3f s)", len(batch), longest.num_tokens, times[1], times[0]
    )
    if getattr(getattr(model, "device", None), "type", None) == "cuda":
        warm_traffic(model, settings, pipeline)
    return times[1]


def warmup_short_rows(n: int) -> list[dict[str, Any]]:
    """n short rows of 5-60 words (a choice question; every third also a span block of 1-3
    labels), all with the warm-up id: the shape of online traffic."""
    rows = []
    for i in range(n):
        k = 5 + (i * 7) % 56
        questions: list[dict[str, Any]] = [{"question": "Is the customer satisfied?",
                                            "options": ["yes", "no", "maybe"][: 2 + i % 2]}]
        if i % 3 == 0:
            questions.append({"task": "span:warmup", "labels": ["person", "company", "date"][: 1 + i % 3]})
        rows.append({"id": WARMUP_ID, "task": "choice:warmup", "questions": questions,
                     "text": " ".join(WARMUP_WORDS[(i + j) % len(WARMUP_WORDS)] for j in range(k))})
    return rows


def warm_traffic(model: Any, settings: EngineSettings, pipeline: Any) -> None:
    """Run a batch of short rows packed as the engine packs them for each row count of
    WARMUP_TRAFFIC_ROWS, then capture the CUDA graphs of traffic's one-row shapes. A fresh CUDA
    process pays one-off costs on its first batches of a new kind (compiled code for the dynamic
    shapes of multi-row batches, device memory grown): paid here, before the worker says it is
    ready, on batches as small as trigger them. (Three full batches of short rows did the same in
    5.5-6 s on the H200 with the 9B shape, most of it plain compute: bench/results/gpu-coldstart.json.)"""
    row_tokens = settings.row_tokens or model.config.max_window_tokens
    rows = warmup_short_rows(1 + 2 * max(WARMUP_TRAFFIC_ROWS) * row_tokens // 100)
    seqs = [s for row in rows for s in pipeline.prepare(model, row).sequences]
    t0 = time.perf_counter()
    for n_rows in WARMUP_TRAFFIC_ROWS:
        batch = pack([s.num_tokens for s in seqs], n_rows * row_tokens, settings.row_tokens or None)[0]
        pipeline.run_batch(model, [seqs[i] for i in batch], settings.precision, settings.row_tokens or None)
    pipeline.run_batch(model, seqs[:24], settings.precision, settings.row_tokens or None)
    _synchronize(model)
    log.info("warm-up traffic: %d batches of short rows in %.3f s", len(WARMUP_TRAFFIC_ROWS) + 1,
             time.perf_counter() - t0)
    from vela2.model import fused  # torch: loaded by now, as the model is

    t0 = time.perf_counter()
    captured = fused.capture_traffic_graphs(model, settings.precision or "bf16", settings.row_tokens or None)
    log.info("warm-up: %d CUDA graphs of traffic's batch shapes captured in %.3f s", captured,
             time.perf_counter() - t0)


def _synchronize(model: Any) -> None:
    torch = sys.modules.get("torch")
    device = getattr(model, "device", None)
    if torch is not None and getattr(device, "type", None) == "cuda":
        torch.cuda.synchronize(device)

