"""Synthetic labelled rows: the demo model's training data and its held-out evaluation.

Each text is a customer message assembled from pieces (an introduction or a greeting, a request
carrying an intent, a subject (a bank card, an app, a trip, a meal: no question asks it, its words are
other intents'), details full of numbers that are not phone numbers, a sentence of
mood carrying a sentiment and a 1-5 satisfaction score, in angry messages an insult or a threat, a
contact line, a sign-off), each drawn from a family of phrasings (`vela2.train.synthetic_templates`),
with names, companies, e-mail addresses and phone numbers of many formats, some noise (typos,
lower case, exclamation marks, line breaks) and lengths from one sentence to a few paragraphs.
Rows carry `gold` in `vela2 calibrate`'s format (character-exact spans, one option per choice /
score question, the options present for the set question).

Two splits: "train" rows use the training families only, "held_out" rows the held-out families
only (phrasings, name / e-mail / phone formats, names, companies and domains never in a training
row), so an evaluation on held-out rows measures what the model makes of messages unlike its
training data. A seed fixes everything.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Any

from vela2.train import synthetic_templates as tpl

SPLITS = ("train", "held_out")
SCORES = ["1", "2", "3", "4", "5"]
SPAN_LABELS = ["person", "email", "phone", "company"]
QUESTIONS: dict[str, dict[str, Any]] = {  # task -> the question as rows ask it
    "span:pii": {"labels": SPAN_LABELS},
    "choice:intent": {"question": "What does the customer want?", "options": list(tpl.INTENTS)},
    "choice:sentiment": {"question": "What is the sentiment?", "options": list(tpl.SENTIMENTS)},
    "score:satisfaction": {"question": "How satisfied is the customer?", "options": SCORES},
    "set:toxicity": {"question": "Is the message toxic?", "options": list(tpl.TOXICITY)},
}
INTENTS, SENTIMENTS, TOPICS, TOXICITY = list(tpl.INTENTS), list(tpl.SENTIMENTS), list(tpl.TOPICS), list(tpl.TOXICITY)
TOXIC_SHARE = 0.5  # of negative messages, for each of insult and threat
RANT_SHARE = 0.3  # of short negative messages, made of insults and threats alone
SHORT_SHARE, LONG_SHARE = 0.3, 0.08  # one or two sentences; a few paragraphs
NOISE_SHARE = 0.05  # of pieces, for each kind of noise
LONGEST_MESSAGE_WORDS = 120  # words (vela2.text.rendering) of a message at most: what the demo was trained on
REQUEST_FIRST_SHARE = 0.7  # of messages with a request, which then comes first (as in most messages)
MOOD_LAST_SHARE = 0.6  # of messages with a mood sentence, which then comes last (ditto)
OPENER_SHARE = 0.15  # of body sentences, opened by "Honestly," "Also," ...
SOMETIMES_ASKED = ("score:satisfaction", "set:toxicity")
SOMETIMES_ASKED_SHARE = 0.5  # of training rows that ask each of those (vary_questions)
UNLABELLED = "-"  # the label of a recorded span that is no gold (a city, a product)
THREAD_JOINS = ["\n\n", "\n\n---\n\n", "\n\n> ", "\n"]  # between the messages of a thread


def families(kind: str, split: str, names: list[str]) -> list[str]:
    """The families of `kind` (a key of `tpl.HELD_OUT`'s "kind:family" names) that rows of `split` use."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    held = [n for n in names if f"{kind}:{n}" in tpl.HELD_OUT]
    return held if split == "held_out" else [n for n in names if n not in held]


@dataclass
class _Text:
    """A text built piece by piece, recording the character span of each labelled slot."""

    text: str = ""
    spans: list[dict[str, Any]] = field(default_factory=list)

    def add(self, piece: str, label: str | None = None) -> None:
        if label:
            self.spans.append({"label": label, "start": len(self.text), "end": len(self.text) + len(piece)})
        self.text += piece


# --- slot values -----------------------------------------------------------------------------------

PERSON_FORMATS = ["full", "first", "double", "three", "particle", "hyphen-first", "middle-initial", "last-initial",
                  "initial", "apostrophe", "unseen"]
EMAIL_FORMATS = ["mixed", "first-digits", "hyphen", "last-first-tag"]
PHONE_FORMATS = ["us", "paren", "uk", "dots", "de", "dash", "intl", "slash", "no", "fr", "au", "us-space"]


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.digits) for _ in range(n))


