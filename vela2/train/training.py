"""`vela2 train`: fit the heads (or the whole model) of a checkpoint on labelled rows.

Training runs the serving path's own steps: `pipeline.prepare` renders each row (windows, bundled
blocks), `pipeline.collate` lays sequences out, `Vela2Model.encode` runs the tree-masked forward,
`Vela2Model.heads` and `pipeline.span_logits` give the logits: the same functions
`pipeline.launch_batch` calls, here with gradients. Rows carry `gold` in `vela2 calibrate`'s format
(`vela2.train.labelled.check_gold`); a bundled row trains every labelled block.

Losses, summed over the labelled questions of a batch and divided by their count:
- choice / score: softmax cross-entropy over the REAL options ([ABS] is left out, as in calibration);
- set: mean binary cross-entropy per option;
- span: mean binary cross-entropy per word x label unit of the window (a word is positive for a
  label when it overlaps a gold span of that label; words outside the question's fields are left
  out), with positive units weighted by `span_pos_weight` (gold words are rare).
A long row trains once per window (option losses per window, span losses on the window's words).

At the end (`finish`) the backbone's matmul weights are rounded to the bf16 a checkpoint stores, the
calibration is fitted on DEV (`vela2.train.calibrate.calibrate`) on those weights, and a servable checkpoint
is written with `vela2.model.checkpoint.save`. `vela2 init-demo` trains the demo model with these same
functions (`vela2.train.demo_model.build_demo_model`). `--save-every N` writes `OUT/train-state.pt` (trained
parameters, optimizer, step); `--resume` continues from it with the same batch order.
"""

from __future__ import annotations

import logging
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vela2.api.schemas import guess_id_task, split_task
from vela2.errors import Vela2Error
from vela2.model.modeling import Vela2Model
from vela2.progress import Progress
from vela2.scoring.pipeline import Prepared, collate, prepare, span_logits
from vela2.text.rendering import Sequence
from vela2.train.calibrate import _word_targets, _words_in_fields
from vela2.train.labelled import check_gold, question_golds

logger = logging.getLogger(__name__)

STATE_FILE = "train-state.pt"
DEFAULT_TRAIN_BATCH_TOKENS = 4_096  # padded tokens (longest sequence x sequences) per training step


@dataclass
class Example:
    """A labelled row, rendered: its sequences and one gold per question (None = unlabelled)."""

    prep: Prepared
    golds: list[Any]

    @property
    def num_tokens(self) -> int:
        """Tokens of the example's longest sequence (what it costs a padded batch)."""
        return max(s.num_tokens for s in self.prep.sequences)


def labelled_examples(model: Vela2Model, rows: list[Any]) -> tuple[list[Example], list[dict[str, Any]]]:
    """Validate, check and render labelled rows; returns (examples, skipped [{"id", "reason"}]).

    A row is skipped (never used) when it is not a valid row, its gold does not fit its questions
    (`vela2.train.labelled.check_gold`), or it cannot be rendered (a limit exceeded).
    """
    examples: list[Example] = []
    skipped: list[dict[str, Any]] = []
    for obj in rows:
        try:
            prep = prepare(model, obj)
        except Vela2Error as e:
            skipped.append({"id": guess_id_task(obj)[0], "reason": f"invalid row: {e}"})
            continue
        reason = check_gold(prep.row, prep.row.gold)
        if reason:
            skipped.append({"id": prep.row.id, "reason": reason})
            continue
        examples.append(Example(prep, question_golds(prep.row, prep.row.gold)))
    return examples, skipped


def forward(model: Vela2Model, sequences: list[Sequence], precision: str,
            backbone_grad: bool) -> tuple[torch.Tensor, torch.Tensor, Any, list[tuple[int, int, slice, slice]]]:
    """The serving forward (collate -> encode -> heads -> span_logits) with gradients.

    `backbone_grad` False runs the backbone under no_grad (heads-only training: no activations
    kept). Returns option logits (M,), span logits flat (sum of W x K,), collate's layout and the
    span blocks (sequence, question, word slice, label slice), as `launch_batch` builds them.
    """
    ids, pos, parts, segs, idx, layout, _ = collate(sequences, model.special_ids["pad"], model.device)
    with torch.set_grad_enabled(backbone_grad):
        hidden = model.encode(ids, pos, parts, segs, precision)  # (R, L, H) fp32
    opt, words, labels = model.heads(hidden, idx)  # (M,), (N, D), (K, D)
    blocks = [(b, q, layout.words[b], sl) for b, seq_labels in enumerate(layout.labels) for q, sl in seq_labels]
    return opt, span_logits(words, labels, blocks, model.span_head), layout, blocks


