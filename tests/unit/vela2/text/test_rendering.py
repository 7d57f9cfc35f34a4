"""render_row: hypothesis properties of the token layout (offsets, words, blocks, markers, positions,
windows) exactly as vela2/text/rendering.py guarantees them, plus plan_windows and the limits."""

from __future__ import annotations

import dataclasses
import random
import string

import numpy as np
import pytest
import regex
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vela2.api.schemas import parse_row, split_task
from vela2.config import LIMITS
from vela2.errors import LimitExceeded
from vela2.model.attention import tree_mask
from vela2.text.rendering import (
    MAX_MARKS,
    UNSPACED_SCRIPTS,
    WORD_RE,
    plan_windows,
    render_row,
    split_words,
    text_budget,
    window_bound,
)

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
            assert prev.word_start < seq.word_start <= prev_end < seq.word_start + seq.num_words
            shared = prev_end - seq.word_start  # at most the overlap, at most half the window
            assert shared <= min(config.window_overlap_words, prev.num_words // 2)
            if k >= 2:  # no word in 3 windows
                assert seq.word_start >= seqs[k - 2].word_start + seqs[k - 2].num_words
    lengths = [len(word_token_ids(model, text[s:e])) for s, e in offs.tolist()]
    budget_now = config.max_window_tokens - 1 - max(config.block_reserve_tokens, *(
        b.end - b.start for b in seqs[0].blocks))
    assert [(q.word_start, q.word_start + q.num_words) for q in seqs] == plan_windows(
        lengths, budget_now, config.window_overlap_words)
    assert len(seqs) <= window_bound(n_words, budget_now, max(lengths), config.window_overlap_words)
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
    assert [tok.id_to_token(i) for i in seq.input_ids[:6]] == ["[BOS]", "The", "sky", "is", "green", "."]
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


def test_split_words_keeps_combining_marks_in_their_word():
    """Found by review: `re`'s \\w leaves out combining marks, so a decomposed "Müller" or any
    Devanagari word fell apart and a span could end inside a letter."""
    cases = {
        "Irene Mu\u0308ller": ["Irene", "Mu\u0308ller"],
        "Rosa Garci\u0301a": ["Rosa", "Garci\u0301a"],
        "Davis\u0303 x": ["Davis\u0303", "x"],  # no precomposed letter exists
        "नमस्ते दुनिया": ["नमस्ते", "दुनिया"],
        "co\u0301-op_e\u0301": ["co\u0301-op_e\u0301"],
        "\u0301abc": ["\u0301", "abc"],  # a mark with no letter before it is a word of its own
        "か\u3099き": ["か", "\u3099", "き"],  # unspaced scripts: still one character per word
    }
    for text, words in cases.items():
        assert [text[s:e] for s, e in split_words(text).tolist()] == words, text
    assert len(split_words("e\u0301" * 100)) == 2  # 64 letters a word, each with its mark
    # at most MAX_MARKS marks stay with a letter; stacked ones ("Zalgo") are words of their own, as
    # before marks joined words, so no mark run makes a word longer than 64 x 3 characters
    zalgo = "Zoe" + "\u0301" * 400 + " x"
    words = [zalgo[s:e] for s, e in split_words(zalgo).tolist()]
    assert words[0] == "Zoe" + "\u0301" * MAX_MARKS and len(words) == 1 + 400 - MAX_MARKS + 1
    assert max(e - s for s, e in split_words(("a" + "\u0301" * 9) * 10_000).tolist()) <= 64 * (1 + MAX_MARKS)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(alphabet=st.characters(max_codepoint=127), max_size=300),
                 st.text(alphabet=st.characters(exclude_categories=("Mn", "Mc", "Me", "Cs")), max_size=300),
                 st.text(max_size=300)))
def test_the_fast_patterns_split_as_the_general_one_does(text):
    """split_words takes a faster pattern for ASCII text and for text without a mark: the same words."""
    assert split_words(text).tolist() == [list(m.span()) for m in WORD_RE.finditer(text)]


def test_split_words_bounds_word_length():
    # unspaced scripts: one character per word; long runs: words of at most 64 characters
    text = "日本語のテキスト " + "x" * 150 + " " + "-".join(["ab"] * 12)
    words = [text[s:e] for s, e in split_words(text).tolist()]
    assert words[:8] == list("日本語のテキスト")
    assert words[8:11] == ["x" * 64, "x" * 64, "x" * 22]
    assert words[11] == "-".join(["ab"] * 8) and words[12] == "-"
    assert max(len(w) for w in words) <= 64 * 8 + 7


_UNSPACED_RE = regex.compile("[" + "".join(f"\\p{{Script={name}}}" for name in UNSPACED_SCRIPTS) + "]")
UNSPACED = [m.start() for m in _UNSPACED_RE.finditer("".join(map(chr, range(0x110000))))]