def _person(rng: random.Random, split: str, fmt: str) -> tuple[str, str, str]:
    """(the name as written, first name, last name) in format `fmt`."""
    first, last = rng.choice(tpl.FIRST_NAMES[split]), rng.choice(tpl.LAST_NAMES[split])
    if fmt == "first":
        return first, first, last
    if fmt == "double":
        return f"{first} {last}-{rng.choice(tpl.LAST_NAMES[split])}", first, last
    if fmt == "three":
        return f"{first} {rng.choice(tpl.FIRST_NAMES[split])} {last}", first, last
    if fmt == "last-initial":
        return f"{first} {last[0]}.", first, last
    if fmt == "initial":
        return f"{first[0]}. {last}", first, last
    if fmt == "particle":
        return f"{first} {rng.choice(tpl.PARTICLES)} {last}", first, last
    if fmt == "hyphen-first":
        return f"{first}-{rng.choice(tpl.FIRST_NAMES[split])} {last}", first, last
    if fmt == "middle-initial":
        return f"{first} {rng.choice(string.ascii_uppercase)}. {last}", first, last
    if fmt == "apostrophe":
        return f"{first} {rng.choice(['O', 'D'])}'{last}", first, last
    return f"{first} {last}", first, last  # full, unseen


def _company(rng: random.Random, split: str) -> str:
    return rng.choice(tpl.COMPANIES[split]) + rng.choice(tpl.COMPANY_SUFFIXES[split])


def _mail_domain(rng: random.Random, split: str, company: str) -> str:
    word = company.split()[0].lower()
    tld = rng.choice(tpl.TLDS)
    return rng.choice([rng.choice(tpl.MAIL_HOSTS[split]), rng.choice(tpl.MAIL_HOSTS[split]), f"{word}.{tld}",
                       f"mail.{word}.{tld}", f"{word}-mail.{tld}"])


# the local parts of held-out e-mail addresses: (part, separator, part, ...) structures that training's
# mixed local parts never take
HELD_OUT_LOCAL = {"first-digits": ("first", ".", "digits"), "hyphen": ("first", "-", "last"),
                  "last-first-tag": ("last", ".", "first", "+", "tag")}
_LOCAL_PARTS = ["first", "first", "last", "last", "initial", "digits", "digits", "role"]


def _local_structure(rng: random.Random) -> tuple[str, ...]:
    """A training local part's structure: one to three parts, separators between, now and then a +tag."""
    while True:
        parts: list[str] = [rng.choice(_LOCAL_PARTS)]
        for _ in range(rng.choice([0, 1, 1, 1, 2])):
            parts += [rng.choice([".", ".", "_", "-", ""]), rng.choice(_LOCAL_PARTS)]
        if rng.random() < 0.15:
            parts += ["+", "tag"]
        structure = tuple(parts)
        if structure not in HELD_OUT_LOCAL.values() and not (len(structure) == 1 and structure[0] == "digits"):
            return structure


def _email(rng: random.Random, split: str, fmt: str, first: str, last: str, company: str) -> str:
    """An address of `fmt` ("mixed": any training structure; else a held-out one) for this person."""
    structure = _local_structure(rng) if fmt == "mixed" else HELD_OUT_LOCAL[fmt]
    values = {"first": first.lower(), "last": last.lower().replace("'", ""), "initial": first[0].lower(),
              "digits": str(rng.randint(1, 999)), "tag": rng.choice(tpl.MAIL_TAGS)}
    local = "".join(values.get(p) or (rng.choice(tpl.ROLE_MAILBOXES) if p == "role" else p) for p in structure)
    return f"{local}@{_mail_domain(rng, split, company)}"


