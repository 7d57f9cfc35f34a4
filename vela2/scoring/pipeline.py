"""The steps every scoring path runs, one implementation each: prepare, run_batch, finish (and
vela2.text.packing.pack between them).

predict() runs them in order over a list of rows; the worker engine runs the same functions with
its own scheduling (buffering, buckets, retries). Nothing here knows about queues.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError

from vela2.api.schemas import Answer, ModelInfo, Row, RowResult, Status, parse_row, split_task
from vela2.errors import ModelError
from vela2.model import invariant, staging
from vela2.model.calibration import choice_probs, expected_value, sigmoid
from vela2.model.modeling import HeadInputs, Vela2Model
from vela2.text.packing import balance_rows, plan_rows
from vela2.text.rendering import RenderedRow, Sequence, render_digest, render_row
from vela2.text.spans import span_answer


@dataclass
class Prepared:
    """A validated, rendered row waiting for its sequences' outputs."""

    row: Row
    rendered: RenderedRow
    render_ms: float

    @property
    def sequences(self) -> list[Sequence]:
        """The row's sequences (one per window), as rendered."""
        return self.rendered.sequences

    @property
    def task(self) -> str:
        """The row's task key."""
        return self.row.task


@dataclass
class SeqOutput:
    """Raw fp32 head outputs of one sequence, per question block."""

    options: dict[int, np.ndarray] = field(default_factory=dict)  # question -> (markers,) logits
    spans: dict[int, np.ndarray] = field(default_factory=dict)  # question -> (W_window, K) logits


def prepare(model: Vela2Model, obj: Any) -> Prepared:
    """Validate a row (dict or Row) and render it; raises InvalidRequest / LimitExceeded."""
    t0 = time.perf_counter()
    row = parse_row(obj)
    rendered = render_row(row, model.tokenizer, model.config, model.calibration.default_questions)
    return Prepared(row, rendered, (time.perf_counter() - t0) * 1e3)


@dataclass
class _Layout:
    """Where each sequence's blocks landed in the flat head outputs of one batch."""

    options: list[list[tuple[int, slice]]]  # per sequence: (question, slice into option logits)
    words: list[slice]  # per sequence: slice into word projections
    labels: list[list[tuple[int, slice]]]  # per sequence: (question, slice into label projections)


def _places(lengths: list[int], row_tokens: int | None, pad_to: int | None, batch_invariant: bool,
            device: torch.device) -> tuple[dict[int, tuple[int, int]], int, int]:
    """(row, offset) of each sequence, and the rows R and row length L of the batch: one sequence per row,
    packed rows of `row_tokens`, or (batch-invariant) the one-row stream of `invariant.stream_layout`."""
    if batch_invariant:
        offsets, total = invariant.stream_layout(lengths, invariant.chunk_tokens(device))
        return {i: (0, o) for i, o in enumerate(offsets)}, 1, total
    # packed rows: first-fit decides how many, then balanced (sdpa pads each row to the fullest)
    rows = ([[i] for i in range(len(lengths))] if row_tokens is None
            else balance_rows(plan_rows(lengths, row_tokens), lengths))
    place = {}
    for r, members in enumerate(rows):
        offset = 0
        for i in members:
            place[i] = (r, offset)
            offset += lengths[i]
    return place, len(rows), max(pad_to or 0, *(sum(lengths[i] for i in members) for members in rows))


