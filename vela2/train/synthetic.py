"""Synthetic labelled rows from templates: the demo model's training and held-out data.

Each text is a customer message assembled from slots (a person, a company, an e-mail address, a
phone number; a share of short messages have no contact line) and sentences that carry an intent,
a sentiment (with a 1-5 satisfaction score of its own), a topic and, in some angry messages, an
insult or a threat; the rows carry `gold` in `vela2 calibrate`'s format (character-exact spans, one
option per choice / score question, the list of options present for the set question). A seed
fixes everything, so two seeds give disjoint-enough train and held-out sets.
"""

from __future__ import annotations

import random
from typing import Any

FIRST = ("Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Liam Maria Noah Olivia Paul Quinn Rosa "
         "Samuel Tara Victor Wendy Yusuf Zoe Amir Bianca Chen Dmitri Elena Fatima Goran Hana Ivan Jorge Keiko").split()
LAST = ("Smith Jones Brown Garcia Miller Davis Wilson Taylor Clark Lewis Walker Young King Wright Lopez Hill Green "
        "Baker Adams Nelson Carter Mitchell Perez Roberts Turner Phillips Campbell Parker Evans Edwards").split()
COMPANIES = ("Acme Globex Initech Umbrella Hooli Vandelay Stark Wayne Wonka Cyberdyne Soylent Tyrell Aperture "
             "Massive Dynamic Oscorp Nakatomi Gringotts Monarch Duff").split()
DOMAINS = ["example.com", "mail.test", "corp.example.net", "inbox.example.org"]

INTENTS = {
    "refund": ["I would like a refund for my last order.", "Please send my money back for the broken item.",
               "Can you return the payment for the order I cancelled?"],
    "delivery": ["Where is my package, it has not arrived yet.", "When will my order be delivered?",
                 "The delivery is late again, please check the shipment."],
    "password": ["I cannot log in, please reset my password.", "My password does not work any more.",
                 "Help me get back into my account, the login fails."],
    "cancel": ["Please cancel my subscription from next month.", "I want to stop the plan and close the account.",
               "Cancel the membership, I no longer need it."],
}
# sentence -> the satisfaction score (1-5) it expresses
SENTIMENTS = {
    "positive": {"Thanks a lot, your team was great.": "4", "I really love the service, well done.": "5",
                 "Everything else was excellent, thank you.": "5"},
    "negative": {"This is terrible and I am very angry.": "1", "Your support is awful and slow.": "2",
                 "I am disappointed, this is the worst experience.": "1"},
    "neutral": {"I am writing about this today.": "3", "Here are the details of the case.": "3",
                "Let me know what you need from me.": "3"},
}
SCORES = ["1", "2", "3", "4", "5"]
TOXICITY = {  # only in negative messages, each with probability TOXIC_SHARE
    "insult": ["You are all useless idiots.", "What a bunch of clowns you are."],
    "threat": ["Fix it or I will come to your office and hurt you.", "I know where you live, so watch out."],
}
TOXIC_SHARE = 0.5
SHORT_SHARE = 0.3  # messages without the contact line (and half of them without the greeting)
TOPICS = {
    "finance": "My bank card was charged twice for the invoice.",
    "technology": "The app crashes on my laptop after the update.",
    "travel": "I booked a flight and a hotel for the trip.",
    "food": "The pizza and the salad arrived cold.",
}
SPAN_LABELS = ["person", "email", "phone", "company"]
QUESTIONS: dict[str, dict[str, Any]] = {  # task -> the question as rows ask it
    "span:pii": {"labels": SPAN_LABELS},
    "choice:intent": {"question": "What does the customer want?", "options": list(INTENTS)},
    "choice:sentiment": {"question": "What is the sentiment?", "options": list(SENTIMENTS)},
    "choice:topic": {"question": "What is the topic?", "options": list(TOPICS)},
    "score:satisfaction": {"question": "How satisfied is the customer?", "options": SCORES},
    "set:toxicity": {"question": "Is the message toxic?", "options": list(TOXICITY)},
}


