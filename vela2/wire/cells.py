"""Cells: N independent Redis deployments (each a broker and a result store, as one Redis is today)
that a fleet spreads over, and the slot map that says which cell holds a request.

Every request id (as it travels: tenant-scoped, vela2.wire.keys.scoped_id) hashes to one of SLOTS
slots, `zlib.crc32(id) % SLOTS`; the lines of a bulk job hash by their job id (`batch_<hex>`), so a
job, its lines and its results live in one cell. The slot map assigns every slot to one cell.
Adding a cell (`CellMap.with_cell`, `vela2 cells add`) moves a known share of the slots (1/N of
them for the N-th cell) to the new cell: new requests of those slots go there, and the map keeps
the assignment before the move as `previous`, so a read of an id that the new cell does not know
looks in the cell that held its slot before (old results drain there by their TTL). Drop
`previous` (`vela2 cells settle`) once result_expires_s has passed.

The map is a JSON file (`--cells FILE`, or VELA2_CELLS_FILE), e.g.

    {"cells": {"a": "redis://10.0.0.1:6379/0", "b": {"url": "redis://10.0.0.2:6379/0",
                                                     "broker": "amqp://guest:guest@10.0.0.2//"}},
     "slots": {"a": ["0-8191"], "b": ["8192-16383"]},
     "previous": {"a": ["0-16383"]}}

`cells`: name -> the cell's Redis URL (its result store, and broker unless `broker` names another),
in any form vela2.wire.urls takes (redis://, rediss://, unix://, sentinel://); `slots`: name -> slot
ranges "A-B" or single slots (optional: an even split in the order the cells are named);
`previous`: as `slots`, the map before the last move (optional). Every slot is held by exactly one
cell in each. Standard library only: both sides import it.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vela2.errors import ConfigError
from vela2.wire.jobs import JOB_ID_PREFIX, LINE_SEP
from vela2.wire.urls import BROKER_SCHEMES, RESULT_STORE_SCHEMES, check_url, mask_url

SLOTS = 16_384  # as many as Redis Cluster's: fine enough to move 1/N for any N a fleet needs
ENV_CELLS_FILE = "VELA2_CELLS_FILE"
CELL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# a job id or a job line's id (after an optional "<tenant>/"): routed by the bare job id
_JOB_LINE = re.compile(r"(?:^|/)(" + re.escape(JOB_ID_PREFIX) + r"[0-9a-f]{32})(?:" + re.escape(LINE_SEP) + r"\d+)?$")


def route_key(wire_id: str) -> str:
    """What an id is routed by: for a bulk job (`[<tenant>/]batch_<hex>`) and its lines (`...#<n>`)
    the bare job id, so a job and its lines share a cell whoever's tenant; else the id itself."""
    m = _JOB_LINE.search(wire_id)
    return m.group(1) if m else wire_id


def slot_of(wire_id: str) -> int:
    """The slot of a request id as it travels (tenant-scoped), or of a job id: 0 .. SLOTS-1."""
    return zlib.crc32(route_key(wire_id).encode("utf-8", "surrogatepass")) % SLOTS


@dataclass(frozen=True)
class Cell:
    """One cell: its name, its Redis URL (result store; broker too unless `broker_url`)."""

    name: str
    url: str
    broker_url: str | None = None

    def __str__(self) -> str:
        return f"{self.name} ({mask_url(self.url)})"