def _phone(rng: random.Random, fmt: str) -> str:
    d = _digits
    # line numbers of the US formats run 0000-9999 (the fictional 555-01xx numbers a reader types start with 0)
    return {
        "us": f"+1-555-{rng.randint(100, 999)}-{d(rng, 4)}",
        "paren": f"({rng.randint(200, 999)}) {rng.randint(200, 999)}-{d(rng, 4)}",
        "uk": f"+44 20 {rng.randint(1000, 9999)} {d(rng, 4)}",
        "dots": f"{rng.randint(200, 999)}.{rng.randint(200, 999)}.{d(rng, 4)}",
        "de": rng.choice(["+49 30 ", "+49 (0)30 ", "+49 89 "]) + d(rng, 7),
        "dash": f"{rng.randint(200, 999)}-{rng.randint(200, 999)}-{d(rng, 4)}",
        "intl": f"+{rng.choice(['31', '34', '39', '46'])} {d(rng, 2)} {d(rng, 3)} {d(rng, 2)} {d(rng, 2)}",
        "no": f"+47 {rng.randint(200, 999)} {d(rng, 4)} {d(rng, 2)}",
        "fr": f"+33 {rng.randint(1, 9)} {d(rng, 2)} {d(rng, 2)} {d(rng, 2)} {d(rng, 2)}",
        "au": f"+61 (0){rng.randint(2, 8)} {d(rng, 4)} {d(rng, 4)}",
        "slash": f"0{rng.randint(20, 99)}/{d(rng, 7)}",
        "us-space": f"+1 {rng.randint(200, 999)} {rng.randint(200, 999)} {d(rng, 4)}",
    }[fmt]


def _plain_slot(rng: random.Random, name: str, company: str) -> str:
    """A value of a placeholder that is not labelled ({item}, {ref}, ...)."""
    if name == "item":
        return rng.choice(tpl.ITEMS).replace("{ref}", _plain_slot(rng, "ref", company))
    if name in ("city", "product"):
        raise ValueError(f"{{{name}}} is drawn per split (_fill)")
    if name == "ref":
        return rng.choice([f"#{_digits(rng, 5)}", _digits(rng, 5), f"INV-{_digits(rng, 4)}",
                           f"{rng.choice(['AB', 'TK', 'CS'])}-{_digits(rng, 5)}", _digits(rng, 8)])
    if name == "amount":
        return rng.choice([f"${rng.randint(5, 499)}.{_digits(rng, 2)}", f"{rng.randint(5, 499)},90 EUR",
                           f"£{rng.randint(5, 99)}", f"{rng.randint(20, 900)} dollars"])
    if name == "when":
        return rng.choice(tpl.WHEN)
    if name == "time":
        return f"{rng.randint(7, 20)}:{rng.choice(['00', '15', '30', '45'])}"
    if name == "days":
        return str(rng.randint(2, 14))
    if name == "site":
        return company.split()[0].lower()
    raise ValueError(f"unknown placeholder {{{name}}}")


# --- messages --------------------------------------------------------------------------------------


@dataclass
class _Slots:
    """The labelled values of one message, drawn once (a name said twice is the same name)."""

    person: str
    company: str
    email: str
    phone: str
    families: dict[str, str]
    split: str


def _draw_slots(rng: random.Random, split: str) -> _Slots:
    person_fmt = rng.choice(families("person", split, PERSON_FORMATS))
    email_fmt = rng.choice(families("email", split, EMAIL_FORMATS))
    phone_fmt = rng.choice(families("phone", split, PHONE_FORMATS))
    person, first, last = _person(rng, split, person_fmt)
    company = _company(rng, split)
    return _Slots(person, company, _email(rng, split, email_fmt, first, last, company), _phone(rng, phone_fmt),
                  {"person": person_fmt, "email": email_fmt, "phone": phone_fmt}, split)


def _noisy(rng: random.Random, template: str) -> str:
    """A template with some noise of real messages: a typo, lower case, exclamation marks."""
    if rng.random() < NOISE_SHARE:
        template = template.lower()
    if rng.random() < NOISE_SHARE:
        words = template.split(" ")
        i = rng.randrange(len(words))
        w = words[i]
        if len(w) > 3 and w.isalpha():
            j = rng.randrange(len(w) - 1)
            words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2 :]
        template = " ".join(words)
    if rng.random() < NOISE_SHARE and template.endswith("."):
        template = template[:-1] + rng.choice(["!", "!!", "!!!", " :(", " :)"])
    return template


