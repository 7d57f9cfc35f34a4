"""Batch-invariant mode (vela2.model.invariant): the stream and attention layouts, and the property that
matters: a row's answer is the same bits whatever it is batched, packed, padded, ordered or chunked
with, on the trained demo and on random models of other shapes, at fp32, bf16 and fp8 (CPU; the GPU run
is bench/gpu_invariant.py's JSON)."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
import torch

import vela2
from vela2.errors import PrecisionError
from vela2.model import invariant
from vela2.model.modeling import Vela2Model
from vela2.train.demo_model import demo_calibration, demo_config, demo_tokenizer
from vela2.train.synthetic import labelled_rows

TOKENIZER = demo_tokenizer()


def rows(n: int, seed: int) -> list[dict]:
    """Synthetic bundled rows (several questions over one message), asking for raw logits and units."""
    out = []
    for r in labelled_rows(n, seed, bundled_share=1.0, thread_share=0.3):
        r.pop("gold", None)
        out.append(dict(r, logits=True, units=True))
    return out


def answers(results: list) -> list[str]:
    """Each result as JSON without timings: every probability, logit, decision and span, to the bit."""
    out = []
    for res in results:
        d = res.to_json_dict()
        d.pop("timings", None)
        out.append(json.dumps(d, sort_keys=True))
    return out


def compositions(model: Vela2Model, batch: list[dict], precision: str, seed: int) -> list[list[str]]:
    """The answers of `batch` scored several ways: all at once, shuffled in small batches, each alone,
    among strangers, with packed rows asked for (which this mode ignores)."""
    rng = random.Random(seed)
    order = list(range(len(batch)))
    rng.shuffle(order)
    strangers = rows(6, seed + 1000)

    def scored(objs: list[dict], **kw) -> list:
        return vela2.predict(model, objs, precision=precision, batch_invariant=True, **kw)

    shuffled = scored([batch[i] for i in order], max_batch_tokens=rng.choice([600, 1500, 4000]))
    back = [None] * len(batch)
    for k, i in enumerate(order):
        back[i] = shuffled[k]
    mixed = scored(strangers[:3] + batch + strangers[3:], max_batch_tokens=16_384)[3:-3]
    return [answers(scored(batch, max_batch_tokens=16_384)), answers(back),
            answers([scored([r])[0] for r in batch]), answers(mixed),
            answers(scored(batch, max_batch_tokens=2048, row_tokens=512))]


def test_the_stream_layout_pads_to_whole_chunks_with_a_padding_token():
    offsets, total = invariant.stream_layout([5, 3, 250], 256)
    assert offsets == [0, 5, 8] and total == 512  # 258 tokens + 1 padding
    assert invariant.stream_layout([256], 256)[1] == 512
    assert invariant.chunk_tokens("cpu") == invariant.CHUNK_TOKENS["cpu"]
    assert invariant.chunk_tokens("meta") == invariant.CHUNK_TOKENS["cpu"]


def test_the_attention_layout_gathers_each_sequence_into_its_own_padded_row():
    lengths = [5, 70, 3, 64]
    offsets, total = invariant.stream_layout(lengths, 256)
    groups, gather, scatter = invariant.attention_layout(offsets, lengths, total)
    assert [(lc, n) for lc, n, _ in groups] == [(64, 3), (128, 1)]  # 5, 3 and 64 pad to 64; 70 to 128
    slots = sum(lc * n for lc, n, _ in groups)
    assert gather.shape == (slots,) and scatter.shape == (total,)
    real = np.concatenate([np.arange(o, o + n) for o, n in zip(offsets, lengths, strict=True)])
    assert (gather[scatter[real]] == real).all()  # every token reads back its own slot
    assert (scatter[sum(lengths):] == slots).all()  # the stream's padding reads the zero row
    assert set(gather.tolist()) - set(real.tolist()) == {total - 1}  # a row's padding is the padding token


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp8"])
def test_the_demos_answers_are_the_same_bits_in_any_batch(demo_model, precision):
    batch = rows(10, seed=41)
    ways = compositions(demo_model, batch, precision, seed=7)
    assert all(way == ways[0] for way in ways[1:])
    assert any('"logits"' in a for a in ways[0])  # raw numbers were compared, not only decisions


@pytest.mark.parametrize(("seed", "backbone"), [
    (3, {"num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 3}),  # GQA 4:1, 3 layers
    (5, {"hidden_size": 96, "intermediate_size": 160, "num_attention_heads": 3, "num_key_value_heads": 3}),
])
def test_a_random_model_of_another_shape_is_invariant_too(seed, backbone):
    config = demo_config(vocab_size=TOKENIZER.get_vocab_size(), **backbone)
    model = Vela2Model.random(config, TOKENIZER, demo_calibration(), seed=seed)
    # a long text: several windows, sequences across chunk boundaries
    long_row = dict(rows(1, seed)[0], id="long", text=" ".join(["Please refund order 4411 for Ann Lee."] * 120))
    batch = [*rows(6, seed), long_row]
    ways = compositions(model, batch, "fp32", seed)
    assert all(way == ways[0] for way in ways[1:])
    assert all('"status": "ok"' in a for a in ways[0])


def test_the_default_mode_is_not_invariant_which_is_why_this_mode_exists(demo_model):
    batch = rows(14, seed=41)
    together = answers(vela2.predict(demo_model, batch, precision="fp32", max_batch_tokens=16_384))
    alone = answers([vela2.predict(demo_model, [r], precision="fp32")[0] for r in batch])
    assert together != alone  # last-bit differences: what invariant mode removes


def test_the_models_own_setting_is_every_calls_default(demo_model):
    batch = rows(4, seed=9)
    explicit = vela2.predict(demo_model, batch, precision="fp32", batch_invariant=True)
    demo_model.batch_invariant = True
    try:
        assert answers(vela2.predict(demo_model, batch, precision="fp32")) == answers(explicit)
        # an answer names the mode it was made in (served_by), and a per-call override wins
        overridden = vela2.predict(demo_model, batch, precision="fp32", batch_invariant=False)
    finally:
        demo_model.batch_invariant = False
    assert all(r.served_by.batch_invariant for r in explicit)
    assert not any(r.served_by.batch_invariant for r in overridden)
    assert not vela2.predict(demo_model, batch[:1], precision="fp32")[0].served_by.batch_invariant


def test_a_backbone_the_fused_decoder_does_not_handle_is_refused_by_name():
    config = demo_config(vocab_size=TOKENIZER.get_vocab_size())
    config = dataclasses.replace(config, backbone={**config.backbone, "hidden_act": "gelu"})
    model = Vela2Model.random(config, TOKENIZER, demo_calibration(), seed=1)
    with pytest.raises(PrecisionError, match="batch-invariant mode runs on the fused decoder only, which does not "
                                             "handle hidden_act 'gelu'"):
        vela2.predict(model, rows(1, 2), precision="fp32", batch_invariant=True)
    assert vela2.predict(model, rows(1, 2), precision="fp32")[0].status == "ok"  # the default mode runs it


def test_rows_chunked_runs_fixed_shapes_and_cuts_the_padding():
    seen = []

    def head(x: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(x.shape))
        return x.sum(-1)

    x = torch.arange(300 * 4, dtype=torch.float32).view(300, 4)
    out = invariant.rows_chunked(head, x)
    assert torch.equal(out, x.sum(-1)) and seen == [(invariant.chunk_tokens("cpu"), 4)] * 2