def batch_loss(model: Vela2Model, batch: list[Example], precision: str, backbone_grad: bool,
               span_pos_weight: float = 1.0) -> tuple[torch.Tensor, int]:
    """Mean loss over the labelled questions of every window of `batch`; returns (loss, questions)."""
    seqs: list[Sequence] = []
    owner: list[Example] = []  # example of each sequence
    for ex in batch:
        seqs.extend(ex.prep.sequences)
        owner.extend([ex] * len(ex.prep.sequences))
    opt, span_flat, layout, blocks = forward(model, seqs, precision, backbone_grad)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    losses: list[torch.Tensor] = []
    for b, seq_opts in enumerate(layout.options):
        row, golds = owner[b].prep.row, owner[b].golds
        for q, sl in seq_opts:
            gold = golds[q]
            if gold is None:
                continue
            kind, _ = split_task(row.question_task(q))
            options = row.questions[q].options or []
            z = opt[sl]  # (markers,): options, then [ABS] for choice / score
            if kind == "set":
                target = torch.tensor([float(o in gold) for o in options], device=z.device)
                losses.append(bce(z, target))
            else:
                target_idx = torch.tensor([options.index(gold)], device=z.device)
                losses.append(torch.nn.functional.cross_entropy(z[None, : len(options)], target_idx))
    at = 0
    pos_weight = torch.tensor(span_pos_weight, device=span_flat.device)
    for b, q, ws, ls in blocks:
        n = (ws.stop - ws.start) * (ls.stop - ls.start)
        z = span_flat[at : at + n].reshape(ws.stop - ws.start, ls.stop - ls.start)  # (W_window, K)
        at += n
        ex, seq = owner[b], seqs[b]
        gold = ex.golds[q]
        if gold is None or z.shape[0] == 0:
            continue
        row = ex.prep.row
        offsets = ex.prep.rendered.offsets[seq.word_start : seq.word_start + seq.num_words]  # (W_window, 2)
        labels = row.questions[q].labels or []
        words_gold = np.stack([_word_targets(offsets, gold, lab) for lab in labels], axis=1)  # (W_window, K)
        keep = torch.from_numpy(_words_in_fields(row, row.questions[q].fields, offsets)).to(z.device)
        if not bool(keep.any()):
            continue
        t = torch.from_numpy(words_gold).to(z.device, torch.float32)
        losses.append(bce(z[keep], t[keep], pos_weight=pos_weight))
    if not losses:
        return span_flat.sum() * 0.0, 0
    return torch.stack(losses).mean(), len(losses)