@dataclass(frozen=True)
class CellMap:
    """The cells of a deployment and which holds each slot (`owner[slot]` = index into `cells`);
    `previous` the owners before the last move, or None."""

    cells: tuple[Cell, ...]
    owner: tuple[int, ...]
    previous: tuple[int, ...] | None = None
    _index: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for i, cell in enumerate(self.cells):
            if cell.name in self._index:
                raise ConfigError(f"cell {cell.name!r} is named twice")
            self._index[cell.name] = i
        for owners in (self.owner, self.previous):
            if owners is not None and (len(owners) != SLOTS or not all(0 <= o < len(self.cells) for o in owners)):
                raise ConfigError(f"a slot map assigns each of the {SLOTS:,} slots to one of the cells")

    @classmethod
    def single(cls, url: str, broker_url: str | None = None) -> CellMap:
        """One cell holding every slot: a deployment of one Redis, as before cells."""
        return cls((Cell("default", url, broker_url),), (0,) * SLOTS)

    @classmethod
    def even(cls, cells: Iterable[Cell]) -> CellMap:
        """The cells, slots split evenly in contiguous ranges in the order given."""
        cells = tuple(cells)
        if not cells:
            raise ConfigError("a cell map names at least one cell")
        return cls(cells, tuple(slot * len(cells) // SLOTS for slot in range(SLOTS)))

    def cell_of(self, wire_id: str) -> int:
        """The index of the cell that holds `wire_id` (a request id as it travels, or a job id) now."""
        return self.owner[slot_of(wire_id)]

    def previous_of(self, wire_id: str) -> int | None:
        """The index of the cell that held `wire_id`'s slot before the last move, when it was another
        cell (a read that the current cell cannot answer looks there); else None."""
        if self.previous is None:
            return None
        slot = slot_of(wire_id)
        before = self.previous[slot]
        return before if before != self.owner[slot] else None

    def share(self, index: int) -> float:
        """The share of slots (of new traffic) cell `index` holds."""
        return self.owner.count(index) / SLOTS

    def with_cell(self, cell: Cell) -> CellMap:
        """This map with `cell` added: it takes 1/N of the slots (N cells after), the same share from
        each cell (the highest slots of each); the current owners become `previous`."""
        if cell.name in self._index:
            raise ConfigError(f"cell {cell.name!r} is already in the map")
        n = len(self.cells) + 1
        new = len(self.cells)
        owner = list(self.owner)
        for old in range(len(self.cells)):
            held = [s for s in range(SLOTS) if owner[s] == old]
            for s in held[len(held) - len(held) // n:]:
                owner[s] = new
        return CellMap((*self.cells, cell), tuple(owner), self.owner)

    def settled(self) -> CellMap:
        """This map without `previous` (once the moved slots' old results have expired)."""
        return CellMap(self.cells, self.owner)

    def to_json(self) -> dict[str, Any]:
        """The map in its file form (module docstring)."""
        cells = {c.name: c.url if c.broker_url is None else {"url": c.url, "broker": c.broker_url} for c in self.cells}
        out: dict[str, Any] = {"cells": cells, "slots": _ranges_by_cell(self.cells, self.owner)}
        if self.previous is not None:
            out["previous"] = _ranges_by_cell(self.cells, self.previous)
        return out

    def describe(self) -> list[dict[str, Any]]:
        """Per cell: name, URL (password masked) and its share of slots (for `vela2 status`, logs)."""
        return [{"cell": c.name, "url": mask_url(c.url), "slots_share": round(self.share(i), 4)}
                for i, c in enumerate(self.cells)]


def _ranges_by_cell(cells: tuple[Cell, ...], owner: tuple[int, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {c.name: [] for c in cells}
    start = 0
    for slot in range(1, SLOTS + 1):
        if slot == SLOTS or owner[slot] != owner[start]:
            name = cells[owner[start]].name
            out[name].append(f"{start}-{slot - 1}" if slot - 1 > start else str(start))
            start = slot
    return out


def _parse_ranges(cells: tuple[Cell, ...], spec: Any, what: str) -> tuple[int, ...]:
    """Owners per slot from {"name": ["A-B", "C", ...]}; ConfigError naming a gap or an overlap."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{what} must map cell names to lists of slot ranges, not {type(spec).__name__}")
    names = {c.name: i for i, c in enumerate(cells)}
    owner: list[int | None] = [None] * SLOTS
    for name, ranges in spec.items():
        if name not in names:
            raise ConfigError(f"{what} names cell {name!r}, which is not in cells")
        for text in ranges if isinstance(ranges, list) else [ranges]:
            m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(text))
            lo, hi = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else (-1, -1)
            if not (0 <= lo <= hi < SLOTS):
                raise ConfigError(f"{what} of cell {name!r}: {text!r} is not a slot range within 0-{SLOTS - 1}")
            for s in range(lo, hi + 1):
                if (held := owner[s]) is not None:
                    raise ConfigError(f"{what}: slot {s} is given to both {cells[held].name!r} and {name!r}")
                owner[s] = names[name]
    if None in owner:
        raise ConfigError(f"{what}: slot {owner.index(None)} is held by no cell (each of 0-{SLOTS - 1} needs one)")
    return tuple(o for o in owner if o is not None)


def parse_cells(doc: Any) -> CellMap:
    """A CellMap from the file's JSON document (module docstring); ConfigError naming what is wrong."""
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), dict) or not doc["cells"]:
        raise ConfigError('a cells file is a JSON object with "cells": {name: url, ...} naming at least one cell')
    unknown = set(doc) - {"cells", "slots", "previous"}
    if unknown:
        raise ConfigError(f"a cells file has no field {sorted(unknown)[0]!r} (fields: cells, slots, previous)")
    cells = []
    for name, spec in doc["cells"].items():
        if not CELL_NAME_RE.fullmatch(name):
            raise ConfigError(f"cell name {name!r} is not 1-64 letters, digits, '_', '.', '-'")
        url, broker = (spec, None) if isinstance(spec, str) else (
            (spec.get("url"), spec.get("broker")) if isinstance(spec, dict) else (None, None))
        if not isinstance(url, str):
            raise ConfigError(f"cell {name!r}: give its Redis URL, or {{\"url\": ..., \"broker\": ...}}")
        cells.append(Cell(name, check_url(url, f"cell {name!r}", RESULT_STORE_SCHEMES),
                          check_url(broker, f"cell {name!r} broker", BROKER_SCHEMES) if broker else None))
    base = CellMap.even(cells)
    owner = _parse_ranges(base.cells, doc["slots"], "slots") if "slots" in doc else base.owner
    previous = _parse_ranges(base.cells, doc["previous"], "previous") if doc.get("previous") else None
    return CellMap(base.cells, owner, previous)


def load_cells(path: str | Path) -> CellMap:
    """The CellMap in the JSON file `path`; ConfigError when it cannot be read or is not one."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read the cells file {str(path)!r}: {e.strerror or e}") from None
    except ValueError as e:
        raise ConfigError(f"the cells file {str(path)!r} is not JSON: {e}") from None
    return parse_cells(doc)


def save_cells(cell_map: CellMap, path: str | Path) -> None:
    """Write `cell_map` to `path` (readable by its owner only: it may hold passwords)."""
    text = json.dumps(cell_map.to_json(), indent=1) + "\n"
    tmp = Path(f"{path}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def cells_file_from_env() -> str | None:
    """The cells file named by VELA2_CELLS_FILE, or None."""
    return os.environ.get(ENV_CELLS_FILE) or None
