"""render_row: the single source of token layout (context, question blocks, markers, windows).

A rendered sequence is [BOS] + context word tokens (part 0), then one block per question (part k):
    [Q] question tokens [SEP] (option tokens [OPT])* [ABS]      choice / score
    [Q] question tokens [SEP] (option tokens [OPT])*            set
    [Q] question tokens [SEP] (label tokens [LBL])*             span
Heads read the hidden state at each marker (it has seen its option / label text and the context)
and at each context word's first token. Position ids of every block start at the context length,
so each block sees exactly what it would see if it were asked alone.

A context longer than `max_window_tokens - 1 - max(block reserve, longest block)` is split into
overlapping word windows (`plan_windows`; each step at least half a window, no word in more than 2
windows, at most `window_bound` windows); every window is its own sequence
carrying all blocks. Blocks that fit the
reserve (config `window_block_reserve_tokens`, default an eighth of the window) leave the windows
of a text unchanged, so a bundled answer equals the answer asked alone, long texts included.
Rendering is a pure function of
(row, tokenizer, config, default question texts): the worker and predict() call the same code.
User strings never become structure: special-token strings typed in a question, option or label
are tokenized as the plain text they are (`plain_text_tokenizer`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import regex

from vela2.api.schemas import Row, split_task
from vela2.config import LIMITS, Vela2Config
from vela2.errors import LimitExceeded

# Scripts written without spaces: one character per word, so a Japanese or Chinese sentence is not
# one giant word. Membership is the exact Unicode Script property (per the `regex` module, which
# knows newer Unicode than `re`): CJK extensions, compatibility ideographs, halfwidth katakana, kana
# supplements and 々 included. Other word characters (`re`'s \w), each with up to MAX_MARKS combining
# marks that follow it (accents, vowel signs: \p{M}, which \w leaves out, so "Mu\u0308ller" and
# Devanagari words stay whole), form words of at most 64 characters (a longer run, e.g. a base64
# blob, is split into several words), joined by at most 7 hyphens or underscores; any other
# non-space character is a word of its own.
UNSPACED_SCRIPTS = ("Han", "Hiragana", "Katakana")


@lru_cache(maxsize=1)
def _every_code_point() -> str:
    return np.arange(0x110000, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")


def _mark_ranges(unspaced: str) -> list[tuple[int, int]]:
    """Code point ranges [first, last] of combining marks (\\p{M}; none is a `re` word character),
    less those of the unspaced scripts (char class `unspaced`: such a mark stays a word of its own)."""
    other = re.compile(f"[^{unspaced}]")
    ranges: list[tuple[int, int]] = []
    for c in (ord(ch) for m in regex.finditer(r"\p{M}+", _every_code_point()) for ch in m.group()):
        if not other.match(chr(c)):
            continue
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1] = (ranges[-1][0], c)
        else:
            ranges.append((c, c))
    return ranges


def _script_ranges(scripts: tuple[str, ...]) -> list[tuple[int, int]]:
    """Code point ranges [first, last] used by one of `scripts` (Script_Extensions, which also
    counts the marks these scripts share, such as ー U+30FC and ｰ U+FF70). Gaps between two ranges that
    hold no word character, no space and no combining mark are folded in: such a character is a word
    of its own either way, and a short class keeps split_words fast."""
    every = _every_code_point()
    found = "".join(f"\\p{{Script_Extensions={name}}}" for name in scripts)
    ranges: list[tuple[int, int]] = []
    for m in regex.finditer(f"[{found}]+", every):
        first, last = m.start(), m.end() - 1
        gap = every[ranges[-1][1] + 1 : first] if ranges else ""
        if ranges and not re.search(r"[\w\s]", gap) and not regex.search(r"\p{M}", gap):
            first = ranges.pop()[0]
        ranges.append((first, last))
    return ranges


def _char_class(ranges: list[tuple[int, int]]) -> str:
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


_UNSPACED = _char_class(_script_ranges(UNSPACED_SCRIPTS))
_MARKS = _char_class(_mark_ranges(_UNSPACED))
_every_code_point.cache_clear()  # 4 MB, needed only to build the classes above
MAX_MARKS = 2  # combining marks kept with one letter (Vietnamese, Thai, Devanagari need at most 2);
# more after it are words of their own, as every mark was before, so a word stays at most
# 64 x 3 characters a run (a text of stacked marks, "Zalgo", cannot make one giant word)
# a word character and the marks after it (disjoint classes: no backtracking), 1-64 of them
_W = f"(?:[^\\W{_UNSPACED}][{_MARKS}]{{0,{MAX_MARKS}}}){{1,64}}"
# The alternatives start on disjoint characters (a run's first one is never unspaced), so their
# order changes no match; the common one comes first.
WORD_RE = re.compile(f"{_W}(?:[-_]{_W}){{0,7}}|[{_UNSPACED}]|\\S")
# The same words for text without a mark (one fast scan tells), ~2.5x faster: testing the large
# mark class after every character is what makes WORD_RE slow; and for ASCII text faster still
_ANY_MARK = regex.compile(r"\p{M}")  # the class _MARKS is made of
_PLAIN_W = f"[^\\W{_UNSPACED}]{{1,64}}"
_PLAIN_WORD_RE = re.compile(f"{_PLAIN_W}(?:[-_]{_PLAIN_W}){{0,7}}|[{_UNSPACED}]|\\S")
_ASCII_WORD_RE = re.compile(r"[A-Za-z0-9_]{1,64}(?:[-_][A-Za-z0-9_]{1,64}){0,7}|\S")  # \S: \x1c-\x1f are spaces


def _word_re(text: str) -> re.Pattern[str]:
    """The fastest of the three patterns that splits `text` as WORD_RE does."""
    if text.isascii():
        return _ASCII_WORD_RE
    return WORD_RE if _ANY_MARK.search(text) else _PLAIN_WORD_RE


@dataclass
class Block:
    """One question block inside a sequence."""

    question: int  # index into row.questions
    task: str  # "type:name" of this block
    start: int  # first token position in the sequence
    end: int  # one past the last token
    markers: list[int]  # positions of [OPT]* then [ABS] (choice/score), [OPT]* (set), [LBL]* (span)


@dataclass
class Sequence:
    """One model input: a window of the row's context plus all its question blocks."""

    row_id: str
    window: int  # window index within the row
    word_start: int  # index of this window's first word in the row's word list
    input_ids: list[int]
    position_ids: list[int]
    parts: list[int]  # 0 context, k block k
    blocks: list[Block]
    word_positions: list[int]  # token position of each window word's first token

    @property
    def num_tokens(self) -> int:
        """Tokens of the sequence (context and every block)."""
        return len(self.input_ids)

    @property
    def num_words(self) -> int:
        """Words of the text this window holds."""
        return len(self.word_positions)