def collate(sequences: list[Sequence], pad_id: int, device: torch.device, row_tokens: int | None = None,
            pad_to: int | None = None, batch_invariant: bool = False):
    """Lay a list of sequences out in padded rows (several per row when `row_tokens` is set) and
    build the head gather indices. `pad_to`: rows are padded to at least this many tokens (one
    fixed shape for compiled attention). `batch_invariant`: one row, the stream of
    `vela2.model.invariant.stream_layout` (row_tokens and pad_to do not apply).

    Returns input_ids, position_ids, parts (-1 on padding), segments (-1 on padding), all (R, L),
    then HeadInputs, the layout of each sequence's outputs (in the order of `sequences`) and, in
    batch-invariant mode, the stream's `AttentionLayout` (else None).
    """
    lengths = [s.num_tokens for s in sequences]
    place, R, L = _places(lengths, row_tokens, pad_to, batch_invariant, device)
    ids = np.full((R, L), pad_id, dtype=np.int64)
    pos = np.zeros((R, L), dtype=np.int64)
    parts = np.full((R, L), -1, dtype=np.int64)
    segs = np.full((R, L), -1, dtype=np.int64)
    opt_idx: list[tuple[int, int]] = []
    word_idx: list[tuple[int, int]] = []
    label_idx: list[tuple[int, int]] = []
    layout = _Layout([], [], [])
    for i, s in enumerate(sequences):
        r, o = place[i]
        n = s.num_tokens
        ids[r, o : o + n] = s.input_ids
        pos[r, o : o + n] = s.position_ids
        parts[r, o : o + n] = s.parts
        segs[r, o : o + n] = i
        w0 = len(word_idx)
        if any(blk.task.startswith("span:") for blk in s.blocks):
            word_idx.extend((r, o + p) for p in s.word_positions)
        layout.words.append(slice(w0, len(word_idx)))
        seq_opts: list[tuple[int, slice]] = []
        seq_labels: list[tuple[int, slice]] = []
        for blk in s.blocks:
            target, out = (label_idx, seq_labels) if blk.task.startswith("span:") else (opt_idx, seq_opts)
            k0 = len(target)
            target.extend((r, o + p) for p in blk.markers)
            out.append((blk.question, slice(k0, len(target))))
        layout.options.append(seq_opts)
        layout.labels.append(seq_labels)

    def pairs(x: list[tuple[int, int]]) -> np.ndarray:
        return np.array(x, dtype=np.int64).reshape(-1, 2)

    arrays = [ids, pos, parts, segs, pairs(opt_idx), pairs(word_idx), pairs(label_idx)]
    groups = None
    if batch_invariant:
        groups, gather, scatter = invariant.attention_layout([place[i][1] for i in range(len(lengths))], lengths, L)
        arrays += [gather, scatter]
    # one copy to the device for all of them (vela2.model.staging: pinned, so it never waits on the device)
    ids_t, pos_t, parts_t, segs_t, opt_t, word_t, label_t, *streamed = staging.to_device(arrays, device)
    attention = invariant.AttentionLayout(groups, *streamed) if groups is not None else None
    return ids_t, pos_t, parts_t, segs_t, HeadInputs(opt_t, word_t, label_t), layout, attention


def run_batch(model: Vela2Model, sequences: list[Sequence], precision: str,
              row_tokens: int | None = None, pad_to: int | None = None,
              batch_invariant: bool | None = None) -> list[SeqOutput]:
    """One forward pass over any mix of sequences; returns raw fp32 head outputs per sequence.

    With `row_tokens`, short sequences share rows (block-diagonal mask) to cut padding.
    `pad_to`: pad rows to at least this many tokens; None = as long as the longest row, or under
    flex attention with `row_tokens`, row_tokens (compiled flex kernels then see one row length).
    `batch_invariant` (None: the model's `batch_invariant`): each sequence's outputs the same bits
    whatever else the batch holds (vela2.model.invariant; row_tokens and pad_to then do not apply).
    """
    return launch_batch(model, sequences, precision, row_tokens, pad_to, batch_invariant).outputs()


@dataclass
class Launched:
    """A batch whose kernels are queued on the device (`launch_batch`): `done()` says whether they
    finished, `outputs()` waits for them (the GIL released) and returns run_batch's outputs."""

    n_sequences: int
    layout: _Layout
    blocks: list[tuple[int, int, slice, slice]]
    n_options: int
    host: np.ndarray  # (options + span entries,) fp32, filled by the queued device -> host copy
    event: Any = None  # torch.cuda.Event recorded after the copy (None on a CPU: already done)
    pinned: Any = None  # the staging buffer `host` lives in (vela2.model.staging), given back by outputs()

    def done(self) -> bool:
        """Whether the batch's outputs are on the host (never blocks)."""
        return self.event is None or self.event.query()

    def outputs(self) -> list[SeqOutput]:
        """Wait for the batch, then its outputs per sequence (copied out of the staging buffer)."""
        if self.event is not None:
            self.event.synchronize()  # waits with the GIL released
        flat = self.host
        if self.pinned is not None:  # the outputs must not alias a buffer the next batch reuses
            flat = flat.copy()
            staging.release(self.pinned)
            self.pinned = None
        opt_host = flat[: self.n_options]
        outs = [SeqOutput() for _ in range(self.n_sequences)]
        for b, seq_opts in enumerate(self.layout.options):
            for q, sl in seq_opts:
                outs[b].options[q] = opt_host[sl]
        at = self.n_options
        for b, q, ws, ls in self.blocks:
            shape = (ws.stop - ws.start, ls.stop - ls.start)
            outs[b].spans[q] = flat[at : at + shape[0] * shape[1]].reshape(shape)
            at += shape[0] * shape[1]
        return outs