def test_unspaced_scripts_are_the_documented_ones():
    assert UNSPACED_SCRIPTS == ("Han", "Hiragana", "Katakana")
    # the code points the first implementation missed (outside the main blocks) are in
    for cp in (0xFF66, 0xFF9D, 0x3005, 0x20000, 0x2A700, 0x2B740, 0x2B820, 0x2CEB0, 0x30000, 0x31350,
               0x2EBF0, 0xF900, 0xFAD9, 0x2F800, 0x2FA1D, 0x31F0, 0x31FF, 0x1B000, 0x1B16F - 7, 0x1AFF0):
        assert cp in UNSPACED or not regex.match(r"\p{Assigned}", chr(cp)), hex(cp)
    assert len(UNSPACED) > 90_000


def test_every_unspaced_code_point_is_a_word_of_its_own():
    """All of them, exhaustively: between Latin letters, between spaces and next to each other."""
    for pattern in ("a{}b", " {} ", "{}{}"):
        chars = [chr(cp) for cp in UNSPACED]
        text = " ".join(pattern.format(c, c) if pattern == "{}{}" else pattern.format(c) for c in chars)
        words = [text[s:e] for s, e in split_words(text).tolist()]
        if pattern == "a{}b":
            want = [w for c in chars for w in ("a", c, "b")]
        elif pattern == " {} ":
            want = chars
        else:
            want = [w for c in chars for w in (c, c)]
        assert words == want, pattern


any_char = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=("Cs",))


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(
        st.one_of(
            st.sampled_from(UNSPACED).map(chr),
            st.text(any_char, min_size=1, max_size=6),
            st.sampled_from([" ", "a", "Z", "-", "_", "abc", "1"]),
        ),
        max_size=40,
    )
)
def test_split_words_over_all_of_unicode(parts):
    """Any text of any code points: offsets slice the original text, in order, every non-space
    character inside a word and only spaces between words; an unspaced-script character placed
    between spaces or Latin letters is a word of its own, and so is every unspaced character."""
    text = "".join(parts)
    offs = split_words(text)
    assert offs.dtype == np.int64 and offs.shape[1] == 2
    prev = 0
    starts = set()
    for s, e in offs.tolist():
        assert prev <= s < e <= len(text)
        assert not text[prev:s].strip()
        word = text[s:e]
        assert WORD_RE.fullmatch(word)
        if any(_UNSPACED_RE.match(c) for c in word):
            assert len(word) == 1
        starts.add(s)
        prev = e
    assert not text[prev:].strip()
    for i, c in enumerate(text):
        if _UNSPACED_RE.match(c) and (i == 0 or text[i - 1] in " aZ") and (i + 1 == len(text) or text[i + 1] in " aZ"):
            assert i in starts and [i, i + 1] in offs.tolist()


# --- plan_windows --------------------------------------------------------------------------------


def old_plan(lengths: list[int], budget: int, overlap: int) -> list[tuple[int, int]]:
    """The plan before the step bound: the next window at max(start + 1, end - overlap)."""
    if sum(lengths) <= budget:
        return [(0, len(lengths))]
    windows, start = [], 0
    while True:
        used, end = 0, start
        while end < len(lengths) and used + lengths[end] <= budget:
            used, end = used + lengths[end], end + 1
        windows.append((start, end))
        if end >= len(lengths):
            return windows
        start = max(start + 1, end - overlap)


@settings(max_examples=400, deadline=None)
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
            ns, ne = windows[k + 1]
            assert s < ns <= e < ne  # every window holds a new word
            # the rule: end - min(overlap, words // 2), not before the end of the window before
            # this one, and late enough that word e fits
            before = windows[k - 1][1] if k else 0
            fit = min(j for j in range(e + 1) if sum(lengths[j : e + 1]) <= budget)
            assert ns == max(e - min(overlap, (e - s) // 2), before, fit)
            assert ns - s >= (e - s + 1) // 2  # every step at least half the window
    covered = [0] * n
    for s, e in windows:
        for i in range(s, e):
            covered[i] += 1
    assert all(1 <= c <= 2 for c in covered)  # every word in one or two windows
    assert len(windows) <= window_bound(n, budget, max(lengths, default=1), overlap)


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 4), min_size=0, max_size=200), budget=st.integers(30, 60), overlap=st.integers(0, 8)
)
def test_plan_windows_unchanged_for_normal_texts(lengths, budget, overlap):
    """Where every window holds at least twice the overlap (and the overlap leaves room for the next
    word), the plan is the one of the old rule, exactly: long-text answers keep their values."""
    old = old_plan(lengths, budget, overlap)
    normal = all(
        e - s >= 2 * overlap and sum(lengths[e - overlap : e + 1]) <= budget for s, e in old[:-1]
    )
    if normal:
        assert plan_windows(lengths, budget, overlap) == old


