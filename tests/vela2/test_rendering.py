"""render_row: hypothesis properties of the token layout (offsets, words, blocks, markers, positions,
windows) exactly as vela2/rendering.py guarantees them, plus plan_windows and the limits."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vela2.config import LIMITS
from vela2.errors import LimitExceeded
from vela2.modeling import tree_mask
from vela2.rendering import WORD_RE, plan_windows, render_row, split_words
from vela2.schemas import parse_row, split_task

VOCAB = (
    "the of and to in is was company market report price bank city police court party group water "
    "school Alice Bob Acme Globex yes no maybe refund order"
).split()
# words the strategies draw from: vocabulary, unicode, emoji, control characters, long and odd words
ODD = [
    "Ünïcödé",
    "naïve",
    "東京",
    "日本語のテキスト",
    "😀",
    "👩‍👩‍👧",
    "🇫🇷",
    "\x00",
    "\x07",
    "\x1b[0m",
    "\u200b",
    "e\u0301",
    "a" * 150,
    "b" * 101,
    "co-op",
    "snake_case_name",
    "x-y_z",
    "1,234.56",
    "@#$%",
    "'quoted'",
    "[OPT]",
    "[ABS]",
    "[PAD]",
    "<s>",
    "\ufeff",
    "\ud7ff",
    "ﬁ",
    "Ⅻ",
    "٣٤٥",
    "a\u0000b",
]
SEPARATORS = [" ", "  ", "\n", "\t", "\r\n", "\u3000", "\u00a0", " \x0c "]

words_st = st.one_of(
    st.sampled_from(VOCAB),
    st.sampled_from(ODD),
    st.text(min_size=1, max_size=12),
    st.builds(lambda w, k: "-".join([w] * k), st.sampled_from(VOCAB), st.integers(2, 6)),
)


@st.composite
def texts(draw, max_words: int = 60) -> str:
    words = draw(st.lists(words_st, min_size=1, max_size=max_words))
    seps = draw(st.lists(st.sampled_from(SEPARATORS), min_size=len(words) + 1, max_size=len(words) + 1))
    return seps[0] * draw(st.booleans()) + "".join(w + s for w, s in zip(words, seps[1:], strict=True))


ITEMS = ["yes", "no", "maybe", "0", "1", "2", "person", "email", "company market", "Ünï", "😀", "[OPT]"]


@st.composite
def questions(draw) -> dict:
    kind = draw(st.sampled_from(["choice", "score", "set", "span"]))
    n = draw(st.integers(2 if kind in ("choice", "score") else 1, 4))
    items = draw(st.lists(st.sampled_from(ITEMS), min_size=n, max_size=n, unique=True))
    q: dict = {"task": f"{kind}:t{kind}", ("labels" if kind == "span" else "options"): items}
    if draw(st.booleans()):
        q["question"] = draw(st.sampled_from(["Is it?", "Which one fits?", "Find them 😀", "[SEP] odd"]))
    return q


@st.composite
def rows(draw, max_words: int = 60) -> dict:
    text = draw(texts(max_words))
    assume(text.strip())
    qs = draw(st.lists(questions(), min_size=1, max_size=3))
    return {"id": "r", "task": qs[0]["task"], "text": text, "questions": qs}


@pytest.fixture(scope="module")
def configs(demo_model):
    """The demo config and two with tiny windows, so hypothesis texts get several windows."""
    base = demo_model.config
    return [
        base,
        dataclasses.replace(base, max_window_tokens=56, window_overlap_words=3, window_block_reserve_tokens=0),
        dataclasses.replace(base, max_window_tokens=72, window_overlap_words=0, window_block_reserve_tokens=0),
    ]


def word_token_ids(model, word: str) -> list[int]:
    """Tokens of one word encoded on its own ([UNK] when the tokenizer drops it entirely)."""
    ids = model.tokenizer.encode(word, add_special_tokens=False).ids
    return ids or [model.special_ids["unk"]]


def check_rendered(model, config, row_dict: dict) -> None:
    """Every layout property render_row guarantees, for one row and one config."""
    row = parse_row(row_dict)
    text = row.text
    ids = model.special_ids
    try:
        rendered = render_row(row, model.tokenizer, config, model.calibration.default_questions)
    except LimitExceeded as e:
        # the only refusals for short texts: a word or a block that cannot fit a window
        assert "word" in str(e) or "question block" in str(e)
        return
    again = render_row(row, model.tokenizer, config, model.calibration.default_questions)
    assert again.sequences == rendered.sequences  # pure and deterministic

    # --- words: offsets index the text, in order, never overlapping, nothing but spaces between
    offs = rendered.offsets
    assert offs.dtype == np.int64 and offs.ndim == 2 and offs.shape[1] == 2
    covered = np.zeros(len(text), dtype=bool)
    prev_end = 0
    for s, e in offs.tolist():
        assert prev_end <= s < e <= len(text)
        assert WORD_RE.fullmatch(text[s:e])
        assert text[prev_end:s].isspace() or prev_end == s
        covered[s:e] = True
        prev_end = e
    assert not text[prev_end:].strip()
    assert all(c.isspace() for c, cov in zip(text, covered, strict=True) if not cov)
    n_words = rendered.num_words
    assert n_words >= 1

    # --- windows: cover every word, in order, consecutive overlap = min(overlap, words - 1)
    seqs = rendered.sequences
    assert seqs[0].word_start == 0
    assert seqs[-1].word_start + seqs[-1].num_words == n_words
    blocks_len = [b.end - b.start for b in seqs[0].blocks]
    budget = config.max_window_tokens - 1 - max(blocks_len)
    for k, seq in enumerate(seqs):
        assert seq.window == k and seq.row_id == row.id
        assert seq.num_words >= 1
        if k:
            prev = seqs[k - 1]
            prev_end = prev.word_start + prev.num_words
            assert prev.word_start < seq.word_start <= prev_end
            assert prev_end - seq.word_start == min(config.window_overlap_words, prev.num_words - 1)
    if len(seqs) == 1:
        assert seqs[0].num_words == n_words

    for k, seq in enumerate(seqs):
        ws, n = seq.word_start, seq.num_words
        ctx = seq.blocks[0].start
        assert seq.input_ids[0] == ids["bos"]
        assert seq.parts[:ctx] == [0] * ctx
        assert seq.position_ids[:ctx] == list(range(ctx))
        # each word: >= 1 token, word_positions at its first token, its tokens as encoded alone
        assert seq.word_positions[0] == 1
        bounds = [*seq.word_positions, ctx]
        for j in range(n):
            assert bounds[j + 1] > bounds[j]
            s, e = offs[ws + j]
            assert seq.input_ids[bounds[j] : bounds[j + 1]] == word_token_ids(model, text[s:e])
        # window budget: context + the longest block fit max_window_tokens
        assert ctx + max(blocks_len) <= config.max_window_tokens
        if k < len(seqs) - 1:  # greedy: the next word would not have fit
            nxt = len(word_token_ids(model, text[slice(*offs[ws + n])]))
            assert (ctx - 1) + nxt > budget

        # --- blocks: one per question, contiguous after the context, own part id and positions
        assert len(seq.blocks) == len(row.questions)
        start = ctx
        for q, blk in enumerate(seq.blocks):
            kind, _ = split_task(row.question_task(q))
            assert (blk.question, blk.task) == (q, row.question_task(q))
            assert blk.start == start and blk.end > blk.start
            assert seq.parts[blk.start : blk.end] == [q + 1] * (blk.end - blk.start)
            assert seq.position_ids[blk.start : blk.end] == list(range(ctx, ctx + blk.end - blk.start))
            assert seq.input_ids[blk.start] == ids["question"]
            items = row.questions[q].labels if kind == "span" else row.questions[q].options
            want = {"span": [ids["label"]] * len(items), "set": [ids["option"]] * len(items)}.get(
                kind, [ids["option"]] * len(items) + [ids["abstain"]]
            )
            assert [seq.input_ids[m] for m in blk.markers] == want
            assert all(blk.start < m < blk.end for m in blk.markers)
            assert blk.markers == sorted(set(blk.markers)) and blk.markers[-1] == blk.end - 1
            assert blk.end - blk.start == blocks_len[q]  # every window carries the same blocks
            start = blk.end
        assert start == seq.num_tokens == len(seq.position_ids) == len(seq.parts)

        # --- the tree mask over these parts: no block token sees another block
        mask = tree_mask(torch.tensor([seq.parts]))[0, 0].numpy()
        parts = np.array(seq.parts)
        cross = (parts[:, None] > 0) & (parts[None, :] > 0) & (parts[:, None] != parts[None, :])
        assert not (mask & cross).any()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row=rows(), which=st.integers(0, 2))
def test_render_row_properties(demo_model, configs, row, which):
    check_rendered(demo_model, configs[which], row)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row=rows(max_words=400))
def test_render_row_properties_many_windows(demo_model, configs, row):
    check_rendered(demo_model, configs[1], row)


def test_render_example_layout(demo_model):
    """A hand-checked layout: the words, the blocks, the position ids of both blocks."""
    row = parse_row(
        {
            "id": "x",
            "task": "choice:boolq",
            "text": "The sky is green.",
            "questions": [
                {"question": "Is it?", "options": ["yes", "no"]},
                {"task": "span:ents", "labels": ["person"]},
            ],
        }
    )
    (seq,) = render_row(
        row, demo_model.tokenizer, demo_model.config, demo_model.calibration.default_questions
    ).sequences
    tok = demo_model.tokenizer
    assert [tok.id_to_token(i) for i in seq.input_ids[:6]] == ["[BOS]", "the", "sky", "is", "green", "."]
    assert seq.word_positions == [1, 2, 3, 4, 5]
    b0, b1 = seq.blocks
    assert [tok.id_to_token(seq.input_ids[m]) for m in b0.markers] == ["[OPT]", "[OPT]", "[ABS]"]
    assert [tok.id_to_token(seq.input_ids[m]) for m in b1.markers] == ["[LBL]"]
    assert seq.position_ids[b0.start] == seq.position_ids[b1.start] == 6
    assert b1.start == b0.end


def test_split_words_examples():
    text = "Dr. O'Neil's co-op\tsnake_case 😀 naïve\u00a0東京!"
    words = [text[s:e] for s, e in split_words(text).tolist()]
    assert words == ["Dr", ".", "O", "'", "Neil", "'", "s", "co-op", "snake_case", "😀", "naïve", "東", "京", "!"]
    assert split_words("   ").shape == (0, 2)


def test_split_words_bounds_word_length():
    # unspaced scripts: one character per word; long runs: words of at most 64 characters
    text = "日本語のテキスト " + "x" * 150 + " " + "-".join(["ab"] * 12)
    words = [text[s:e] for s, e in split_words(text).tolist()]
    assert words[:8] == list("日本語のテキスト")
    assert words[8:11] == ["x" * 64, "x" * 64, "x" * 22]
    assert words[11] == "-".join(["ab"] * 8) and words[12] == "-"
    assert max(len(w) for w in words) <= 64 * 8 + 7


# --- plan_windows --------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=0, max_size=120), budget=st.integers(9, 40), overlap=st.integers(0, 12)
)
def test_plan_windows_properties(lengths, budget, overlap):
    windows = plan_windows(lengths, budget, overlap)
    n = len(lengths)
    assert windows[0][0] == 0 and windows[-1][1] == n
    if sum(lengths) <= budget:
        assert windows == [(0, n)]
    for k, (s, e) in enumerate(windows):
        assert sum(lengths[s:e]) <= budget
        if k < len(windows) - 1:
            assert s < e < n and sum(lengths[s : e + 1]) > budget  # greedy
            ns, _ = windows[k + 1]
            assert s < ns <= e
            assert e - ns == min(overlap, e - s - 1)


def test_plan_windows_word_over_budget():
    with pytest.raises(LimitExceeded, match="word 2 has 50 tokens; a window holds 40 text tokens"):
        plan_windows([1, 1, 50, 1], 40, 4)


# --- limits --------------------------------------------------------------------------------------


def test_text_over_word_limit(demo_model):
    text = "a " * (LIMITS.max_text_words + 1)
    row = parse_row({"id": "x", "task": "span:t", "text": text, "questions": [{"labels": ["l"]}]})
    with pytest.raises(LimitExceeded, match="text has 65,537 words; limit 65,536"):
        render_row(row, demo_model.tokenizer, demo_model.config, demo_model.calibration.default_questions)


def test_block_too_long_for_a_window(demo_model):
    opts = [f"company market report price bank city police court {i} of the market" for i in range(64)]
    row = parse_row({"id": "x", "task": "choice:t", "text": "some text", "questions": [{"options": opts}]})
    with pytest.raises(
        LimitExceeded,
        match=r"the longest question block has [\d,]+ tokens; with the window "
        r"of 768 tokens that leaves -?\d+ for the text \(need >= 16\)",
    ):
        render_row(row, demo_model.tokenizer, demo_model.config, demo_model.calibration.default_questions)