@dataclass
class RenderedRow:
    """A rendered row: the character offsets of its words and its sequences (one per window)."""

    row: Row
    offsets: np.ndarray  # (W, 2) int64 char offsets of every word of the text
    sequences: list[Sequence] = field(default_factory=list)

    @property
    def num_words(self) -> int:
        """Words of the row's whole text."""
        return int(self.offsets.shape[0])


def split_words(text: str) -> np.ndarray:
    """Words of `text` with character offsets: (W, 2) int64, [start, end) into the original string."""
    spans = [m.span() for m in _word_re(text).finditer(text)]
    return np.array(spans, dtype=np.int64).reshape(-1, 2)


def plain_text_tokenizer(tokenizer):
    """A copy of `tokenizer` that reads the strings of special tokens ("[OPT]", "[SEP]", ...) in user
    text as plain text. Markers are inserted by id only: a question, option or label that types
    "[OPT]" must not add an option (the text is split into words, which already keeps "[" apart).
    Truncation and padding are off (a tokenizer.json saved with them on would cut or pad each string
    it encodes: windowing and padding are the renderer's)."""
    copy = type(tokenizer).from_str(tokenizer.to_str())
    copy.encode_special_tokens = True
    copy.no_truncation()
    copy.no_padding()
    return copy


class Renderer:
    """Holds the tokenizer-dependent pieces of rendering (special ids, a cache of short strings)."""

    def __init__(self, tokenizer, config: Vela2Config, default_questions: dict[str, str]):
        self.tokenizer = plain_text_tokenizer(tokenizer)
        self.config = config
        self.default_questions = default_questions
        st = config.special_tokens
        self.ids = {name: tokenizer.token_to_id(tok) for name, tok in vars(st).items()}
        self._encode = lru_cache(maxsize=65536)(self._encode_uncached)
        self._words: dict[str, tuple[int, ...]] = {}  # word -> its token ids (see word_tokens)
        self.word_cache_size = WORD_CACHE_SIZE

    def _encode_uncached(self, s: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(s, add_special_tokens=False).ids)

    def word_tokens(self, words: list[str]) -> list[tuple[int, ...]]:
        """Token ids of each word (at least one: a word the tokenizer drops becomes [UNK]).

        A pre-tokenized input is normalized, split and tokenized word by word (`tokenizers` merges
        the per-word encodings), so a word's ids do not depend on its neighbours and are cached:
        natural text repeats its words, and the tokenizer call was most of a short row's render.
        Only the words not seen yet go to the tokenizer, in one call. The cache holds at most
        `word_cache_size` words and starts afresh when full."""
        cache = self._words
        out = [cache.get(w) for w in words]
        missing = [i for i, toks in enumerate(out) if toks is None]
        if missing:
            enc = self.tokenizer.encode([words[i] for i in missing], is_pretokenized=True, add_special_tokens=False)
            found: list[list[int]] = [[] for _ in missing]
            for tid, wid in zip(enc.ids, enc.word_ids, strict=True):
                if wid is not None:
                    found[wid].append(tid)
            if len(cache) + len(missing) > self.word_cache_size:
                cache.clear()
            unk = (self.ids["unk"],)
            for i, toks in zip(missing, found, strict=True):
                out[i] = cache[words[i]] = tuple(toks) or unk
        return out  # type: ignore[return-value]  # every None was filled

    def block_tokens(self, row: Row, i: int) -> tuple[list[int], list[int]]:
        """Tokens of question block i and the offsets of its markers within the block."""
        q = row.questions[i]
        kind, _ = split_task(row.question_task(i))
        text = q.question if q.question is not None else self.default_questions[kind]
        toks = [self.ids["question"], *self._encode(text), self.ids["sep"]]
        markers: list[int] = []
        marker = self.ids["label"] if kind == "span" else self.ids["option"]
        for item in (q.labels if kind == "span" else q.options) or []:
            toks.extend(self._encode(item))
            markers.append(len(toks))
            toks.append(marker)
        if kind in ("choice", "score"):
            markers.append(len(toks))
            toks.append(self.ids["abstain"])
        return toks, markers

    def render(self, row: Row) -> RenderedRow:
        """The sequences of `row`: its text split into words and windows, every question block in each
        window. LimitExceeded for a text, a block or a request over its limit."""
        offsets = split_words(row.text)
        n_words = offsets.shape[0]
        if n_words > LIMITS.max_text_words:
            raise LimitExceeded(f"text has {n_words:,} words; limit {LIMITS.max_text_words:,}")
        word_toks = self.word_tokens([row.text[s:e] for s, e in offsets.tolist()])
        blocks = [self.block_tokens(row, i) for i in range(len(row.questions))]
        longest = max(len(t) for t, _ in blocks)
        # Context tokens one window may hold. Blocks up to the reserve do not change the plan, so the
        # windows of a text (and hence each answer) are the same whichever questions are bundled.
        budget = text_budget(self.config, longest)
        if budget < MIN_TEXT_BUDGET:
            raise LimitExceeded(
                f"the longest question block has {longest:,} tokens; with the window of "
                f"{self.config.max_window_tokens:,} tokens that leaves {budget} for the text "
                f"(need >= {MIN_TEXT_BUDGET})"
            )
        lengths = [len(t) for t in word_toks]
        plan = plan_windows(lengths, budget, self.config.window_overlap_words)
        # What the request costs the device, known before any sequence is built: every window is
        # [BOS] + its words + every block.
        prefix = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        total = sum(1 + int(prefix[we] - prefix[ws]) for ws, we in plan) + len(plan) * sum(len(t) for t, _ in blocks)
        if total > LIMITS.max_request_tokens:
            raise LimitExceeded(f"the request renders to {total:,} tokens ({len(plan):,} windows x "
                                f"{len(blocks)} question blocks); limit {LIMITS.max_request_tokens:,}")
        rendered = RenderedRow(row=row, offsets=offsets)
        for w, (ws, we) in enumerate(plan):
            rendered.sequences.append(self._sequence(row, w, ws, word_toks[ws:we], blocks))
        return rendered

    def _sequence(self, row: Row, window: int, ws: int, word_toks: list[tuple[int, ...]],
                  blocks: list[tuple[list[int], list[int]]]) -> Sequence:
        ids = [self.ids["bos"]]
        word_positions = []
        for toks in word_toks:
            word_positions.append(len(ids))
            ids.extend(toks)
        ctx = len(ids)
        positions = list(range(ctx))
        parts = [0] * ctx
        out_blocks = []
        for i, (block, markers) in enumerate(blocks):
            start = len(ids)
            ids.extend(block)
            positions.extend(range(ctx, ctx + len(block)))
            parts.extend([i + 1] * len(block))
            out_blocks.append(Block(i, row.question_task(i), start, len(ids), [start + m for m in markers]))
        return Sequence(row.id, window, ws, ids, positions, parts, out_blocks, word_positions)


