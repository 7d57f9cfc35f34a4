"""A seeded, dev-like workload mirroring the rows of the seed parity report.

The seed (shared/seed/000_*.txt) scored 230 real dev rows plus 10 constructed bundles. We cannot ship
those texts, so this module writes English-like stand-ins with the same row counts, the same bundle
structure and realistic lengths, from fixed word lists and sentence templates driven by a numpy RNG.
Person names, companies, e-mails, phone numbers, addresses and dates are real slots of the templates,
so span labels (PII, NER, QA) point at text that fits them; `gold=True` adds those spans to span rows.

Rows per copy (`SEED_COUNTS` + `CONSTRUCTED_COUNT` = 240) and lengths in words, where a word is one
unit of vela2's word splitter (`vela2.text.rendering.WORD_RE`: punctuation marks count), drawn uniformly
in the range below for the target; a text ends at the first sentence boundary past its target, so it
runs up to a sentence (about 10-20 words) longer. Question blocks come on top.

| group                              | rows | words       | text                                             |
|------------------------------------|-----:|-------------|--------------------------------------------------|
| choice:domain_dev                  | 15   | 150-600     | an article; 10 domain options                    |
| choice:factcheck_dev               | 10   | 120-400     | "Claim: ... Evidence: ..."; 3 verdicts           |
| choice:modality_dev                | 10   | 60-300      | prose, code, a table or a list; 6 modalities     |
| choice:feedback_dev                | 10   | 200-700     | chat + user feedback; 4 sentiments               |
| choice:oasst1 (bundled)            | 8    | 250-800     | prompter / assistant turn; 4 quality blocks      |
| choice:boolq                       | 8    | 100-200     | passage; a yes/no question                       |
| choice:snli                        | 8    | 20-40       | premise + hypothesis; 3 labels                   |
| choice:arc                         | 6    | 20-60       | science question stem; 4 answer options          |
| choice:massive (bundled)           | 6    | 5-20        | assistant utterance; 2-3 blocks (scenario/intent)|
| score:helpsteer2 (bundled)         | 10   | 300-600     | prompt + response; 5 attribute blocks "0".."4"   |
| score:jsts                         | 8    | 20-50       | two sentences; "0".."5"                          |
| score:klue_sts                     | 6    | 20-50       | two sentences; "0".."5"                          |
| set:shield (26 of 40 bundled)      | 40   | 120-900     | user / agent turn; 4 blocks (2 set + 2 choice)   |
| span:pii_dev                       | 30   | 200-500     | e-mails, letters, chats dense with PII           |
| span:pii_longdev_4096              | 4    | 3,891-4,096 | long transcripts with PII (about 4,096 words)    |
| span:pii_longdev_8192              | 3    | 7,782-8,192 | long transcripts with PII (about 8,192 words)    |
| span:halu                          | 20   | 250-700     | context + question + answer; "hallucination"     |
| span:toxic                         | 10   | 30-150      | forum comments with insults; "toxic"             |
| span:fewnerd                       | 6    | 20-60       | entity-dense sentences; 7 NER labels             |
| span:multiconer                    | 6    | 8-30        | short entity-dense queries; 6 NER labels         |
| span:tydiqa_goldp                  | 6    | 120-400     | passage with one answer fact; "answer"           |
| constructed:domain+4signals+pii    | 10   | 200-400     | chat with PII; 6 blocks (below)                  |

Calibration: with bench.gpu_engine's tokenizer (~1.2 tokens per word, like a real English BPE) and a
2,048-token window, the 230 dev rows of seed 0 render to 250 sequences and 146.5k tokens (the long
rows: 3 windows each at 4,096 words, 5 at 8,192), the seed's measured mix being 250 sequences and
147k tokens; the 10 constructed rows add 10 sequences and about 6k tokens.

Bundles (60 multi-question rows, as in the seed's "Bundled vs single" section): choice:oasst1 8 rows
(32 blocks), choice:massive 6 (15), score:helpsteer2 10 (50), set:shield 26 (104: prompt and response
harm sets plus prompt and response safety choices, each block with its own task), and the 10
constructed rows, each one choice block (choice:domain_dev), 4 signal blocks (score:helpsteer2
helpfulness and verbosity, set:shield prompt and response harms) and one PII span block
(span:pii_dev): 251 choice / score / set blocks and 10 span blocks, the seed's figures. The
constructed rows' own task is `CONSTRUCTED_TASK`; every block carries its own "task".

Ids are `<group>-<i>-c<copy>` (group = task, or "constructed:domain+4signals+pii"). Each row's text
comes from its own RNG seeded by (seed, copy, group, i), so a row does not depend on the others and
`make_workload(s, copies=n)[:240] == make_workload(s, copies=1)`; later copies have fresh texts of the
same distributions. Each copy is shuffled (arrival order of a mixed queue) with the RNG (seed, copy).

CLI: `python -m bench.workload --copies N --seed S --out F.jsonl` writes the rows and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vela2.text.rendering import WORD_RE

log = logging.getLogger(__name__)

# --- what the seed scored ------------------------------------------------------------------------

SEED_COUNTS: dict[str, int] = {
    "choice:domain_dev": 15,
    "choice:factcheck_dev": 10,
    "choice:modality_dev": 10,
    "choice:feedback_dev": 10,
    "choice:oasst1": 8,
    "choice:boolq": 8,
    "choice:snli": 8,
    "choice:arc": 6,
    "choice:massive": 6,
    "score:helpsteer2": 10,
    "score:jsts": 8,
    "score:klue_sts": 6,
    "set:shield": 40,
    "span:pii_dev": 30,
    "span:pii_longdev_4096": 4,
    "span:pii_longdev_8192": 3,
    "span:halu": 20,
    "span:toxic": 10,
    "span:fewnerd": 6,
    "span:multiconer": 6,
    "span:tydiqa_goldp": 6,
}  # 230 real dev rows
CONSTRUCTED = "constructed:domain+4signals+pii"
CONSTRUCTED_TASK = "choice:domain+4signals+pii"  # the constructed rows' own task (blocks carry theirs)
CONSTRUCTED_COUNT = 10
GROUPS = [*SEED_COUNTS, CONSTRUCTED]
COUNTS: dict[str, int] = {**SEED_COUNTS, CONSTRUCTED: CONSTRUCTED_COUNT}
# Multi-question rows per group (the seed's 60 bundles).
BUNDLED_COUNTS = {"choice:oasst1": 8, "choice:massive": 6, "score:helpsteer2": 10, "set:shield": 26,
                  CONSTRUCTED: 10}

# Text length range per group, in splitter words (see the module docstring).
WORDS: dict[str, tuple[int, int]] = {
    "choice:domain_dev": (150, 600),
    "choice:factcheck_dev": (120, 400),
    "choice:modality_dev": (60, 300),
    "choice:feedback_dev": (200, 700),
    "choice:oasst1": (250, 800),
    "choice:boolq": (100, 200),
    "choice:snli": (20, 40),
    "choice:arc": (20, 60),
    "choice:massive": (5, 20),
    "score:helpsteer2": (300, 600),
    "score:jsts": (20, 50),
    "score:klue_sts": (20, 50),
    "set:shield": (120, 900),
    "span:pii_dev": (200, 500),
    "span:pii_longdev_4096": (3891, 4096),
    "span:pii_longdev_8192": (7782, 8192),
    "span:halu": (250, 700),
    "span:toxic": (30, 150),
    "span:fewnerd": (20, 60),
    "span:multiconer": (8, 30),
    "span:tydiqa_goldp": (120, 400),
    CONSTRUCTED: (200, 400),
}

# --- word lists ----------------------------------------------------------------------------------

NOUNS = (
    "report team market system policy budget engine river city garden network project customer "
    "account meeting contract server village school doctor patient study result sample method model "
    "process region farmer harvest storm bridge train station museum painting author novel chapter "
    "teacher student lesson recipe kitchen flavor price supply demand factory worker manager office "
    "question answer reason theory evidence claim source article editor reader camera signal battery "
    "device software update feature release planet orbit telescope forest animal species climate "
    "island coast harbor ship crew captain journey ticket flight airport hotel guest room window "
    "council election voter law court judge lawyer trial vaccine virus treatment hospital nurse"
).split()
ADJECTIVES = (
    "large small quiet busy early late careful rapid steady bright dark modern ancient local global "
    "useful difficult simple complex honest reliable expensive cheap popular rare common strange "
    "familiar public private secure fragile strong weak recent final initial formal informal clear "
    "vague accurate narrow broad warm cold remote nearby crucial minor"
).split()
VERBS = (
    "reviewed approved rejected delivered measured described improved reduced increased replaced "
    "repaired designed tested launched closed opened visited announced published explained ignored "
    "supported questioned collected shared received ordered cancelled scheduled confirmed reported "
    "predicted compared analysed protected discovered finished started moved changed"
).split()
ADVERBS = (
    "quickly slowly carefully quietly suddenly finally rarely often usually clearly barely nearly "
    "openly firmly gently"
).split()
PREPS = "near behind inside across beyond without during after before around under over".split()
FIRST_NAMES = (
    "James Mary Robert Patricia John Jennifer Michael Linda David Elizabeth William Barbara Richard "
    "Susan Joseph Jessica Thomas Sarah Charles Karen Daniel Nancy Matthew Lisa Anthony Betty Mark "
    "Sandra Priya Arjun Mei Wei Yuki Hiroshi Fatima Omar Lucia Mateo Sofia Lars Ingrid Kwame Amara"
).split()
LAST_NAMES = (
    "Smith Johnson Williams Brown Jones Garcia Miller Davis Rodriguez Martinez Hernandez Lopez Wilson "
    "Anderson Thomas Taylor Moore Jackson Martin Lee Thompson White Harris Clark Lewis Walker Young "
    "Allen King Wright Patel Nguyen Kim Tanaka Sato Okafor Mensah Novak Larsen Rossi Dubois Becker"
).split()
COMPANIES = [
    "Northwind Traders", "Acme Logistics", "Bluebird Analytics", "Contoso Health", "Fabrikam Energy",
    "Globex Corporation", "Initech Systems", "Umbrella Freight", "Vandelay Industries", "Stark Robotics",
    "Wayne Shipping", "Tyrell Biotech", "Cyberdyne Labs", "Hooli Cloud", "Pied Piper Media",
    "Soylent Foods", "Wonka Confections", "Gringotts Bank", "Oceanic Airlines", "Monarch Insurance",
    "Silverline Telecom", "Redwood Capital", "Harbor Point Realty", "Summit Pharma", "Evergreen Power",
]
CITIES = (
    "Springfield Riverton Lakewood Fairview Greenville Madison Georgetown Clinton Salem Franklin "
    "Ashford Oakridge Brookfield Kingsport Millbrook Westhaven Portmore Eastleigh Northgate Bayview"
).split()
STREETS = [
    "Maple Street", "Oak Avenue", "Pine Road", "Cedar Lane", "Elm Drive", "Lakeview Terrace",
    "Hillcrest Road", "Sunset Boulevard", "Riverside Drive", "Church Street", "Mill Lane", "Station Road",
]
EMAIL_DOMAINS = ["example.com", "mail.example.org", "inbox.test", "corp.example.net", "post.example.co.uk"]
MONTHS = "January February March April May June July August September October November December".split()
PRODUCTS = ["Model S7 drone", "AquaPure filter", "Zenbook Pro", "Lumen desk lamp", "TrailRunner shoes",
            "Nimbus router", "Orbit smartwatch", "Falcon e-bike", "Harmony headphones", "Atlas tablet"]
EVENTS = ["the Spring Trade Fair", "the Riverton Marathon", "the Global Health Summit",
          "the Harvest Festival", "the Winter Tech Expo", "the National Science Week", "the Film Awards Gala",
          "the Open Data Forum"]
BUILDINGS = ["the Grand Central Library", "the Harbor Tower", "the Old Mill Theatre", "St. Mary's Hospital",
             "the Riverside Stadium", "the Civic Museum", "the Lakeside Conference Centre"]
WORKS = ["The Silent Harbor", "Echoes of Autumn", "A Map of Small Things", "The Last Orchard",
         "Northern Lights Suite", "City of Glass", "The Long Road Home", "Paper Moons"]
GROUPS_NER = ["the Riverside Rovers", "the Blue Notes", "the Springfield Choir", "the Harbor City Hawks",
              "the Midnight Owls", "the Green Valley Co-op"]
INSULTS = ["you absolute clown", "what a pathetic excuse for an argument", "only an idiot would say that",
           "shut up and go away", "you are a worthless troll", "this is the dumbest thing I have read",
           "get lost, loser", "nobody cares about your stupid opinion"]
HARMS = ["violence", "self-harm", "sexual", "hate", "harassment", "criminal planning", "weapons",
         "controlled substances", "privacy", "fraud", "misinformation", "profanity"]

# --- sentence templates --------------------------------------------------------------------------
# Slots: N noun, A adjective, V past verb, D adverb, P preposition, NUM number; entity slots PER ORG
# LOC EMAIL PHONE ADDR DATE PROD EVENT BLD WORK GRP TOX (their text and offsets are recorded).

GENERIC = [
    "the {A} {N} {V} the {N} {P} the {N}.",
    "{D}, the {N} {V} a {A} {N}.",
    "most of the {N}s were {A} when the {N} {V} them.",
    "it is {A} that the {N} {V} {P} the {A} {N}.",
    "after the {N} {V}, the {N} became {A}.",
    "we {V} the {N} because it was {A} and {A}.",
    "there were {NUM} {N}s {P} the {N}, and each one {V} {D}.",
    "the report says the {N} {V} {NUM} percent of the {N}.",
    "nobody expected the {N} to be so {A}.",
    "if the {N} is {A}, the {N} should be {V} {D}.",
    "in the end, the {A} {N} {V} the {N} and the {N}.",
    "the {N} was {A}; however, the {N} {V} it {D}.",
    "several {N}s {V} the {A} {N} last year.",
    "why was the {N} {V} so {D}?",
]
ENTITY = [
    "{PER} {V} the {N} at {ORG} in {LOC}.",
    "please contact {PER} at {EMAIL} or call {PHONE}.",
    "{PER} moved to {ADDR} on {DATE}.",
    "the {N} from {ORG} was signed by {PER} on {DATE}.",
    "you can reach me at {PHONE}; my email is {EMAIL}.",
    "{ORG} announced the {PROD} during {EVENT} in {LOC}.",
    "{PER} visited {BLD} in {LOC} after reading {WORK}.",
    "my name is {PER} and I live at {ADDR}.",
    "{PER} of {ORG} {V} the {A} {N} with {PER}.",
    "on {DATE}, {GRP} performed {WORK} at {BLD}.",
    "send the {N} to {EMAIL} before {DATE}, thanks, {PER}.",
]
TOXIC = [
    "honestly, {TOX}.",
    "{TOX}, nobody asked about your {N}.",
    "the {N} is {A} and {TOX}.",
]
MASSIVE = [
    "wake me up at {NUM} tomorrow", "what is the weather in {LOC} this weekend",
    "remind me to call {PER} on {DATE}", "play the {A} playlist in the {N}",
    "order a pizza from {ORG} for {NUM} people", "send an email to {EMAIL} about the {N}",
    "how long is the train from {LOC} to {LOC}", "turn off the lights in the {N}",
    "add {N} and {N} to my shopping list", "what time is it in {LOC} right now",
]
CODE_LINES = [
    "def {N}_total(items):", "    return sum(x.{N} for x in items)", "for i in range({NUM}):",
    "    print(i, {N})", "if {N} is None:", "    raise ValueError('{N} missing')",
    "result = {N}.{V}()", "{N}_count = len({N}s) + {NUM}",
]

_SLOT = re.compile(r"\{(\w+)\}")


@dataclass
class _Doc:
    """A text under construction: pieces, recorded entity spans, a running word count."""

    rng: np.random.Generator
    parts: list[str] = field(default_factory=list)
    pos: int = 0
    words: int = 0
    ents: list[tuple[str, int, int]] = field(default_factory=list)  # (slot or label, start, end)
    last_person: tuple[str, str] | None = None

    def lit(self, s: str) -> None:
        """Append literal text (headers, separators); counted in words."""
        self.parts.append(s)
        self.pos += len(s)
        self.words += len(WORD_RE.findall(s))

    def pick(self, seq: list[str]) -> str:
        return seq[int(self.rng.integers(len(seq)))]

    def _slot(self, name: str) -> str:
        r = self.rng
        if name == "N":
            return self.pick(NOUNS)
        if name == "A":
            return self.pick(ADJECTIVES)
        if name == "V":
            return self.pick(VERBS)
        if name == "D":
            return self.pick(ADVERBS)
        if name == "P":
            return self.pick(PREPS)
        if name == "NUM":
            return str(int(r.integers(2, 500)))
        if name == "PER":
            first, last = self.pick(FIRST_NAMES), self.pick(LAST_NAMES)
            self.last_person = (first, last)
            return f"{first} {last}"
        if name == "EMAIL":
            first, last = self.last_person or (self.pick(FIRST_NAMES), self.pick(LAST_NAMES))
            style = int(r.integers(3))
            user = [f"{first}.{last}", f"{first[0]}{last}", f"{first}{int(r.integers(10, 99))}"][style]
            return f"{user.lower()}@{self.pick(EMAIL_DOMAINS)}"
        if name == "PHONE":
            a, b, c = int(r.integers(200, 999)), int(r.integers(200, 999)), int(r.integers(1000, 9999))
            return [f"+1 ({a}) {b}-{c}", f"{a}-{b}-{c}", f"0{a} {b} {c}"][int(r.integers(3))]
        if name == "ADDR":
            return f"{int(r.integers(1, 2000))} {self.pick(STREETS)}, {self.pick(CITIES)}"
        if name == "DATE":
            return f"{self.pick(MONTHS)} {int(r.integers(1, 29))}, {int(r.integers(1990, 2027))}"
        table = {"ORG": COMPANIES, "LOC": CITIES, "PROD": PRODUCTS, "EVENT": EVENTS, "BLD": BUILDINGS,
                 "WORK": WORKS, "GRP": GROUPS_NER, "TOX": INSULTS}
        return self.pick(table[name])

    def fill(self, template: str, capitalize: bool = True) -> None:
        """Append one filled template, recording the offsets of its entity slots."""
        pieces = _SLOT.split(template)  # literal, slot, literal, slot, ..., literal
        out: list[str] = []
        n = 0
        for k, piece in enumerate(pieces):
            text = piece if k % 2 == 0 else self._slot(piece)
            if k % 2 == 1 and piece not in ("N", "A", "V", "D", "P", "NUM"):
                self.ents.append((piece, self.pos + n, self.pos + n + len(text)))
            out.append(text)
            n += len(text)
        s = "".join(out)
        if capitalize and s:
            s = s[0].upper() + s[1:]  # same length: recorded offsets stay valid
        self.lit(s)

    def sentences(self, n_words: int, entity_rate: float = 0.1, extra: list[str] | None = None,
                  extra_rate: float = 0.0, para_every: tuple[int, int] | None = (3, 7)) -> None:
        """Append sentences until at least `n_words` more words; paragraphs every few sentences."""
        target = self.words + n_words
        since_break, next_break = 0, self._para(para_every)
        first = True
        while self.words < target:
            if not first:
                if next_break and since_break >= next_break:
                    self.lit("\n\n")
                    since_break, next_break = 0, self._para(para_every)
                else:
                    self.lit(" ")
            first = False
            u = self.rng.random()
            if extra and u < extra_rate:
                self.fill(self.pick(extra))
            elif u < extra_rate + entity_rate:
                self.fill(self.pick(ENTITY))
            else:
                self.fill(self.pick(GENERIC))
            since_break += 1

    def _para(self, every: tuple[int, int] | None) -> int:
        return int(self.rng.integers(every[0], every[1] + 1)) if every else 0

    def mark(self, label: str, start: int) -> None:
        """Record a labelled span from `start` to the current end."""
        self.ents.append((label, start, self.pos))

    def text(self) -> str:
        return "".join(self.parts)


PII_LABELS = {"PER": "person", "EMAIL": "email", "PHONE": "phone", "ADDR": "address", "ORG": "organization",
              "DATE": "date"}
FEWNERD_LABELS = {"PER": "person", "ORG": "organization", "LOC": "location", "BLD": "building", "WORK": "art",
                  "PROD": "product", "EVENT": "event"}
MULTICONER_LABELS = {"PER": "person", "LOC": "location", "GRP": "group", "ORG": "corporation",
                     "PROD": "product", "WORK": "creative_work"}
DOMAINS = ["news", "science", "finance", "sports", "health", "legal", "technology", "entertainment", "travel",
           "education"]
SCORE_0_4 = ["0", "1", "2", "3", "4"]
SCORE_0_5 = ["0", "1", "2", "3", "4", "5"]
MASSIVE_SCENARIOS = ["alarm", "audio", "calendar", "cooking", "datetime", "email", "general", "iot", "lists",
                     "music", "news", "play", "qa", "recommendation", "social", "takeaway", "transport",
                     "weather"]
MASSIVE_INTENTS = ["alarm_set", "alarm_query", "calendar_set", "calendar_query", "email_sendemail",
                   "email_query", "iot_hue_lightoff", "iot_hue_lighton", "lists_createoradd", "lists_query",
                   "music_query", "play_music", "play_radio", "qa_factoid", "takeaway_order",
                   "transport_query", "transport_ticket", "weather_query", "datetime_query", "general_quirky"]
OASST1_BLOCKS = [
    ("Is the reply spam?", ["yes", "no"]),
    ("Does the reply fail the task?", ["yes", "no"]),
    ("How good is the reply overall?", ["low", "medium", "high"]),
    ("How toxic is the reply?", ["none", "mild", "severe"]),
]
HELPSTEER2_ATTRS = ["helpfulness", "correctness", "coherence", "complexity", "verbosity"]


@dataclass
class _Made:
    text: str
    questions: list[dict[str, Any]]
    spans: list[tuple[str, int, int]] = field(default_factory=list)  # gold (label, start, end)


def _labelled(doc: _Doc, mapping: dict[str, str]) -> list[tuple[str, int, int]]:
    return [(mapping[s], a, b) for s, a, b in doc.ents if s in mapping]


def _q(question: str, options: list[str], task: str | None = None) -> dict[str, Any]:
    q: dict[str, Any] = {"question": question, "options": list(options)}
    if task:
        q["task"] = task
    return q


def _span_q(question: str, labels: list[str], task: str | None = None) -> dict[str, Any]:
    q: dict[str, Any] = {"question": question, "labels": list(labels)}
    if task:
        q["task"] = task
    return q


def _chat(doc: _Doc, n: int, user: str, agent: str, user_share: float, entity_rate: float = 0.08) -> None:
    nu = max(3, int(n * user_share))
    doc.lit(f"{user}: ")
    doc.sentences(nu, entity_rate, para_every=None)
    doc.lit(f"\n\n{agent}: ")
    doc.sentences(max(3, n - doc.words), entity_rate)


# --- one generator per group: (rng, index, target words, bundled) -> _Made -----------------------


def _domain(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    doc.fill("{A} {N} {V} in {LOC}", capitalize=True)
    doc.lit("\n\n")
    doc.sentences(n - doc.words, 0.12)
    return _Made(doc.text(), [_q("Which domain is this text from?", DOMAINS)])


def _factcheck(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    doc.lit("Claim: ")
    doc.sentences(int(rng.integers(12, 30)), 0.3, para_every=None)
    doc.lit("\n\nEvidence: ")
    doc.sentences(n - doc.words, 0.15)
    return _Made(doc.text(), [_q("Does the evidence support the claim?", ["supported", "refuted",
                                                                            "not enough info"])])


def _modality(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    kind = int(rng.integers(4))
    if kind == 0:
        doc.sentences(n, 0.1)
    elif kind == 1:  # code
        doc.sentences(int(n * 0.2), 0.0, para_every=None)
        doc.lit("\n\n")
        while doc.words < n:
            doc.fill(doc.pick(CODE_LINES), capitalize=False)
            doc.lit("\n")
    elif kind == 2:  # table
        doc.lit("| item | owner | amount |\n|---|---|---|\n")
        while doc.words < n:
            doc.fill("| {A} {N} | {PER} | {NUM} |\n", capitalize=False)
    else:  # list
        doc.sentences(int(n * 0.2), 0.0, para_every=None)
        doc.lit("\n")
        while doc.words < n:
            doc.lit("- ")
            doc.fill(doc.pick(GENERIC))
            doc.lit("\n")
    return _Made(doc.text(), [_q("What kind of content is this?", ["text", "code", "math", "table", "list",
                                                                   "dialogue"])])


def _feedback(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    _chat(doc, int(n * 0.85), "User", "Assistant", 0.3)
    doc.lit("\n\nUser feedback: ")
    doc.sentences(max(3, n - doc.words), 0.0, para_every=None)
    return _Made(doc.text(), [_q("What is the sentiment of the user's feedback?",
                                 ["positive", "negative", "neutral", "mixed"])])


def _oasst1(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    _chat(doc, n, "Prompter", "Assistant", 0.2)
    qs = [_q(q, opts) for q, opts in OASST1_BLOCKS] if bundled else [_q(*OASST1_BLOCKS[2])]
    return _Made(doc.text(), qs)


def _boolq(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    doc.fill("{A} {N}", capitalize=True)
    doc.lit("\n\n")
    doc.sentences(n - doc.words, 0.1)
    q = _Doc(rng)
    q.fill("is the {N} {V} by the {A} {N}?")
    return _Made(doc.text(), [_q(q.text(), ["yes", "no"])])


def _snli(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    doc.lit("Premise: ")
    doc.sentences(int(n * 0.6), 0.2, para_every=None)
    doc.lit("\nHypothesis: ")
    doc.sentences(max(3, n - doc.words), 0.0, para_every=None)
    return _Made(doc.text(), [_q("Does the premise entail the hypothesis?",
                                 ["entailment", "neutral", "contradiction"])])


def _arc(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    doc.sentences(max(1, n - 15), 0.0, para_every=None)
    doc.lit(" ")
    doc.fill("which of the following best explains why the {N} {V} when the {N} was {A}?")
    options: list[str] = []
    while len(options) < 4:
        o = _Doc(rng)
        o.fill("the {A} {N} {V} the {N}", capitalize=False)
        if o.text() not in options:
            options.append(o.text())
    return _Made(doc.text(), [_q("Which answer is correct?", options)])


def _massive(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    while doc.words < n:
        if doc.parts:
            doc.lit(" and ")
        doc.fill(doc.pick(MASSIVE), capitalize=not doc.parts)
    qs = [_q("Which scenario is the request about?", MASSIVE_SCENARIOS)]
    if bundled:
        qs.append(_q("What does the user want?", MASSIVE_INTENTS))
        if i % 2 == 1:  # 3 x 2 + 3 x 3 = 15 blocks over the 6 rows
            qs.append(_q("Is the request a question or a command?", ["question", "command"]))
    return _Made(doc.text(), qs)


def _helpsteer2(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    _chat(doc, n, "User", "Assistant", 0.15)
    attrs = HELPSTEER2_ATTRS if bundled else HELPSTEER2_ATTRS[:1]
    return _Made(doc.text(), [_q(f"Rate the response's {a} from 0 to 4.", SCORE_0_4) for a in attrs])


def _sts(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    doc.lit("Sentence 1: ")
    doc.sentences(n // 2, 0.15, para_every=None)
    doc.lit("\nSentence 2: ")
    doc.sentences(max(3, n - doc.words), 0.15, para_every=None)
    return _Made(doc.text(), [_q("How similar are the two sentences (0 to 5)?", SCORE_0_5)])


def _shield_blocks(bundled: bool) -> list[dict[str, Any]]:
    prompt = _q("Which harm categories does the user's message fall into?", HARMS)
    if not bundled:
        return [prompt]
    return [
        prompt,
        _q("Which harm categories does the agent's reply fall into?", HARMS),
        _q("Is the user's message safe?", ["safe", "unsafe"], task="choice:shield_prompt"),
        _q("Is the agent's reply safe?", ["safe", "unsafe"], task="choice:shield_response"),
    ]


def _shield(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    _chat(doc, n, "User", "Agent", 0.4)
    return _Made(doc.text(), _shield_blocks(bundled))


PII_QUESTION = "Find the personal information in the text."


def _pii(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    doc.fill(doc.pick(["hi {PER},", "dear {PER},", "hello {PER},"]))
    doc.lit("\n\n")
    doc.sentences(n - doc.words, 0.35)
    doc.lit("\n\n")
    doc.fill("best regards, {PER}, {ORG}, {PHONE}")
    return _Made(doc.text(), [_span_q(PII_QUESTION, list(PII_LABELS.values()))], _labelled(doc, PII_LABELS))


def _pii_long(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    doc.fill("meeting transcript, {ORG}, {DATE}")
    while doc.words < n:
        doc.lit("\n\n")
        doc.fill("{PER}: ")
        doc.sentences(min(int(rng.integers(40, 160)), n - doc.words), 0.2, para_every=None)
    return _Made(doc.text(), [_span_q(PII_QUESTION, list(PII_LABELS.values()))], _labelled(doc, PII_LABELS))


def _halu(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    doc.lit("Context: ")
    doc.sentences(int(n * 0.6), 0.15)
    doc.lit("\n\nQuestion: ")
    doc.fill("what did {ORG} say about the {N}?")
    doc.lit("\n\nAnswer: ")
    doc.sentences(max(5, int((n - doc.words) / 2)), 0.15, para_every=None)
    doc.lit(" ")
    start = doc.pos
    doc.fill(doc.pick(ENTITY))  # the unsupported claim
    doc.mark("hallucination", start)
    if doc.words < n:
        doc.lit(" ")
        doc.sentences(n - doc.words, 0.1, para_every=None)
    spans = [(lab, a, b) for lab, a, b in doc.ents if lab == "hallucination"]
    return _Made(doc.text(), [_span_q("Which parts of the answer are not supported by the context?",
                                      ["hallucination"])], spans)


def _toxic(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    doc.sentences(n, 0.05, extra=TOXIC, extra_rate=0.3, para_every=(2, 4))
    spans = [("toxic", a, b) for s, a, b in doc.ents if s == "TOX"]
    return _Made(doc.text(), [_span_q("Find the toxic parts of the comment.", ["toxic"])], spans)


def _fewnerd(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    doc.sentences(n, 0.8, para_every=None)
    return _Made(doc.text(), [_span_q("Find the named entities.", list(FEWNERD_LABELS.values()))],
                 _labelled(doc, FEWNERD_LABELS))


def _multiconer(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    templates = ["{PER} and {GRP}", "{WORK} by {PER}", "{PROD} from {ORG} in {LOC}", "{ORG} {N} {LOC}",
                 "{GRP} live at {LOC}"]
    while doc.words < n:
        if doc.parts:
            doc.lit(" ")
        doc.fill(doc.pick(templates), capitalize=False)
    return _Made(doc.text(), [_span_q("Find the named entities.", list(MULTICONER_LABELS.values()))],
                 _labelled(doc, MULTICONER_LABELS))


def _tydiqa(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    doc.sentences(int(n * 0.4), 0.15)
    doc.lit(" ")
    company = doc.pick(COMPANIES)
    doc.lit(f"{company} was founded in {doc.pick(CITIES)} on ")
    start = doc.pos
    doc.lit(doc._slot("DATE"))
    doc.mark("answer", start)
    doc.lit(".")
    doc.lit(" ")
    doc.sentences(max(3, n - doc.words), 0.15)
    spans = [(lab, a, b) for lab, a, b in doc.ents if lab == "answer"]
    return _Made(doc.text(), [_span_q(f"When was {company} founded?", ["answer"])], spans)


def _constructed(rng, i, n, bundled) -> _Made:
    doc = _Doc(rng)
    _chat(doc, n, "User", "Assistant", 0.35, entity_rate=0.3)
    harms = _shield_blocks(True)
    qs = [
        _q("Which domain is this text from?", DOMAINS, task="choice:domain_dev"),
        _q("Rate the response's helpfulness from 0 to 4.", SCORE_0_4, task="score:helpsteer2"),
        _q("Rate the response's verbosity from 0 to 4.", SCORE_0_4, task="score:helpsteer2"),
        {**harms[0], "task": "set:shield"},
        {**harms[1], "task": "set:shield"},
        _span_q(PII_QUESTION, list(PII_LABELS.values()), task="span:pii_dev"),
    ]
    return _Made(doc.text(), qs, _labelled(doc, PII_LABELS))


GENERATORS: dict[str, Callable[[np.random.Generator, int, int, bool], _Made]] = {
    "choice:domain_dev": _domain,
    "choice:factcheck_dev": _factcheck,
    "choice:modality_dev": _modality,
    "choice:feedback_dev": _feedback,
    "choice:oasst1": _oasst1,
    "choice:boolq": _boolq,
    "choice:snli": _snli,
    "choice:arc": _arc,
    "choice:massive": _massive,
    "score:helpsteer2": _helpsteer2,
    "score:jsts": _sts,
    "score:klue_sts": _sts,
    "set:shield": _shield,
    "span:pii_dev": _pii,
    "span:pii_longdev_4096": _pii_long,
    "span:pii_longdev_8192": _pii_long,
    "span:halu": _halu,
    "span:toxic": _toxic,
    "span:fewnerd": _fewnerd,
    "span:multiconer": _multiconer,
    "span:tydiqa_goldp": _tydiqa,
    CONSTRUCTED: _constructed,
}


# --- public API ----------------------------------------------------------------------------------


def make_row(group: str, i: int, seed: int = 0, copy: int = 0, gold: bool = False) -> dict[str, Any]:
    """Row `i` of `group` (a task of SEED_COUNTS or CONSTRUCTED) for copy `copy`: a dict in the row format.

    Deterministic in (group, i, seed, copy) alone. `gold=True` adds gold spans to span rows.
    """
    if group not in GENERATORS:
        raise ValueError(f"group must be one of {', '.join(GROUPS)}; got {group!r}")
    rng = np.random.default_rng([seed, copy, GROUPS.index(group), i])
    lo, hi = WORDS[group]
    target = int(rng.integers(lo, hi + 1))
    bundled = i < BUNDLED_COUNTS.get(group, 0)
    made = GENERATORS[group](rng, i, target, bundled)
    row: dict[str, Any] = {
        "id": f"{group}-{i}-c{copy}",
        "task": CONSTRUCTED_TASK if group == CONSTRUCTED else group,
        "text": made.text,
        "questions": made.questions,
    }
    if gold and any("labels" in q for q in made.questions):
        row["gold"] = [{"label": lab, "start": a, "end": b} for lab, a, b in made.spans]
    return row


def make_workload(seed: int = 0, copies: int = 1, gold: bool = False, constructed: bool = True) -> list[dict]:
    """The seed-like mix: per copy 230 dev rows (SEED_COUNTS) plus, unless `constructed=False`, the 10
    constructed bundles, in a shuffled arrival order; `copies` fresh copies one after another.
    """
    if copies < 1:
        raise ValueError(f"copies must be >= 1; got {copies}")
    groups = GROUPS if constructed else list(SEED_COUNTS)
    rows: list[dict] = []
    for c in range(copies):
        batch = [make_row(g, i, seed, c, gold) for g in groups for i in range(COUNTS[g])]
        order = np.random.default_rng([seed, c]).permutation(len(batch))
        rows.extend(batch[k] for k in order)
    return rows


def group_of(row: dict) -> str:
    """The workload group of a row made here: its id without the `-<i>-c<copy>` suffix."""
    return row["id"].rsplit("-", 2)[0]


def is_bundle(row: dict) -> bool:
    """True for a multi-question row."""
    return len(row["questions"]) > 1


def split_bundles(rows: list[dict]) -> list[dict]:
    """Each question of a multi-question row becomes its own row (id `<id>/q<k>`, task = the block's
    task); single-question rows pass through unchanged. Order: rows in order, questions in order.
    """
    out: list[dict] = []
    for row in rows:
        if not is_bundle(row):
            out.append(row)
            continue
        for k, q in enumerate(row["questions"]):
            q = dict(q)
            task = q.pop("task", None) or row["task"]
            single = {key: v for key, v in row.items() if key not in ("id", "task", "questions", "gold")}
            out.append({**single, "id": f"{row['id']}/q{k}", "task": task, "questions": [q]})
    return out


def count_words(text: str) -> int:
    """Words as vela2's word splitter counts them (punctuation marks count)."""
    return len(WORD_RE.findall(text))


