"""Synthetic labelled rows from templates: the demo model's training and held-out data.

Each text is a customer message assembled from slots (a person, a company, an e-mail address, a
phone number) and sentences that carry an intent, a sentiment and a topic; the rows carry `gold`
in `vela2 calibrate`'s format (character-exact spans, one option per choice question). A seed
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
SENTIMENTS = {
    "positive": ["Thanks a lot, your team was great.", "I really love the service, well done.",
                 "Everything else was excellent, thank you."],
    "negative": ["This is terrible and I am very angry.", "Your support is awful and slow.",
                 "I am disappointed, this is the worst experience."],
    "neutral": ["I am writing about this today.", "Here are the details of the case.",
                "Let me know what you need from me."],
}
TOPICS = {
    "finance": "My bank card was charged twice for the invoice.",
    "technology": "The app crashes on my laptop after the update.",
    "travel": "I booked a flight and a hotel for the trip.",
    "food": "The pizza and the salad arrived cold.",
}
SPAN_LABELS = ["person", "email", "phone", "company"]


class _Text:
    """A text built piece by piece, recording the character span of each labelled slot."""

    def __init__(self) -> None:
        self.text = ""
        self.spans: list[dict[str, Any]] = []

    def add(self, piece: str, label: str | None = None) -> None:
        if label:
            self.spans.append({"label": label, "start": len(self.text), "end": len(self.text) + len(piece)})
        self.text += piece


def _message(rng: random.Random) -> tuple[_Text, dict[str, str]]:
    first, last, company = rng.choice(FIRST), rng.choice(LAST), rng.choice(COMPANIES)
    intent, sentiment, topic = rng.choice(list(INTENTS)), rng.choice(list(SENTIMENTS)), rng.choice(list(TOPICS))
    email = f"{first.lower()}{rng.choice(['.', '_', ''])}{last.lower()}{rng.randint(1, 99)}@{rng.choice(DOMAINS)}"
    phone = rng.choice([f"+1-555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
                        f"({rng.randint(200, 999)}) {rng.randint(200, 999)}-{rng.randint(1000, 9999)}",
                        f"+44 20 {rng.randint(1000, 9999)} {rng.randint(1000, 9999)}"])
    t = _Text()
    person = f"{first} {last}" if rng.random() < 0.7 else first
    order = [0, 1, 2]
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
            t.add(rng.choice(SENTIMENTS[sentiment]) + " ")
    t.add(rng.choice(["You can reach me at ", "Write to ", "Contact: "]))
    t.add(email, "email")
    t.add(rng.choice([" or call ", " or phone ", ", tel. "]))
    t.add(phone, "phone")
    t.add(rng.choice([".", " today.", ", thanks."]))
    return t, {"intent": intent, "sentiment": sentiment, "topic": topic}


def labelled_rows(n: int, seed: int, bundled_share: float = 0.25) -> list[dict[str, Any]]:
    """`n` labelled rows: span:pii (person / email / phone / company), choice:intent,
    choice:sentiment and choice:topic rows in turn, and a `bundled_share` of bundled rows asking all
    four over one text."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        t, cls = _message(rng)
        questions: dict[str, tuple[dict[str, Any], Any]] = {
            "span:pii": ({"labels": SPAN_LABELS}, t.spans),
            "choice:intent": ({"question": "What does the customer want?", "options": list(INTENTS)}, cls["intent"]),
            "choice:sentiment": ({"question": "What is the sentiment?", "options": list(SENTIMENTS)},
                                 cls["sentiment"]),
            "choice:topic": ({"question": "What is the topic?", "options": list(TOPICS)}, cls["topic"]),
        }
        rid = f"syn-{seed}-{i}"
        if rng.random() < bundled_share:
            tasks = list(questions)
            rows.append({"id": rid, "task": tasks[0], "text": t.text,
                         "questions": [dict(questions[k][0], task=k) for k in tasks],
                         "gold": [questions[k][1] for k in tasks]})
        else:
            task = list(questions)[i % len(questions)]
            q, gold = questions[task]
            rows.append({"id": rid, "task": task, "text": t.text, "questions": [q], "gold": gold})
    return rows