WORD_CACHE_SIZE = 131_072  # words one Renderer keeps tokenized (short words: a few MB)
MIN_TEXT_BUDGET = 16  # a row whose longest block leaves fewer text tokens per window is refused


def text_budget(config: Vela2Config, longest_block: int = 0) -> int:
    """Context tokens one window holds: the window less [BOS] and the larger of the block reserve
    and the longest question block (in tokens)."""
    return config.max_window_tokens - 1 - max(config.block_reserve_tokens, longest_block)


def plan_windows(word_lengths: list[int], budget: int, overlap_words: int) -> list[tuple[int, int]]:
    """Split words into windows [start, end) of at most `budget` tokens, each filled greedily from its
    start. One window when everything fits; an empty text gives one empty window.

    The next window starts at `end - min(overlap_words, (end - start) // 2)`: windows holding at
    least twice the overlap share exactly `overlap_words` words, smaller ones (long words) half
    their words, so every step is at least half a window. Two more bounds keep the plan cheap
    whatever the word lengths: the next window never starts before the end of the window before
    the current one (no word sits in more than 2 windows), and it starts late enough that word
    `end` fits in it (every window holds a word the windows before it did not). The number of
    windows is bounded by `window_bound`.
    """
    n = len(word_lengths)
    for i, length in enumerate(word_lengths):
        if length > budget:
            raise LimitExceeded(f"word {i} has {length:,} tokens; a window holds {budget:,} text tokens")
    if sum(word_lengths) <= budget:
        return [(0, n)]
    windows = []
    start, before = 0, 0  # before: the end of the window before the current one
    while True:
        used, end = 0, start
        while end < n and used + word_lengths[end] <= budget:
            used += word_lengths[end]
            end += 1
        windows.append((start, end))
        if end >= n:
            return windows
        nxt = max(end - min(overlap_words, (end - start) // 2), before)
        used = sum(word_lengths[nxt : end + 1])
        while used > budget:  # word `end` must fit: give up overlap words from the left
            used -= word_lengths[nxt]
            nxt += 1
        start, before = nxt, end


def window_bound(n_words: int, budget: int, word_tokens: int, overlap_words: int) -> int:
    """The most windows `plan_windows` makes for `n_words` words of at most `word_tokens` tokens each
    (at most `budget`). A window that is not the last holds q = budget // word_tokens words or more
    (else the next word would have fitted), the next one starts at least
    q - min(overlap_words, q // 2) words later, and the last one starts before word n_words."""
    m = min(max(1, word_tokens), budget)
    if n_words * m <= budget:
        return 1
    q = max(1, budget // m)
    step = q - min(overlap_words, q // 2)
    return (n_words - 1) // step + 1


_RENDERERS: dict[tuple[int, int, int], Renderer] = {}


def renderer_for(tokenizer, config: Vela2Config, default_questions: dict[str, str]) -> Renderer:
    """The cached Renderer of a (tokenizer, config, questions) triple."""
    key = (id(tokenizer), id(config), id(default_questions))
    r = _RENDERERS.get(key)
    if r is None:
        r = _RENDERERS[key] = Renderer(tokenizer, config, default_questions)
    return r


def render_row(row: Row, tokenizer, config: Vela2Config, default_questions: dict[str, str]) -> RenderedRow:
    """Render one validated row into its sequences (one per window). Pure and deterministic."""
    return renderer_for(tokenizer, config, default_questions).render(row)


def part_digest(obj: Any) -> str:
    """The short hash (16 hex digits of SHA-256 over compact JSON) of one part of a rendering."""
    return hashlib.sha256(json.dumps(obj, separators=(",", ":")).encode()).hexdigest()[:16]


def render_digest(rendered: RenderedRow) -> dict[str, Any]:
    """Short hashes of each part of a rendering, so two paths' renders can be compared column by
    column (`vela2 parity`): token ids, position ids, part ids, blocks, word positions, offsets.
    """
    seqs = rendered.sequences
    return {
        "sequences": len(seqs),
        "input_ids": part_digest([s.input_ids for s in seqs]),
        "position_ids": part_digest([s.position_ids for s in seqs]),
        "parts": part_digest([s.parts for s in seqs]),
        "blocks": part_digest([[(b.question, b.task, b.start, b.end, b.markers) for b in s.blocks] for s in seqs]),
        "word_positions": part_digest([(s.word_start, s.word_positions) for s in seqs]),
        "offsets": part_digest(rendered.offsets.tolist()),
    }
