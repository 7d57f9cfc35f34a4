"""The docs' example answers, regenerated from the demo model (developer tooling: the docs site, not
the product).

Every answer a page shows is the demo model's real answer to the request a page shows: the block
after `<!-- example: ANSWER -->` answers the block after `<!-- example: REQUEST -->` (`PAIRS`), as
`vela2 demo --answer` computes it (`stack.demo.answer`: fp32, as a CPU worker), numbers rounded to
two decimals. The shown `timings` (which vary from run to run) are kept as the page has them.

    python -m stack.doc_answers --checkpoint .cache/vela2-demo --write   # rewrite the answer blocks
    python -m stack.doc_answers --checkpoint .cache/vela2-demo           # exit 1 naming each difference

tests/unit/test_docs.py runs the check on the tests' demo checkpoint: a page whose answer is not the
model's (another decision, another span, a probability off by more than its rounding) fails it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from stack.doc_blocks import ROOT, Block, marked

PAIRS = {"systemone-answer": "systemone-request", "row-result": "row"}  # answer kind -> request kind
DECIMALS = 2
# a shown number may differ from the model's by its rounding (0.005) and a little more: a model
# trained on another CPU moves in the third decimal; a decision or a span must be the same
TOLERANCE = 0.011
WIDTH = 110  # characters of a line of a shown answer
UNCOMPARED = {"timings", "digest"}  # vary from run to run / from build to build


def find_block(root: Path, kind: str) -> Block:
    """The one block marked `example: kind` (ValueError when there is none or more than one)."""
    found = marked(kind, root)
    if len(found) != 1:
        raise ValueError(f"expected one block marked example: {kind}; found {len(found)}")
    return found[0]


def block_text(root: Path, kind: str) -> str:
    """The code of the block marked `example: kind`, as the page has it."""
    b = find_block(root, kind)
    return "\n".join(b.path.read_text(encoding="utf-8").split("\n")[b.line:b.end])


def rounded(value: Any) -> Any:
    """`value` with every float rounded to DECIMALS."""
    if isinstance(value, float):
        return round(value, DECIMALS)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def layout(value: Any, column: int = 0) -> str:
    """JSON of `value` as the pages show it: on one line when it fits in WIDTH from `column`, else its
    items filled into lines (as many as fit), an item that itself needs lines starting a line of its
    own, every line aligned under the first item."""
    flat = json.dumps(value, ensure_ascii=False)
    if column + len(flat) <= WIDTH or not isinstance(value, dict | list) or not value:
        return flat
    inner = column + 1  # where every line of the items starts
    if isinstance(value, dict):
        items = [(head := json.dumps(key, ensure_ascii=False) + ": ") + layout(item, inner + len(head))
                 for key, item in value.items()]
    else:
        items = [layout(item, inner) for item in value]
    lines = [items[0]]
    for item in items[1:]:
        last = lines[-1].rsplit("\n", 1)[-1]
        fits = "\n" not in item and "\n" not in lines[-1] and inner + len(last) + 2 + len(item) <= WIDTH
        if fits:
            lines[-1] += ", " + item
        else:
            lines.append(item)
    opening, closing = "{}" if isinstance(value, dict) else "[]"
    return opening + (",\n" + " " * inner).join(lines) + closing


def shown_answer(real: dict[str, Any], shown: dict[str, Any] | None) -> dict[str, Any]:
    """The answer a page shows for the model's answer `real`: rounded, with the `timings` the page
    shows (`shown`), in the worker's key order (timings before served_by)."""
    out = {k: v for k, v in rounded(real).items() if k != "served_by"}
    if shown and "timings" in shown:
        out["timings"] = shown["timings"]
    if "served_by" in real:
        out["served_by"] = real["served_by"]
    return out


def differences(shown: Any, real: Any, where: str = "answer") -> list[str]:
    """Where the shown answer is not the model's: keys, decisions, spans, texts; numbers beyond TOLERANCE
    (the keys in UNCOMPARED are not compared)."""
    if isinstance(shown, dict) and isinstance(real, dict):
        keys, real_keys = set(shown) - UNCOMPARED, set(real) - UNCOMPARED
        out = [f"{where}: keys {sorted(keys)} shown, the model's {sorted(real_keys)}"] if keys != real_keys else []
        for key in shown.keys() & real.keys() - UNCOMPARED:
            out += differences(shown[key], real[key], f"{where}.{key}")
        return out
    if isinstance(shown, list) and isinstance(real, list) and len(shown) == len(real):
        return [d for i, (a, b) in enumerate(zip(shown, real, strict=True)) for d in differences(a, b, f"{where}[{i}]")]
    numbers = (int, float)
    if isinstance(shown, numbers) and isinstance(real, numbers) and not isinstance(shown, bool | str):
        if type(shown) is not type(real) and isinstance(real, int):
            return [f"{where}: {shown!r} shown, the model's {real!r}"]
        return [] if abs(shown - real) <= TOLERANCE else [f"{where}: {shown!r} shown, the model's {real!r}"]
    return [] if shown == real else [f"{where}: {shown!r} shown, the model's {real!r}"]


def check(checkpoint: str | Path, root: Path = ROOT) -> dict[str, tuple[list[str], str]]:
    """Per answer kind: (its differences from the model's real answer, the block as it should read)."""
    from stack.demo import answer

    out = {}
    for answer_kind, request_kind in PAIRS.items():
        shown = json.loads(block_text(root, answer_kind))
        real = answer(json.loads(block_text(root, request_kind)), checkpoint)
        out[answer_kind] = (differences(shown, real), layout(shown_answer(real, shown)))
    return out


def write(checkpoint: str | Path, root: Path = ROOT) -> list[Path]:
    """Rewrite every answer block that is not as the model's answer reads (its numbers rounded, its
    digest the checkpoint's); returns the pages rewritten."""
    written = []
    for kind, (_, text) in check(checkpoint, root).items():
        b = find_block(root, kind)
        lines = b.path.read_text(encoding="utf-8").split("\n")
        if "\n".join(lines[b.line:b.end]) == text:
            continue
        b.path.write_text("\n".join([*lines[:b.line], text, *lines[b.end:]]), encoding="utf-8")
        written.append(b.path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stack.doc_answers", description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="the demo checkpoint (vela2 init-demo DIR)")
    ap.add_argument("--write", action="store_true", help="rewrite the answer blocks that differ (default: check)")
    args = ap.parse_args(argv)
    if args.write:
        for path in write(args.checkpoint):
            print(f"rewrote {path.relative_to(ROOT)}")
        return 0
    stale = {kind: diffs for kind, (diffs, _) in check(args.checkpoint).items() if diffs}
    for kind, diffs in stale.items():
        print(f"example {kind}: not the model's answer (--write rewrites it):\n  " + "\n  ".join(diffs))
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