def plan_batches(examples: list[Example], max_batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Shuffled example indices grouped into steps whose padded cost (longest sequence x sequences)
    stays within `max_batch_tokens`; a row over the budget gets a step of its own."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    batches: list[list[int]] = []
    current: list[int] = []
    longest = n_seqs = 0
    for i in order:
        ex = examples[i]
        lo, n = max(longest, ex.num_tokens), n_seqs + len(ex.prep.sequences)
        if current and lo * n > max_batch_tokens:
            batches.append(current)
            current, lo, n = [], ex.num_tokens, len(ex.prep.sequences)
        current.append(i)
        longest, n_seqs = lo, n
    if current:
        batches.append(current)
    return batches


def trainable_parameters(model: Vela2Model, full: bool) -> dict[str, torch.nn.Parameter]:
    """The parameters a run updates: the heads only, or everything with `full`; the rest is frozen."""
    out = {}
    for name, p in model.named_parameters():
        train = full or not name.startswith("backbone.")
        p.requires_grad_(train)
        if train:
            out[name] = p
    return out


LR_SCHEDULES = ("constant", "linear")


def lr_factor(step: int, total_steps: int, schedule: str) -> float:
    """The multiplier of the learning rate at `step` (1-based) of `total_steps`: 1 for "constant"; for
    "linear" a warm-up from 0 over the first 5% of the steps, then a linear decay towards 0. A
    function of the step alone, so a resumed run takes the same rates."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"lr schedule must be one of {', '.join(LR_SCHEDULES)}; got {schedule!r}")
    if schedule == "constant":
        return 1.0
    warmup = max(1, total_steps // 20)
    if step <= warmup:
        return step / warmup
    return (total_steps - step + 1) / (total_steps - warmup + 1)


@dataclass
class TrainOptions:
    """Knobs of one training run (the `vela2 train` options)."""

    epochs: int = 3
    lr: float = 1e-3
    full: bool = False  # train the backbone too (else the heads only)
    max_batch_tokens: int = DEFAULT_TRAIN_BATCH_TOKENS
    precision: str = "fp32"
    seed: int = 0
    save_every: int = 0  # steps between train-state saves; 0 = never
    span_pos_weight: float = 5.0  # weight of positive span units in their BCE
    lr_schedule: str = "constant"  # or "linear": warm-up over the first 5% of steps, then linear decay to 0
    progress: bool | None = None  # on stderr (vela2.progress): None = a bar on a terminal, else lines; False = none


def train(model: Vela2Model, examples: list[Example], options: TrainOptions, *,
          state_path: Path | None = None, resume: bool = False) -> list[float]:
    """Train `model` in place with AdamW; returns the mean loss of each epoch.

    The batch order is a function of `options.seed` and the epoch, so a run resumed from
    `state_path` (written every `save_every` steps) takes the same steps as an uninterrupted one.
    """
    if not examples:
        raise ValueError("no usable labelled rows to train on")
    torch.manual_seed(options.seed)
    params = trainable_parameters(model, options.full)
    optimizer = torch.optim.AdamW(params.values(), lr=options.lr, weight_decay=0.0)
    plans = [plan_batches(examples, options.max_batch_tokens, random.Random(options.seed * 1_000_003 + e))
             for e in range(options.epochs)]
    total_steps = sum(len(p) for p in plans)
    step = 0
    if resume:
        step = load_state(state_path, model, params, optimizer)
        logger.info("resumed from %s at step %d of %d", state_path, step, total_steps)
    epoch_losses: list[float] = []
    done = 0
    with Progress("train", total_steps, unit="step", initial=step, show=options.progress) as bar:
        for epoch, plan in enumerate(plans):
            losses: list[float] = []
            for batch in plan:
                done += 1
                if done <= step:  # resumed: these steps are in the loaded state
                    continue
                value = train_step(model, [examples[i] for i in batch], optimizer, options, done, total_steps)
                losses.append(value)
                bar.update(1, epoch=f"{epoch + 1}/{len(plans)}", loss=value)
                if state_path is not None and options.save_every and done % options.save_every == 0:
                    save_state(state_path, params, optimizer, done)
            if losses:
                epoch_losses.append(float(np.mean(losses)))
                logger.info("epoch %d: mean loss %.4f over %d steps", epoch + 1, epoch_losses[-1], len(losses))
    for p in model.parameters():
        p.requires_grad_(False)
    return epoch_losses


def train_step(model: Vela2Model, batch: list[Example], optimizer: torch.optim.Optimizer, options: TrainOptions,
               step: int, total_steps: int) -> float:
    """One optimizer step on `batch`, the `step`-th (1-based) of `total_steps` (it sets the learning
    rate of the schedule); returns the batch's loss. A batch with no labelled question updates
    nothing; a loss that is not finite raises ValueError."""
    loss, n_questions = batch_loss(model, batch, options.precision, options.full, options.span_pos_weight)
    if n_questions:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = options.lr * lr_factor(step, total_steps, options.lr_schedule)
        optimizer.step()
    value = float(loss.detach())
    if not math.isfinite(value):
        raise ValueError(f"training loss is {value} at step {step}; lower --lr (given {options.lr})")
    return value


def load_state(path: Path | None, model: Vela2Model, params: dict[str, torch.nn.Parameter],
               optimizer: torch.optim.Optimizer) -> int:
    """Load the training state `save_state` wrote (trained parameters, optimizer) into `params` and
    `optimizer`; returns its step. FileNotFoundError when there is none."""
    if path is None or not path.is_file():
        raise FileNotFoundError(f"--resume: no training state at {path}")
    state = torch.load(path, map_location=model.device, weights_only=True)
    with torch.no_grad():
        for name, t in state["params"].items():
            params[name].copy_(t)
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def save_state(path: Path, params: dict[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer,
               step: int) -> None:
    """Write the resumable training state atomically (trained parameters, optimizer, step)."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"params": {n: p.detach().cpu() for n, p in params.items()},
                "optimizer": optimizer.state_dict(), "step": step}, tmp)
    tmp.replace(path)