def _opened(rng: random.Random, sentence: str) -> str:
    """`sentence`, now and then after an opener ("Honestly, the ...")."""
    if rng.random() >= OPENER_SHARE or sentence.startswith(("{", "I ", "I'")):
        return sentence
    return f"{rng.choice(tpl.DISCOURSE)} {sentence[0].lower()}{sentence[1:]}"


def _fill(t: _Text, rng: random.Random, template: str, slots: _Slots) -> None:
    """Append `template` to `t` with its placeholders filled (labelled ones recorded as spans)."""
    for literal, name, _, _ in string.Formatter().parse(_noisy(rng, template)):
        if literal.startswith(".") and t.text.endswith("."):  # "... Inc." at the end of a sentence
            literal = literal[1:]
        t.add(literal)
        if name is None:
            continue
        if name in SPAN_LABELS:
            t.add(getattr(slots, name), name)
        elif name in ("city", "product"):  # no label, but cut from the tokenizer's counts as names are
            t.add(rng.choice((tpl.CITIES if name == "city" else tpl.PRODUCTS)[slots.split]), UNLABELLED)
        else:
            t.add(_plain_slot(rng, name, slots.company))


def _pick(rng: random.Random, kind: str, split: str, by_family: dict[str, Any], fams: dict[str, str]) -> Any:
    """A random member of a random family of `by_family` allowed in `split` (the family noted in `fams`)."""
    fam = rng.choice(families(kind, split, list(by_family)))
    fams[kind] = fam
    return rng.choice(list(by_family[fam]))


@dataclass
class _Message:
    text: _Text
    golds: dict[str, Any]  # task -> gold (a task the message has no answer to is left out)
    families: dict[str, str]  # slot kind -> the family it was drawn from


def _pieces(rng: random.Random, split: str, slots: _Slots, short_only: bool) -> tuple[list[str], dict[str, Any]]:
    """The sentences (templates) of one message, in order, and the golds of its choice questions."""
    fams = slots.families
    intent, sentiment = rng.choice(INTENTS), rng.choice(SENTIMENTS)
    length = rng.random()
    short, long_ = short_only or length < SHORT_SHARE, not short_only and length > 1 - LONG_SHARE
    if short and sentiment == "negative" and rng.random() < RANT_SHARE:
        return _rant(rng, split, fams)
    body: list[str] = []
    golds: dict[str, Any] = {}
    if not short or rng.random() < 0.85:
        body.append(_pick(rng, "intent", split, tpl.INTENTS[intent], fams))
        golds["choice:intent"] = intent
    if rng.random() < (0.2 if short else 0.5):  # what the case is about: words of other intents, no question
        body.append(_pick(rng, "topic", split, tpl.TOPICS[rng.choice(TOPICS)], fams))
    for _ in range(rng.randint(1, 3) if long_ else int(not short and rng.random() < 0.4)):
        body.append(_pick(rng, "detail", split, tpl.DETAILS, fams))
    toxic = [k for k in TOXICITY if sentiment == "negative" and rng.random() < TOXIC_SHARE]
    score, last = "3", list[str]()
    if not short or not body or rng.random() < 0.6:
        mood = _pick(rng, "sentiment", split, tpl.SENTIMENTS[sentiment], fams)
        score = tpl.SENTIMENTS[sentiment][fams["sentiment"]][mood]
        (last if rng.random() < MOOD_LAST_SHARE else body).append(mood)
    elif toxic:
        score = "1"
    elif sentiment != "neutral":
        sentiment = "neutral"
    body.extend(_pick(rng, "toxicity", split, tpl.TOXICITY[kind], fams) for kind in toxic)
    first = body[:1] if "choice:intent" in golds and rng.random() < REQUEST_FIRST_SHARE else []
    body = body[len(first):]
    rng.shuffle(body)
    body = [_opened(rng, b) for b in first + body + last]
    golds.update({"choice:sentiment": sentiment, "score:satisfaction": score, "set:toxicity": toxic})
    head = [_pick(rng, "intro", split, tpl.INTROS, fams)] if not short and rng.random() < 0.75 else []
    if not short and not head:
        head = [rng.choice(tpl.GREETINGS)]
    tail = [_contact(rng, split, fams)] if rng.random() < (0.35 if short else 0.8) else []
    if long_ or (not short and rng.random() < 0.3):
        tail.append(_pick(rng, "signoff", split, tpl.SIGNOFFS, fams))
    return head + body + tail, golds