def test_plan_windows_long_words_step_by_half_a_window():
    # 5 words per window, overlap 64: the old rule stepped one word at a time (n - 4 windows)
    lengths = [10] * 1000
    assert len(old_plan(lengths, 50, 64)) == 996
    windows = plan_windows(lengths, 50, 64)
    assert windows[:3] == [(0, 5), (3, 8), (6, 11)]  # 2 shared words: half of 5
    assert len(windows) == 333 and window_bound(1000, 50, 10, 64) == 334


def test_plan_windows_a_big_word_after_small_ones():
    # the overlap (small words) plus the big word do not fit: overlap words are given up, no window
    # lies inside another, and no word sits in more than 2 windows
    lengths = [1] * 20 + [20] + [1] * 5
    windows = plan_windows(lengths, 20, 8)
    assert windows == [(0, 20), (20, 21), (21, 26)]
    lengths = [1] * 30 + [15] + [1] * 5
    assert plan_windows(lengths, 20, 8) == [(0, 20), (12, 30), (25, 31), (30, 36)]


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 5000), budget=st.integers(16, 2000), word_tokens=st.integers(1, 2000),
       overlap=st.integers(0, 128), seed=st.integers(0, 2**32 - 1))
def test_window_bound_holds(n, budget, word_tokens, overlap, seed):
    m = min(word_tokens, budget)
    rng = random.Random(seed)
    for lengths in ([m] * n, [rng.randint(1, m) for _ in range(n)], [rng.choice((1, m)) for _ in range(n)]):
        assert len(plan_windows(lengths, budget, overlap)) <= window_bound(n, budget, m, overlap)


def test_a_request_is_refused_by_the_tokens_it_renders_to(demo_model):
    q = {"question": "zq " * 150, "options": ["yes", "no"]}  # z ##q: two tokens in any demo vocabulary
    row = parse_row({"id": "x", "task": "choice:t", "text": "word " * 60_000, "questions": [q] * 32})
    with pytest.raises(LimitExceeded, match=r"renders to [\d,]+ tokens \([\d,]+ windows x 32 question blocks\); "
                                            rf"limit {LIMITS.max_request_tokens:,}"):
        render_row(row, demo_model.tokenizer, demo_model.config, demo_model.calibration.default_questions)


def _config_2048():
    from vela2.config import HeadsConfig, Vela2Config

    return Vela2Config(name="x", backbone={"hidden_size": 8}, heads=HeadsConfig(option_hidden=8, span_dim=8))


def test_two_million_characters_of_long_words_stay_bounded(demo_model):
    """2,000,000 characters of 64-character words: the old plan made ~30,800 windows (one word per
    step); now about a quarter, within window_bound, every word in at most 2 windows; and the request
    itself is refused by its rendered size before any sequence is built."""
    rng = random.Random(7)
    vocab = ["".join(rng.choice(string.ascii_lowercase) for _ in range(64)) for _ in range(500)]
    n = LIMITS.max_text_chars // 65
    words = [rng.choice(vocab) for _ in range(n)]
    cfg = demo_model.config
    tokens = {w: len(word_token_ids(demo_model, w)) for w in vocab}
    lengths = [tokens[w] for w in words]
    plan = plan_windows(lengths, text_budget(cfg, 0), cfg.window_overlap_words)
    bound = window_bound(n, text_budget(cfg, 0), max(tokens.values()), cfg.window_overlap_words)
    assert len(plan) <= bound < 10_000  # the old plan: n - 7 = 30,762 windows
    counts = np.zeros(n, dtype=np.int64)
    for ws, we in plan:
        counts[ws:we] += 1
    assert counts.min() == 1 and counts.max() == 2
    row = parse_row({"id": "x", "task": "span:t", "text": " ".join(words), "questions": [{"labels": ["a"]}]})
    with pytest.raises(LimitExceeded, match=rf"renders to [\d,]+ tokens \({len(plan):,} windows x 1 question "
                                            rf"blocks\); limit {LIMITS.max_request_tokens:,}"):
        render_row(row, demo_model.tokenizer, cfg, demo_model.calibration.default_questions)


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