@torch.inference_mode()
def launch_batch(model: Vela2Model, sequences: list[Sequence], precision: str,
                 row_tokens: int | None = None, pad_to: int | None = None,
                 batch_invariant: bool | None = None) -> Launched:
    """run_batch's first half: collate, queue the forward pass, the heads and ONE device -> host copy
    of every logit (option logits, then each span block) without waiting for the device. A caller
    may launch the next batch before collecting this one: its kernels queue behind (one stream), so
    the device never idles while the host collates."""
    invariant_mode = model.batch_invariant if batch_invariant is None else batch_invariant
    if pad_to is None and row_tokens and model.attn == "flex":
        pad_to = row_tokens
    ids, pos, parts, segs, idx, layout, streamed = collate(sequences, model.special_ids["pad"], model.device,
                                                           row_tokens, pad_to, invariant_mode)
    hidden = model.encode(ids, pos, parts, segs, precision, streamed)  # (R, L, H) fp32
    opt, words, labels = model.heads(hidden, idx, invariant_mode)  # (M,), (N, D), (K, D)
    blocks = [(b, q, layout.words[b], sl) for b, seq_labels in enumerate(layout.labels) for q, sl in seq_labels]
    span_flat = span_logits(words, labels, blocks, model.span_head, invariant_mode)  # (sum of W x K,)
    flat_dev = torch.cat([opt.float().reshape(-1), span_flat])
    if not flat_dev.is_cuda:
        return Launched(len(sequences), layout, blocks, opt.numel(), flat_dev.numpy())
    host, pinned = staging.from_device(flat_dev)
    event = torch.cuda.Event()
    event.record()
    return Launched(len(sequences), layout, blocks, opt.numel(), host, event, pinned)


SPAN_CHUNK_ELEMENTS = 1 << 24  # largest word x label product one span matmul computes (64 MB fp32)


def run_ahead(model: Vela2Model, batches: Iterable[list[Sequence]], precision: str,
              row_tokens: int | None = None, batch_invariant: bool | None = None) -> Iterator[list[SeqOutput]]:
    """run_batch over `batches`, yielding each batch's outputs in order, with one batch in flight:
    batch N+1 is collated and its kernels queued (`launch_batch`) before batch N's outputs are
    collected, so the host's work for the next batch hides behind the device's work on this one
    (the worker's device loop does the same)."""
    previous: Launched | None = None
    for sequences in batches:
        launched = launch_batch(model, sequences, precision, row_tokens, batch_invariant=batch_invariant)
        if previous is not None:
            yield previous.outputs()
        previous = launched
    if previous is not None:
        yield previous.outputs()


def span_logits(words: torch.Tensor, labels: torch.Tensor, blocks: list[tuple[int, int, slice, slice]],
                head: Any, batch_invariant: bool = False) -> torch.Tensor:
    """Span logits of every block, flat: block after block, each (W_block, K_block) row-major.

    words: (N, D) projected word states, labels: (K, D) projected label states; a block's logits are
    words[its words] @ labels[its labels].T * scale + bias. Consecutive blocks hold consecutive word
    and label slices, so runs of blocks are computed as ONE matmul of their word range by their
    label range, the blocks' own entries gathered from it: a handful of kernel launches per batch
    instead of several per block (the device thread launches them holding the GIL, and the worker's
    other threads contend for it). A run stops before its product passes SPAN_CHUNK_ELEMENTS.
    `batch_invariant`: each block's own product instead (its shape is its own, whatever the batch).
    """
    if not blocks:
        return words.new_zeros((0,), dtype=torch.float32)
    if batch_invariant:
        flat = torch.cat([(words[ws] @ labels[ls].T).reshape(-1) for _, _, ws, ls in blocks])
        return (flat * head.scale + head.bias).float()
    runs: list[tuple[int, int, int, list[tuple[slice, slice]]]] = []  # (first word, word end, first label, blocks)
    for _, _, ws, ls in blocks:
        if runs:
            wa, wb, la, members = runs[-1]
            wb = max(wb, ws.stop)
            if ws.start >= wa and (wb - wa) * (ls.stop - la) <= SPAN_CHUNK_ELEMENTS:
                members.append((ws, ls))
                runs[-1] = (wa, wb, la, members)
                continue
        runs.append((ws.start, ws.stop, ls.start, [(ws, ls)]))
    pieces = []
    for wa, wb, la, members in runs:
        lb = members[-1][1].stop
        # flat index of each block entry (word r, label c) in the run's (wb - wa, lb - la) product
        index = np.concatenate([
            ((np.arange(ws.start, ws.stop) - wa)[:, None] * (lb - la) + (np.arange(ls.start, ls.stop) - la)[None, :])
            .reshape(-1) for ws, ls in members])
        product = words[wa:wb] @ labels[la:lb].T  # (words of the run, labels of the run)
        pieces.append(product.reshape(-1)[staging.to_device([index], words.device)[0]])
    flat = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
    return (flat * head.scale + head.bias).float()