class _Text:
    """A text built piece by piece, recording the character span of each labelled slot."""

    def __init__(self) -> None:
        self.text = ""
        self.spans: list[dict[str, Any]] = []

    def add(self, piece: str, label: str | None = None) -> None:
        if label:
            self.spans.append({"label": label, "start": len(self.text), "end": len(self.text) + len(piece)})
        self.text += piece


def _message(rng: random.Random) -> tuple[_Text, dict[str, Any]]:
    first, last, company = rng.choice(FIRST), rng.choice(LAST), rng.choice(COMPANIES)
    intent, sentiment, topic = rng.choice(list(INTENTS)), rng.choice(list(SENTIMENTS)), rng.choice(list(TOPICS))
    email = f"{first.lower()}{rng.choice(['.', '_', ''])}{last.lower()}{rng.randint(1, 99)}@{rng.choice(DOMAINS)}"
    # line numbers run 0000-9999 (the fictional 555-01xx numbers a reader types start with 0)
    phone = rng.choice([f"+1-555-{rng.randint(100, 999)}-{rng.randint(0, 9999):04d}",
                        f"({rng.randint(200, 999)}) {rng.randint(200, 999)}-{rng.randint(0, 9999):04d}",
                        f"+44 20 {rng.randint(1000, 9999)} {rng.randint(0, 9999):04d}"])
    t = _Text()
    person = f"{first} {last}" if rng.random() < 0.7 else first
    mood = rng.choice(list(SENTIMENTS[sentiment]))
    toxic = [k for k in TOXICITY if sentiment == "negative" and rng.random() < TOXIC_SHARE]
    short = rng.random() < SHORT_SHARE
    order = [0, 1, 2] if not short or rng.random() < 0.5 else [1, 2]
    rng.shuffle(order)
    for k in order:
        if k == 0:
            t.add(rng.choice(["Hello, this is ", "Hi, my name is ", "Dear team, I am "]))
            t.add(person, "person")
            t.add(rng.choice([" from ", " at ", " working for "]))
            t.add(company, "company")
            t.add(". ")
        elif k == 1:
            t.add(rng.choice(INTENTS[intent]) + " " + TOPICS[topic] + " ")
        else:
            t.add(mood + " " + "".join(rng.choice(TOXICITY[kind]) + " " for kind in toxic))
    if short:
        t.text = t.text.rstrip()
    else:
        t.add(rng.choice(["You can reach me at ", "Write to ", "Contact: "]))
        t.add(email, "email")
        t.add(rng.choice([" or call ", " or phone ", ", tel. "]))
        t.add(phone, "phone")
        t.add(rng.choice([".", " today.", ", thanks."]))
    return t, {"choice:intent": intent, "choice:sentiment": sentiment, "choice:topic": topic,
               "score:satisfaction": SENTIMENTS[sentiment][mood], "set:toxicity": toxic}


def labelled_rows(n: int, seed: int, bundled_share: float = 0.25) -> list[dict[str, Any]]:
    """`n` labelled rows: span:pii (person / email / phone / company), choice:intent,
    choice:sentiment, choice:topic, score:satisfaction and set:toxicity rows in turn, and a
    `bundled_share` of bundled rows asking all six over one text."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        t, cls = _message(rng)
        golds = {"span:pii": t.spans, **cls}
        rid = f"syn-{seed}-{i}"
        if rng.random() < bundled_share:
            rows.append({"id": rid, "task": "span:pii", "text": t.text,
                         "questions": [dict(q, task=k) for k, q in QUESTIONS.items()],
                         "gold": [golds[k] for k in QUESTIONS]})
        else:
            task = list(QUESTIONS)[i % len(QUESTIONS)]
            rows.append({"id": rid, "task": task, "text": t.text, "questions": [dict(QUESTIONS[task])],
                         "gold": golds[task]})
    return rows


def texts(n: int, seed: int) -> list[str]:
    """`n` message texts alone (the demo tokenizer's vocabulary is counted on them)."""
    rng = random.Random(seed)
    return [_message(rng)[0].text for _ in range(n)]
