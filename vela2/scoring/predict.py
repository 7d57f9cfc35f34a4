"""predict(): the reference path, with no queue (module named apart from the function so that
`vela2.predict` stays the function). The worker runs the same steps (vela2/scoring/pipeline.py)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, cast

from vela2.api.schemas import RowResult, error_result, guess_id_task
from vela2.config import DEFAULT_MAX_BATCH_TOKENS, default_precision
from vela2.errors import Vela2Error
from vela2.model.modeling import Vela2Model
from vela2.scoring.pipeline import Prepared, SeqOutput, finish, prepare, run_ahead
from vela2.text.packing import pack


def predict(
    model: Vela2Model,
    rows: Iterable[Any],
    *,
    precision: str | None = None,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    row_tokens: int | None = None,
    batch_invariant: bool | None = None,
) -> list[RowResult]:
    """Score rows (dicts or `Row`s); one RowResult per row, in order.

    A row that fails validation, rendering or decoding gets an error result; the other rows still run.
    Sequences of all rows are packed together by length under `max_batch_tokens` (padded tokens);
    with `row_tokens`, several short sequences share a row of that many tokens (see vela2.text.packing.pack).
    `precision` None: the worker's default for the model's device (bf16 on CUDA, fp32 elsewhere).
    `batch_invariant` (None: the model's own `batch_invariant`, off unless set): every answer the same
    bits whatever else this call (or a worker's batch) holds (vela2.model.invariant).
    """
    precision = precision or default_precision(str(model.device))
    model.check_precision(precision)
    invariant = model.batch_invariant if batch_invariant is None else batch_invariant
    if invariant:
        model.check_batch_invariant()
    rows = list(rows)
    results: list[RowResult | None] = [None] * len(rows)
    preps: dict[int, Prepared] = {}
    for i, obj in enumerate(rows):
        try:
            preps[i] = prepare(model, obj)
        except Vela2Error as e:
            results[i] = error_result(*guess_id_task(obj), e)
    flat = [(i, w, seq) for i, p in preps.items() for w, seq in enumerate(p.sequences)]
    outputs: dict[int, list[SeqOutput | None]] = {i: [None] * len(p.sequences) for i, p in preps.items()}
    model_ms = dict.fromkeys(preps, 0.0)
    batches = pack([seq.num_tokens for _, _, seq in flat], max_batch_tokens, row_tokens)
    t0 = time.perf_counter()
    # one batch in flight (run_ahead): a row's model_ms is the time from the previous batch's outputs
    # (or the start) to its own batch's outputs
    for batch, outs in zip(batches, run_ahead(model, ([flat[k][2] for k in b] for b in batches), precision,
                                              row_tokens, invariant), strict=True):
        elapsed = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        for k, out in zip(batch, outs, strict=True):
            i, w, _ = flat[k]
            outputs[i][w] = out
        for i in {flat[k][0] for k in batch}:
            model_ms[i] += elapsed
    # pack() places every sequence in one batch, so no output and no result is left None here.
    for i, prep in preps.items():
        seq_outputs = cast("list[SeqOutput]", outputs[i])
        try:
            results[i] = finish(model, prep, seq_outputs, {"queue_ms": 0.0, "model_ms": model_ms[i]}, precision,
                                invariant)
        except Vela2Error as e:  # e.g. non-finite logits: a model_error result for this row only
            results[i] = error_result(prep.row.id, prep.row.task, e)
    return cast("list[RowResult]", results)
