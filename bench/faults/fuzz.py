"""Fuzz the request schemas and the renderer with hypothesis: every input must either be accepted or
be refused with a Vela2Error (InvalidRequest, LimitExceeded, ...); anything else is a crash.

Targets (each gets `examples` generated inputs):

- `decode_body`: vela2.wire.messages.decode_body on arbitrary bytes and JSON-ish bodies;
- `parse_row`: vela2.api.schemas.parse_row on row-shaped objects with wrong types, junk values and
  hostile text (empty, whitespace only, zero-width, combining marks, RTL, CJK, emoji, NULs);
- `system_one`: vela2.api.systemone parse_request -> check_model -> to_row -> pipeline.prepare;
- `render`: vela2.scoring.pipeline.prepare (parse + render_row) on the demo model, checking that every
  accepted row renders at least one sequence, within the model's window for one-question rows.

    .venv/bin/python -m bench.faults.fuzz --examples 500 [--checkpoint DIR] [--out /tmp/fuzz.json]

`run_fuzz()` is what the fault suite (bench.faults.runner) calls; the report lists inputs tried,
accepted, refused and crashes (the exception and a truncated repr of the input) per target.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

log = logging.getLogger(__name__)

MAX_CRASH_EXAMPLES = 10  # crash records kept per target
REPR_CHARS = 400

EDGE_TEXTS = [
    "",
    " ",
    "\n\t\r\n",
    "\u200b\u200b",
    "\x00",
    "a" * 5000,  # one enormous word
    "e\u0301" * 50,  # combining marks
    "\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627",  # RTL
    "\u6771\u4eac\u90fd\u6e0b\u8c37\u533a" * 40,  # CJK, no spaces
    "\U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f44d\U0001f3fd",  # ZWJ emoji, skin tone
    "Alice <alice@example.com> called +1 (555) 010-9999 about order #4471.",
    "-_-_-_ ___ --- ... !!! ???",
    "[OPT] [ABS] [LBL] [PAD] [Q] [SEP] [BOS] [UNK]",  # the special tokens as plain text
    "word " * 3000,
]
TASKS = ["choice:boolq", "score:helpsteer2", "set:shield", "span:pii_dev", "span:*", "choice:", ":x", "x", "span:a:b"]
KINDS = ["choice", "score", "set", "span", "classify", "extract", "regress", ""]


def _text() -> st.SearchStrategy[str]:
    chars = st.characters(blacklist_categories=("Cs",))  # no lone surrogates: not valid JSON text
    return st.one_of(st.text(chars, max_size=300), st.sampled_from(EDGE_TEXTS), st.text("ab -.\n", max_size=40))


def _junk() -> st.SearchStrategy[Any]:
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20))
    return st.recursive(
        leaves, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=8
    )


def _maybe(s: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the well-typed value, sometimes junk of any type."""
    return st.one_of(s, s, s, _junk())


def _items() -> st.SearchStrategy[Any]:
    item = st.one_of(st.sampled_from(["yes", "no", "0", "1", "2", "person", "email", ""]), _text())
    return _maybe(st.lists(item, max_size=8) | st.lists(item, min_size=60, max_size=80))


def _unique(item: st.SearchStrategy[str], lo: int, hi: int) -> st.SearchStrategy[list[str]]:
    return st.lists(item, min_size=lo, max_size=hi, unique=True)


_WORD = st.text("abcdefghijklmnopqrstuvwxyz0123456789 -", min_size=1, max_size=12).filter(lambda x: x.strip() != "")


@st.composite
def valid_rows(draw: st.DrawFn) -> dict[str, Any]:
    """Rows a client could well send: the right shape per type, hostile texts, bundles of types."""

    def question(kind: str) -> dict[str, Any]:
        q: dict[str, Any] = {}
        if kind == "span":
            q["labels"] = draw(_unique(st.sampled_from(["person", "email", "company"]) | _WORD, 1, 4))
        else:
            q["options"] = draw(
                _unique(st.sampled_from(["yes", "no", "0", "1", "2", "3"]) | _WORD, 1 if kind == "set" else 2, 6)
            )
            if draw(st.booleans()):
                q["question"] = draw(_text().filter(lambda x: x.strip() != ""))
        return q

    kind = draw(st.sampled_from(["choice", "score", "set", "span"]))
    task = f"{kind}:{draw(st.sampled_from(['boolq', 'helpsteer2', 'shield', 'pii_dev', 'x']))}"
    questions = [question(kind)]
    for _ in range(draw(st.integers(0, 3))):  # bundled extra questions, each with its own type
        k = draw(st.sampled_from(["choice", "score", "set", "span"]))
        questions.append({**question(k), "task": f"{k}:{draw(st.sampled_from(['a', 'b', 'pii_dev']))}"})
    row: dict[str, Any] = {"task": task, "text": draw(_text()), "questions": questions}
    if draw(st.booleans()):
        row["id"] = draw(st.text(min_size=1, max_size=40))
    if draw(st.booleans()):
        row["units"] = True
    return row