def _rant(rng: random.Random, split: str, fams: dict[str, str]) -> tuple[list[str], dict[str, Any]]:
    """A message of insults and threats alone (and now and then a sentence of mood): no request in it."""
    toxic = [k for k in TOXICITY if rng.random() < 0.5] or [rng.choice(TOXICITY)]
    pieces = [_pick(rng, "toxicity", split, tpl.TOXICITY[kind], fams) for kind in toxic]
    score = "1"
    if rng.random() < 0.3:
        mood = _pick(rng, "sentiment", split, tpl.SENTIMENTS["negative"], fams)
        score = tpl.SENTIMENTS["negative"][fams["sentiment"]][mood]
        pieces.insert(rng.randint(0, len(pieces)), mood)
    return pieces, {"choice:sentiment": "negative", "score:satisfaction": score, "set:toxicity": toxic}


def _contact(rng: random.Random, split: str, fams: dict[str, str]) -> str:
    """A contact line: an e-mail lead, a phone lead or both."""
    which = rng.random()
    parts = []
    if which < 0.75:
        parts.append(_pick(rng, "email_lead", split, tpl.EMAIL_LEADS, fams))
    if which > 0.45:
        parts.append(_pick(rng, "phone_lead", split, tpl.PHONE_LEADS, fams))
    return rng.choice(tpl.CONTACT_JOINS).join(parts) + rng.choice(tpl.CONTACT_ENDS)


def _message(rng: random.Random, split: str, short_only: bool = False) -> _Message:
    slots = _draw_slots(rng, split)
    pieces, golds = _pieces(rng, split, slots, short_only)
    t = _Text()
    for i, piece in enumerate(pieces):
        if i:
            t.add(rng.choice([" ", " ", " ", " ", "\n", "\n\n", "  "]))
        _fill(t, rng, piece, slots)
    fams = {k: v for k, v in slots.families.items() if any(s["label"] == k for s in t.spans)}
    fams.update({k: v for k, v in slots.families.items() if k not in SPAN_LABELS})
    return _Message(t, {"span:pii": [s for s in t.spans if s["label"] != UNLABELLED], **golds}, fams)


# --- rows ------------------------------------------------------------------------------------------


def _question(rng: random.Random, task: str, gold: Any, vary: bool) -> tuple[dict[str, Any], Any]:
    """The question of `task` as rows ask it, and its gold; `vary`: now and then another question text
    (the kind's default, as SystemOne's classify / extract ask), other option orders and subsets."""
    q = dict(QUESTIONS[task])
    if not vary:
        return q, gold
    kind = task.split(":")[0]
    r = rng.random()
    if r < 0.1:
        q.pop("question", None)  # the kind's default question text
    elif r < 0.15 and kind in ("choice", "span"):
        q["question"] = {"choice": "Which of these labels describe the text?",
                         "span": "Extract all entities of these types from the text."}[kind]
    if kind == "span" and rng.random() < 0.1:
        labels = rng.sample(SPAN_LABELS, rng.randint(1, len(SPAN_LABELS) - 1))
        return dict(q, labels=labels), [s for s in gold if s["label"] in labels]
    if kind in ("choice", "set") and rng.random() < 0.2:
        options = list(q["options"])
        rng.shuffle(options)
        if kind == "choice" and rng.random() < 0.5:
            options = [o for o in options if o == gold or rng.random() < 0.6] or [gold]
            if len(options) < 2:
                options.append(next(o for o in q["options"] if o != gold))
        q["options"] = options
    return q, gold