def finish(model: Vela2Model, dev_rows: list[Any] | None, precision: str = "fp32",
           progress: bool | None = False) -> dict[str, Any] | None:
    """Make a trained model what its checkpoint will serve: backbone matmul weights rounded to the
    release dtype (`vela2.model.checkpoint.release_state_dict`: bf16), so that the calibration is fitted on
    the weights the worker loads; then the calibration fitted on `dev_rows` (None: kept as it was).
    Returns the calibration report (`vela2.train.calibrate.calibrate`), or None without dev rows.
    `progress`: the scoring of `dev_rows` on stderr, as `TrainOptions.progress`."""
    from vela2.model.checkpoint import release_state_dict
    from vela2.train.calibrate import calibrate

    with torch.no_grad():
        model.load_state_dict(release_state_dict(model))
    model.eval()
    if dev_rows is None:
        return None
    model.calibration, report = calibrate(model, dev_rows, precision=precision, progress=progress)
    return report


def train_command(checkpoint: str, train_path: str, out: str, *, dev_path: str | None = None,
                  options: TrainOptions, device: str = "cpu", resume: bool = False,
                  batch_invariant: bool = False) -> int:
    """`vela2 train`: load, train, fit calibration on DEV, write a servable checkpoint to OUT.

    Skipped rows (bad JSON, invalid rows, bad gold) are listed on stderr. Returns 0, or 2 when
    no row is usable. `batch_invariant`: DEV is scored for the calibration in batch-invariant mode
    (vela2.model.invariant), as a worker in that mode scores; the training steps are the same.
    """
    from vela2.model.checkpoint import load, save
    from vela2.train.calibrate import format_report
    from vela2.train.labelled import read_jsonl

    # both files are read before the (long) training: a typo in --dev must not cost the trained weights
    try:
        rows, bad = read_jsonl(train_path)
        dev_rows, dev_bad = read_jsonl(dev_path) if dev_path else (None, [])
    except OSError as e:
        print(f"vela2 train: cannot read {e.filename or train_path}: {e.strerror or e}", file=sys.stderr)
        return 2
    model = load(checkpoint, device=device, dtype=torch.float32)  # trained in fp32 (bf16 = autocast)
    if batch_invariant:
        model.use_batch_invariant()
    examples, skipped = labelled_examples(model, rows)
    for s in bad + skipped:
        where = f"line {s['line']}" if s.get("line") else s["id"]
        print(f"vela2 train: skipped {where}: {s['reason']}", file=sys.stderr)
    if not examples:
        print(f"vela2 train: no usable labelled rows in {train_path}", file=sys.stderr)
        return 2
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"training {'all parameters' if options.full else 'the heads'} of {model.name} on {len(examples)} rows "
          f"({len(bad) + len(skipped)} skipped), {options.epochs} epochs, precision {options.precision}",
          file=sys.stderr)
    losses = train(model, examples, options, state_path=out_dir / STATE_FILE, resume=resume)
    print("epoch losses: " + ", ".join(f"{x:.4f}" for x in losses), file=sys.stderr)
    report = finish(model, dev_rows, precision=options.precision, progress=options.progress)
    if report is not None:
        report["skipped"] = dev_bad + report["skipped"]
        print(format_report(report))
    else:
        print("no --dev: calibration kept as it was (thresholds and temperatures are not refitted)", file=sys.stderr)
    save(model, out_dir)
    print(f"wrote {out_dir}")
    return 0