def row_objects() -> st.SearchStrategy[Any]:
    """Row-shaped objects: mostly well formed, then wrong types, junk and hostile texts mixed in."""
    question = st.fixed_dictionaries(
        {},
        optional={
            "question": _maybe(_text()),
            "options": _items(),
            "labels": _items(),
            "task": _maybe(st.sampled_from(TASKS) | st.text(max_size=20)),
            "extra": _junk(),
        },
    )
    row = st.fixed_dictionaries(
        {
            "task": _maybe(st.sampled_from(TASKS) | st.text(max_size=20)),
            "text": _maybe(_text()),
            "questions": _maybe(st.lists(question, max_size=5)),
        },
        optional={
            "id": _maybe(st.text(min_size=1, max_size=300)),
            "units": _maybe(st.booleans()),
            "logits": _maybe(st.booleans()),
            "unknown": _junk(),
        },
    )
    return st.one_of(valid_rows(), valid_rows(), valid_rows(), row, _junk())


@st.composite
def valid_system_one(draw: st.DrawFn, model_name: str) -> dict[str, Any]:
    """SystemOne requests of every kind over free text or JSON fields."""
    fields = draw(st.one_of(st.none(), _unique(st.sampled_from(["user", "assistant", "context"]), 1, 3)))
    inp: Any = draw(_text().filter(lambda x: x.strip() != "")) if fields is None else {f: draw(_text()) for f in fields}
    tasks = []
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(KINDS[:6]))
        t: dict[str, Any] = {"name": f"t{i}", "kind": kind}
        if kind in ("choice", "score", "set"):
            t["options"] = draw(_unique(_WORD, 1 if kind == "set" else 2, 5))
        else:
            t["labels"] = draw(_unique(_WORD, 2, 5))
        if kind in ("span", "extract") and fields is not None and draw(st.booleans()):
            t["fields"] = fields[:1]
        tasks.append(t)
    return {"model": model_name, "input": inp, "tasks": tasks}


def system_one_objects(model_name: str) -> st.SearchStrategy[Any]:
    """SystemOne-shaped objects (model / input / tasks): mostly valid, then wrong in every way."""
    task = st.fixed_dictionaries(
        {"name": _maybe(st.text(min_size=0, max_size=20)), "kind": _maybe(st.sampled_from(KINDS))},
        optional={
            "question": _maybe(_text()),
            "options": _items(),
            "labels": _items(),
            "fields": _maybe(st.lists(st.sampled_from(["user", "assistant", "context", "x"]), max_size=3)),
            "multi_label": _maybe(st.booleans()),
        },
    )
    fields = st.dictionaries(
        st.sampled_from(["user", "assistant", "context", "", "a\nb"]) | st.text(max_size=8), _text(), max_size=4
    )
    req = st.fixed_dictionaries(
        {
            "model": _maybe(st.sampled_from([model_name, "other-model", ""])),
            "input": _maybe(_text() | fields),
            "tasks": _maybe(st.lists(task, max_size=4)),
        },
        optional={
            "id": _maybe(st.text(min_size=1, max_size=20)),
            "version": _maybe(st.just("1")),
            "units": _maybe(st.booleans()),
        },
    )
    good = valid_system_one(model_name)
    return st.one_of(good, good, good, req)


def message_bodies() -> st.SearchStrategy[bytes]:
    """Raw message bodies: random bytes, and JSON [args, kwargs, embed] variants."""
    envelope = st.tuples(_junk(), _junk(), _junk()).map(lambda t: json.dumps(list(t)).encode())
    near = st.tuples(
        st.lists(_junk(), max_size=2), st.dictionaries(st.sampled_from(["chunk", "x"]), _junk(), max_size=2)
    ).map(lambda t: json.dumps([t[0], t[1], {}]).encode())
    return st.one_of(st.binary(max_size=200), envelope, near)