def _row(rng: random.Random, rid: str, msg: _Message, bundled: bool, i: int, vary: bool) -> dict[str, Any]:
    tasks = [k for k in QUESTIONS if k in msg.golds]
    if vary:  # the questions beyond the demo's goals now and then left out: shorter rows, more of them
        tasks = [k for k in tasks if k not in SOMETIMES_ASKED or rng.random() < SOMETIMES_ASKED_SHARE]
    if bundled:
        asked = [_question(rng, k, msg.golds[k], vary) for k in tasks]
        return {"id": rid, "task": tasks[0], "text": msg.text.text,
                "questions": [dict(q, task=k) for k, (q, _) in zip(tasks, asked, strict=True)],
                "gold": [g for _, g in asked]}
    task = list(QUESTIONS)[i % len(QUESTIONS)]
    if task not in msg.golds:
        task = "span:pii"
    q, gold = _question(rng, task, msg.golds[task], vary)
    return {"id": rid, "task": task, "text": msg.text.text, "questions": [q], "gold": gold}


def labelled_rows(n: int, seed: int, bundled_share: float = 0.25, *, split: str = "train",
                  vary_questions: bool = False, short_only: bool = False,
                  thread_share: float = 0.0) -> list[dict[str, Any]]:
    """`n` labelled rows of `split`: span:pii (person / email / phone / company), choice:intent,
    choice:sentiment, score:satisfaction and set:toxicity rows in turn, and a
    `bundled_share` of bundled rows asking every question the message answers over one text.
    `vary_questions`: some questions in other words (the kind's default text), with their options
    in another order or a subset of them (what the demo trains on, so that a SystemOne request
    asking in its own words is answered too). `short_only`: messages of one or two sentences only.
    `thread_share`: rows asking the span question alone over two or three messages one after the other
    (a thread: names, addresses and numbers in a longer text, at a small cost in question tokens)."""
    return [row for row, _ in labelled_rows_with_families(n, seed, bundled_share, split=split,
                                                          vary_questions=vary_questions, short_only=short_only,
                                                          thread_share=thread_share)]


def labelled_rows_with_families(n: int, seed: int, bundled_share: float = 0.25, *, split: str = "train",
                                vary_questions: bool = False, short_only: bool = False,
                                thread_share: float = 0.0) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """`labelled_rows`, each row with the families its text was drawn from ({"person": "initial",
    "intent": "reimburse", ...}: what a per-family evaluation groups by)."""
    rng = random.Random(f"{split}-{seed}")
    out: list[tuple[dict[str, Any], dict[str, str]]] = []
    for i in range(n):
        if rng.random() < thread_share:
            out.append((_thread_row(rng, f"syn-{split}-{seed}-{i}", split, vary_questions), {}))
            continue
        msg = _message(rng, split, short_only)
        row = _row(rng, f"syn-{split}-{seed}-{i}", msg, rng.random() < bundled_share, i, vary_questions)
        out.append((row, msg.families))
    return out


def _thread_row(rng: random.Random, rid: str, split: str, vary: bool) -> dict[str, Any]:
    """A span-only row over two or three messages joined as a thread (or as the fields of a JSON input)."""
    t = _Text()
    headed = rng.random() < 0.3  # as a SystemOne request's JSON input is rendered: "<field>:" lines
    for k in range(rng.randint(2, 3)):
        if k:
            t.add("\n\n" if headed else rng.choice(THREAD_JOINS))
        if headed:
            t.add(rng.choice(["user", "customer", "message", "text", "assistant", "reply"]) + ":\n")
        msg = _message(rng, split)
        t.spans += [dict(s, start=s["start"] + len(t.text), end=s["end"] + len(t.text)) for s in msg.golds["span:pii"]]
        t.add(msg.text.text)
    q, gold = _question(rng, "span:pii", t.spans, vary)
    return {"id": rid, "task": "span:pii", "text": t.text, "questions": [q], "gold": gold}


def texts(n: int, seed: int, *, without_spans: bool = False) -> list[str]:
    """`n` training message texts alone; `without_spans`: with their names, companies, e-mail addresses
    and phone numbers cut out (the demo tokenizer's vocabulary is counted on those: a name is
    then split into pieces as an unseen one is, and the model learns names from their context and
    form, not by heart)."""
    rng = random.Random(f"texts-{seed}")
    out = []
    for _ in range(n):
        t = _message(rng, "train").text
        if without_spans:
            cut = t.text
            for s in sorted(t.spans, key=lambda s: -s["start"]):
                cut = cut[: s["start"]] + " " + cut[s["end"] :]
            out.append(cut)
        else:
            out.append(t.text)
    return out