@pytest.fixture(scope="module")
def tokenizer_kinds(demo_model) -> dict[str, object]:
    """Small tokenizers of the common families (trained here, offline) beside the demo's."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    corpus = [" ".join(VOCAB), " ".join(ODD), "co-op snake_case_name naïve 東京 😀 1,234.56"] * 20
    made = {}
    for kind in ("bytelevel-bpe", "metaspace-bpe", "wordpiece", "unigram"):
        if kind == "bytelevel-bpe":
            tok = Tokenizer(models.BPE())
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        elif kind == "metaspace-bpe":
            tok = Tokenizer(models.BPE(unk_token="[UNK]"))
            tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
            trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"])
        elif kind == "wordpiece":
            tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
            tok.normalizer = normalizers.BertNormalizer()
            tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]"])
        else:
            tok = Tokenizer(models.Unigram())
            tok.pre_tokenizer = pre_tokenizers.Metaspace()
            trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=["[UNK]"], unk_token="[UNK]")
        tok.train_from_iterator(corpus, trainer)
        made[kind] = tok
    return {"demo": demo_model.tokenizer, **made}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(words_st, min_size=1, max_size=30), min_size=1, max_size=4))
def test_cached_word_tokens_equal_a_fresh_encode(demo_model, tokenizer_kinds, batches):
    """The word cache returns what the tokenizer gives each word in context (tokenizers encode a
    pre-tokenized input word by word), for every tokenizer family, across hits, misses and a cache
    that starts afresh when full (a tiny WORD_CACHE_SIZE)."""
    from vela2.text.rendering import Renderer

    for name, tok in tokenizer_kinds.items():
        renderer = Renderer(tok, demo_model.config, demo_model.calibration.default_questions)
        renderer.word_cache_size = 40
        unk = renderer.ids["unk"]
        for words in [*batches, *batches]:  # the second pass hits the cache
            enc = renderer.tokenizer.encode(words, is_pretokenized=True, add_special_tokens=False)
            want: list[list[int]] = [[] for _ in words]
            for tid, wid in zip(enc.ids, enc.word_ids, strict=True):
                want[wid].append(tid)
            got = renderer.word_tokens(words)
            assert [list(t) for t in got] == [w or [unk] for w in want], name
            assert len(renderer._words) <= 40



SPECIAL_STRINGS = ["[PAD]", "[BOS]", "[Q]", "[SEP]", "[OPT]", "[ABS]", "[LBL]", "[UNK]"]
_SPECIAL_RE = regex.compile("|".join(regex.escape(t) for t in SPECIAL_STRINGS))


def _structure(model, rendered) -> list:
    """What the markers make of a rendering: per sequence, every structure token with its part, each
    block's task and marker count, and the ids its markers point at. ([UNK] is not structure: text
    the vocabulary lacks becomes it, typed or not.)"""
    special = {i for name, i in model.special_ids.items() if name != "unk"}
    return [([(t, p) for t, p in zip(s.input_ids, s.parts, strict=True) if t in special],
             [(b.task, len(b.markers)) for b in s.blocks],
             [s.input_ids[m] for b in s.blocks for m in b.markers]) for s in rendered.sequences]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts(), kinds=st.lists(st.sampled_from(["choice", "score", "set", "span"]), min_size=1, max_size=3),
       pieces=st.lists(st.text(max_size=6), min_size=1, max_size=8),
       specials=st.lists(st.sampled_from(SPECIAL_STRINGS), min_size=1, max_size=8), seed=st.integers(0, 2**16))
def test_special_token_strings_in_user_strings_stay_text(demo_model, text, kinds, pieces, specials, seed):
    """Questions, options and labels holding every special token's string (and random text around
    them) render to the same structure — special tokens, parts, blocks, markers — as the same row
    with those strings removed: typed "[OPT]" is text, never an option."""
    assume(text.strip())
    rnd = random.Random(seed)

    def spiked(prefix: str) -> str:
        bits = [prefix, *pieces, *SPECIAL_STRINGS, *specials]
        rnd.shuffle(bits)
        return "".join(bits)

    questions = []
    for q, kind in enumerate(kinds):
        items = [spiked(f"i{q}x{k}") for k in range(rnd.randint(2, 4))]
        questions.append({"task": f"{kind}:t{kind}", "question": spiked(f"q{q} "),
                          ("labels" if kind == "span" else "options"): items})
    dirty = {"id": "r", "task": questions[0]["task"], "text": text, "questions": questions}

    def clean(v):
        if isinstance(v, str):
            return _SPECIAL_RE.sub("", v)
        return [clean(x) for x in v] if isinstance(v, list) else {k: clean(x) for k, x in v.items()}

    cleaned = {**clean({"questions": questions}), "id": "r", "task": questions[0]["task"], "text": text}
    config, defaults = demo_model.config, demo_model.calibration.default_questions
    try:
        got = render_row(parse_row(dirty), demo_model.tokenizer, config, defaults)
    except LimitExceeded:  # a block too long for the window: refused whole, never mis-rendered
        return
    want = render_row(parse_row(cleaned), demo_model.tokenizer, config, defaults)
    assert _structure(demo_model, got) == _structure(demo_model, want)