class Tally:
    """Counts of one target: tried, accepted, refused (Vela2Error), crashes (anything else)."""

    def __init__(self, name: str):
        self.name = name
        self.tried = 0
        self.accepted = 0
        self.refused = 0
        self.crashes = 0
        self.examples: list[dict[str, Any]] = []
        self.seconds = 0.0

    def run(self, fn: Callable[[Any], None], obj: Any) -> None:
        from vela2.errors import Vela2Error

        self.tried += 1
        try:
            fn(obj)
        except Vela2Error:
            self.refused += 1
        except Exception as e:
            self.crashes += 1
            if len(self.examples) < MAX_CRASH_EXAMPLES:
                text = repr(obj)
                self.examples.append(
                    {
                        "exception": f"{type(e).__name__}: {str(e)[:300]}",
                        "input": text if len(text) <= REPR_CHARS else text[: REPR_CHARS - 3] + "...",
                        "where": traceback.format_exc(limit=-2).strip().splitlines()[-3:],
                    }
                )
        else:
            self.accepted += 1

    def report(self) -> dict[str, Any]:
        return {
            "tried": self.tried,
            "accepted": self.accepted,
            "refused": self.refused,
            "crashes": self.crashes,
            "crash_examples": self.examples,
            "seconds": round(self.seconds, 2),
        }


def _drive(tally: Tally, strategy: st.SearchStrategy[Any], fn: Callable[[Any], None], examples: int, seed_: int):
    """Feed `examples` generated inputs to `fn` through `tally` (generation only: no shrinking, no
    database, so a run is bounded and reproducible from the seed)."""

    @seed(seed_)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def inner(obj: Any) -> None:
        tally.run(fn, obj)

    t0 = time.perf_counter()
    inner()
    tally.seconds = time.perf_counter() - t0


def run_fuzz(model: Any, examples: int = 500, seed_: int = 0) -> dict[str, Any]:
    """Fuzz every target with `examples` inputs on `model` (the demo model); returns the report."""
    from vela2.api import systemone
    from vela2.api.schemas import parse_row
    from vela2.scoring import pipeline
    from vela2.wire.messages import decode_body

    window = int(model.config.max_window_tokens)

    def render(obj: Any) -> None:
        prep = pipeline.prepare(model, obj)
        if not prep.sequences:
            raise AssertionError("an accepted row rendered no sequence")
        longest = max(s.num_tokens for s in prep.sequences)
        # a window holds the context and every block, but only context + one block must fit
        if len(prep.row.questions) == 1 and longest > window:
            raise AssertionError(f"a one-question sequence has {longest} tokens; window {window}")

    def system_one(obj: Any) -> None:
        parsed = systemone.parse_request(obj)
        systemone.check_model(parsed, model.name)
        render(systemone.to_row(parsed, model.calibration))

    targets: list[tuple[str, st.SearchStrategy[Any], Callable[[Any], None]]] = [
        ("decode_body", message_bodies(), decode_body),
        ("parse_row", row_objects(), parse_row),
        ("system_one", system_one_objects(model.name), system_one),
        ("render", row_objects(), render),
    ]
    report: dict[str, Any] = {"examples_per_target": examples, "seed": seed_, "targets": {}}
    for i, (name, strategy, fn) in enumerate(targets):
        tally = Tally(name)
        _drive(tally, strategy, fn, examples, seed_ + i)
        report["targets"][name] = tally.report()
        log.info(
            "fuzz %s: %d tried, %d accepted, %d refused, %d crashes in %.1f s",
            name,
            tally.tried,
            tally.accepted,
            tally.refused,
            tally.crashes,
            tally.seconds,
        )
    report["inputs_tried"] = sum(t["tried"] for t in report["targets"].values())
    report["crashes"] = sum(t["crashes"] for t in report["targets"].values())
    return report


def main(argv: list[str] | None = None) -> int:
    """CLI: fuzz, print a summary, write JSON; exit 1 when anything crashed."""
    import torch

    import vela2

    p = argparse.ArgumentParser(prog="python -m bench.faults.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=500, help="generated inputs per target")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", help="checkpoint directory (default: a fresh demo checkpoint)")
    p.add_argument("--out", help="write the JSON report here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="vela2-fuzz-") as tmp:
        ckpt = args.checkpoint or vela2.init_demo(Path(tmp) / "demo")
        model = vela2.load(ckpt, dtype=torch.float32)
        report = run_fuzz(model, args.examples, args.seed)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    for name, t in report["targets"].items():
        print(
            f"{name:12s} tried {t['tried']:6d}  accepted {t['accepted']:6d}  refused {t['refused']:6d}  "
            f"crashes {t['crashes']:4d}"
        )
        for ex in t["crash_examples"][:3]:
            print(f"    {ex['exception']}\n      input {ex['input'][:160]}")
    return 1 if report["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