def summary(rows: list[dict]) -> dict[str, Any]:
    """Rows, questions and words (total / min / mean / max) per group, plus totals."""
    per: dict[str, dict[str, Any]] = {}
    for row in rows:
        g = group_of(row)
        s = per.setdefault(g, {"rows": 0, "bundled_rows": 0, "questions": 0, "words": []})
        s["rows"] += 1
        s["bundled_rows"] += int(is_bundle(row))
        s["questions"] += len(row["questions"])
        s["words"].append(count_words(row["text"]))
    out: dict[str, Any] = {"groups": {}}
    for g in sorted(per, key=lambda g: GROUPS.index(g) if g in GROUPS else len(GROUPS)):
        s = per[g]
        w = s.pop("words")
        out["groups"][g] = {**s, "words_total": int(sum(w)), "words_min": int(min(w)),
                            "words_mean": round(float(np.mean(w)), 1), "words_max": int(max(w))}
    out["rows"] = len(rows)
    out["bundled_rows"] = sum(s["bundled_rows"] for s in out["groups"].values())
    out["questions"] = sum(s["questions"] for s in out["groups"].values())
    out["words"] = sum(s["words_total"] for s in out["groups"].values())
    return out


def format_summary(s: dict[str, Any]) -> str:
    """The summary as a fixed-width table."""
    lines = [f"{'group':34} {'rows':>5} {'bundled':>7} {'questions':>9} {'words':>8} {'min':>6} "
             f"{'mean':>8} {'max':>6}"]
    for g, v in s["groups"].items():
        lines.append(f"{g:34} {v['rows']:5d} {v['bundled_rows']:7d} {v['questions']:9d} "
                     f"{v['words_total']:8d} {v['words_min']:6d} {v['words_mean']:8.1f} {v['words_max']:6d}")
    lines.append(f"{'total':34} {s['rows']:5d} {s['bundled_rows']:7d} {s['questions']:9d} {s['words']:8d}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.workload --copies N --seed S --out F.jsonl`: write rows, print the summary."""
    ap = argparse.ArgumentParser(prog="python -m bench.workload", description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=1, help="copies of the 240-row mix (fresh texts each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="JSONL file to write (default: summary only)")
    ap.add_argument("--gold", action="store_true", help="add gold spans to span rows")
    ap.add_argument("--split", action="store_true", help="write every question as its own row")
    ap.add_argument("--no-constructed", action="store_true", help="only the seed's 230 dev rows per copy")
    args = ap.parse_args(argv)
    rows = make_workload(args.seed, args.copies, gold=args.gold, constructed=not args.no_constructed)
    if args.split:
        rows = split_bundles(rows)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(format_summary(summary(rows)))
    if args.out:
        print(f"wrote {len(rows):,} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
