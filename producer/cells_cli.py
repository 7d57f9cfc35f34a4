"""`vela2 cells`: show a cells file (vela2.wire.cells), add a cell to it, or settle it.

    vela2 cells show cells.json             # each cell, its URL (masked) and share of slots
    vela2 cells add cells.json c redis://10.0.0.3:6379/0 [--broker URL]
    vela2 cells settle cells.json           # drop `previous` once the moved results have expired

`add` gives the new cell 1/N of the slots (N cells after), the same share taken from each cell, and
keeps the assignment before as `previous`, so reads of ids written before the move still find them;
it prints the share of new traffic that moves. Give the new file to every producer (clients, route,
backfill, jobs) and start the new cell's workers on its URL; after result_expires_s (the longest
TTL of a result, a day by default) run `settle`. Exit status 2 for a bad file or arguments.
"""

from __future__ import annotations

import argparse
import json
import sys

from vela2.cli import Parser
from vela2.errors import ConfigError
from vela2.wire.cells import Cell, load_cells, save_cells
from vela2.wire.urls import BROKER_SCHEMES, RESULT_STORE_SCHEMES, check_url


def build_parser() -> argparse.ArgumentParser:
    """The `vela2 cells` arguments."""
    ap = Parser(prog="vela2 cells", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="action", required=True)
    s = sub.add_parser("show", help="each cell, its URL (password masked) and share of slots")
    s.add_argument("file")
    s.add_argument("--json", action="store_true", help="print JSON")
    s = sub.add_parser("add", help="add a cell: it takes 1/N of the slots; the old map is kept as `previous`")
    s.add_argument("file")
    s.add_argument("name")
    s.add_argument("url", help="the new cell's Redis URL (result store; broker too unless --broker)")
    s.add_argument("--broker", default=None, help="the new cell's broker, when not its Redis")
    s = sub.add_parser("settle", help="drop `previous` (after result_expires_s has passed since the last add)")
    s.add_argument("file")
    return ap


def main(argv: list[str] | None = None) -> int:
    """show, add to or settle a cells file"""
    args = build_parser().parse_args(argv)
    try:
        cell_map = load_cells(args.file)
        if args.action == "show":
            about = cell_map.describe()
            if args.json:
                print(json.dumps({"cells": about, "previous": cell_map.previous is not None}, indent=1))
            else:
                for c in about:
                    print(f"{c['cell']}: {c['url']} | {c['slots_share']:.1%} of slots")
                if cell_map.previous is not None:
                    print("previous: kept (reads of moved slots fall back to their earlier cell)")
            return 0
        if args.action == "add":
            cell = Cell(args.name, check_url(args.url, f"cell {args.name!r}", RESULT_STORE_SCHEMES),
                        check_url(args.broker, f"cell {args.name!r} broker", BROKER_SCHEMES) if args.broker else None)
            if cell_map.previous is not None:
                raise ConfigError("this map still holds `previous` from an earlier add: run `vela2 cells settle` "
                                  "once that add's results have expired, then add")
            new = cell_map.with_cell(cell)
            save_cells(new, args.file)
            print(f"added cell {cell}: it takes {new.share(len(new.cells) - 1):.1%} of the slots (of new traffic); "
                  "reads of those slots fall back to their earlier cells until `vela2 cells settle`")
            return 0
        save_cells(cell_map.settled(), args.file)
        print(f"settled {args.file}: no `previous` map")
        return 0
    except ConfigError as e:
        print(f"vela2 cells: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