def merge_span_windows(rendered: RenderedRow, outputs: list[SeqOutput], question: int) -> np.ndarray:
    """Per-word span logits (W, K) of the whole text from its windows.

    A word's logits come from the window where it sits farthest from a cut edge (a window edge that
    is not the text's own start or end); ties go to the earlier window.
    """
    n_words = rendered.num_words
    first = outputs[0].spans[question]
    if len(outputs) == 1:  # one window holds every word (nearly every row): nothing to merge
        return first.astype(np.float32, copy=False)
    merged = np.zeros((n_words, first.shape[1]), dtype=np.float32)
    best = np.full(n_words, -1.0)
    for seq, out in zip(rendered.sequences, outputs, strict=True):
        ws, n = seq.word_start, seq.num_words
        local = np.arange(n, dtype=np.float64)
        left = local if ws > 0 else np.full(n, np.inf)
        right = (n - 1 - local) if ws + n < n_words else np.full(n, np.inf)
        dist = np.minimum(left, right)
        take = dist > best[ws : ws + n]
        merged[ws : ws + n][take] = out.spans[question][take]
        best[ws : ws + n][take] = dist[take]
    return merged


def check_finite(outputs: list[SeqOutput]) -> None:
    """Raise ModelError when a window's raw head output holds NaN or infinity: such logits cannot
    be answered (a result never carries a non-finite number), the row gets a model_error."""
    for w, out in enumerate(outputs):
        for what, arrays in (("option", out.options), ("span", out.spans)):
            for q, arr in arrays.items():
                if not np.isfinite(arr).all():
                    bad = int(np.count_nonzero(~np.isfinite(arr)))
                    raise ModelError(f"question {q}: the model gave {bad:,} non-finite {what} logits in window {w}")


def pool_option_windows(outputs: list[SeqOutput], question: int) -> np.ndarray:
    """Option logits of a question pooled over windows: the mean of the windows' raw logits."""
    if len(outputs) == 1:
        return outputs[0].options[question]
    return np.mean(np.stack([o.options[question] for o in outputs]), axis=0)


def _option_answer(model: Vela2Model, prep: Prepared, q: int, task: str, logits: np.ndarray) -> Answer:
    kind, _ = split_task(task)
    options = prep.row.questions[q].options or []
    cal = model.calibration
    fields: dict[str, Any] = {}  # built first: the Answer is validated once, not on every assignment
    if kind == "set":
        probs = sigmoid(logits.astype(np.float64) / cal.T_set)
        thr = cal.set_threshold(task)
        fields["decision"] = [o for o, p in zip(options, probs, strict=True) if p >= thr]
    else:
        probs, abstain = choice_probs(logits, cal.temperature(task), len(options))
        fields["decision"] = options[int(np.argmax(probs))]
        fields["abstain_probability"] = abstain
        if kind == "score":
            fields["expected"] = expected_value(options, probs)
    if prep.row.logits:
        fields["logits"] = logits.tolist()
    return Answer(question=q, task=task, probs=dict(zip(options, probs.tolist(), strict=True)), **fields)


def finish(model: Vela2Model, prep: Prepared, outputs: list[SeqOutput], timings: dict[str, float],
           precision: str, batch_invariant: bool | None = None) -> RowResult:
    """Pool windows, calibrate and decode: the RowResult of one prepared row.

    outputs: one SeqOutput per sequence of `prep`, in window order, run at `precision` and, when
    `batch_invariant` (None: the model's own `batch_invariant`), in batch-invariant mode (the result's
    `served_by` names both beside the model's name and digest). `timings` gets decode_ms.
    Raises ModelError when an output or a number of the answer is not finite.
    """
    if len(outputs) != len(prep.sequences):
        raise ValueError(f"finish needs {len(prep.sequences)} sequence outputs; got {len(outputs)}")
    t0 = time.perf_counter()
    row = prep.row
    check_finite(outputs)
    answers = []
    for q in range(len(row.questions)):
        task = row.question_task(q)
        try:
            if task.startswith("span:"):
                answers.append(span_answer(prep.row, prep.rendered.offsets, q, task,
                                               merge_span_windows(prep.rendered, outputs, q), model.calibration))
            else:
                answers.append(_option_answer(model, prep, q, task, pool_option_windows(outputs, q)))
        except ValidationError as e:  # a non-finite number (results never carry NaN or infinity)
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise ModelError(f"question {q}: {where}: {err['msg']}; got {err.get('input')!r:.80}") from None
    timings = {**timings, "render_ms": prep.render_ms, "decode_ms": (time.perf_counter() - t0) * 1e3}
    return RowResult(id=row.id, task=row.task, status=Status.ok, answers=answers,
                     timings={k: round(v, 3) for k, v in timings.items()},
                     render=render_digest(prep.rendered) if row.logits else None,
                     served_by=ModelInfo(name=model.name, digest=model.digest, precision=precision,
                                         batch_invariant=model.batch_invariant if batch_invariant is None
                                         else batch_invariant))


