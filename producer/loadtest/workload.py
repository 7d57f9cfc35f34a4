"""What a load run sends: requests from a JSONL file (rows or SystemOne requests, cycled), or a
built-in workload of short customer messages; each request gets a fresh id of the run's."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vela2.wire.messages import decode_json

BUILTIN = ("rows", "systemone")  # the built-in workloads
_NAMES = ("Alice Moreau", "Bram de Vries", "Chen Wei", "Dana Kowalski", "Emeka Obi", "Fatima Zahra")
_COMPANIES = ("Acme", "Globex", "Initech", "Umbrella", "Hooli", "Vandelay")
_OPENINGS = ("Hello, this is {name} from {company}.", "Hi team,", "Dear support,", "Good morning,")
_ASKS = ("my order {n} arrived damaged and I would like a refund", "the invoice {n} charges me twice",
         "I cannot log in since yesterday and the reset link does not arrive",
         "please move my delivery {n} to next Tuesday", "thanks, the replacement works perfectly now",
         "your app keeps crashing when I open the settings page")
_CLOSINGS = ("Thanks in advance.", "Best regards, {name}", "Please call me back.", "", "Kind regards.")
_CONTEXT = ("It has been {days} days and nobody at {company} answered my e-mail.",
            "I have been a customer of {company} for {days} years and this never happened before.",
            "My colleague {name} had the same problem last week with order {n}.",
            "I tried the help page twice, restarted everything and waited {days} hours.")
INTENTS = ["refund", "billing", "technical", "delivery", "praise", "other"]


def message(rng: random.Random) -> str:
    """A short customer message (about 20-60 words)."""
    name, company, n = rng.choice(_NAMES), rng.choice(_COMPANIES), rng.randrange(1000, 99999)
    context = rng.sample(_CONTEXT, rng.randint(1, 3))
    parts = [rng.choice(_OPENINGS), rng.choice(_ASKS).capitalize() + ".", *context, rng.choice(_CLOSINGS)]
    return " ".join(p for p in parts if p).format(name=name, company=company, n=n, days=rng.randrange(2, 14))


def builtin_request(kind: str, rng: random.Random, model: str) -> dict[str, Any]:
    """One request of a built-in workload: "rows" (one choice question), "systemone" (an intent and
    the persons and companies of the message)."""
    text = message(rng)
    if kind == "rows":
        return {"task": "choice:intent", "text": text,
                "questions": [{"question": "What does the customer want?", "options": INTENTS}]}
    if kind == "systemone":
        return {"model": model, "input": text,
                "tasks": [{"name": "intent", "kind": "choice", "question": "What does the customer want?",
                           "options": INTENTS},
                          {"name": "pii", "kind": "span", "labels": ["person", "company"]}]}
    raise ValueError(f"workload must be one of {', '.join(BUILTIN)}; got {kind!r}")


def read_requests(path: str | Path) -> list[dict[str, Any]]:
    """The requests of a JSONL file (one row or SystemOne request per line; blank lines skipped);
    ValueError naming the line when one is not a JSON object."""
    out = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            obj = decode_json(raw, f"{path}:{n}")  # InvalidRequest (a ValueError) naming the line
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{n}: a request is a JSON object; got {json.dumps(obj)[:80]}")
            out.append(obj)
    if not out:
        raise ValueError(f"{path}: no request in it")
    return out


def requests(workload: str, model: str, prefix: str, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Endless requests of `workload` (a built-in name, or a JSONL file cycled), each under a fresh id
    `<prefix><n>`."""
    rng = random.Random(seed)
    if workload not in BUILTIN and not Path(workload).is_file():
        raise ValueError(f"workload must be one of {', '.join(BUILTIN)} or a JSONL file; got {workload!r} "
                         "(no such file)")
    given = read_requests(workload) if workload not in BUILTIN else None
    n = 0
    while True:
        req = dict(given[n % len(given)]) if given else builtin_request(workload, rng, model)
        req["id"] = f"{prefix}{n}"
        n += 1
        yield req
