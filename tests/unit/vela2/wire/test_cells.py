"""The slot map of Redis cells (vela2.wire.cells): stable routing, jobs kept together, adding a cell."""

from __future__ import annotations

import json
import stat
import uuid
from collections import Counter
from pathlib import Path

import pytest

from vela2.errors import ConfigError
from vela2.wire.cells import SLOTS, Cell, CellMap, load_cells, parse_cells, route_key, save_cells, slot_of

JOB = "batch_" + "0123456789abcdef" * 2


def two() -> CellMap:
    return CellMap.even([Cell("a", "redis://10.0.0.1:6379/0"), Cell("b", "redis://10.0.0.2:6379/0")])


def test_slots_are_pinned_values_not_a_per_process_hash():
    # CRC-32 of the UTF-8 id: the same in every process, Python version and host (no hash seed)
    assert [slot_of(i) for i in ["r-1", "tenant-a/r-1", "é/ü", JOB]] == [16377, 12445, 2414, 3912]


def test_a_tenants_ids_are_routed_by_the_scoped_id():
    assert {slot_of(f"t{k}/same-id") for k in range(50)} != {slot_of("same-id")}


def test_a_job_and_its_lines_hash_to_the_job_id_slot_whatever_the_tenant():
    assert route_key(f"acme/{JOB}#17") == route_key(f"{JOB}#0") == route_key(JOB) == JOB
    assert {slot_of(f"{JOB}#{n}") for n in range(200)} == {slot_of(JOB)} == {slot_of(f"acme/{JOB}#3")}
    assert route_key("x" + JOB) == "x" + JOB  # not a job id: routed as itself


def test_an_even_map_spreads_ids_evenly():
    m = CellMap.even([Cell(n, f"redis://h{n}:6379") for n in "abcd"])
    counts = Counter(m.cell_of(uuid.uuid4().hex) for _ in range(20_000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(4_500 < c < 5_500 for c in counts.values()), counts


def test_adding_a_cell_moves_one_nth_of_the_slots_and_only_to_the_new_cell():
    m = two()
    bigger = m.with_cell(Cell("c", "redis://10.0.0.3:6379/0"))
    moved = [s for s in range(SLOTS) if m.owner[s] != bigger.owner[s]]
    assert abs(len(moved) / SLOTS - 1 / 3) < 0.001
    assert all(bigger.owner[s] == 2 for s in moved)
    assert bigger.previous == m.owner
    ids = [uuid.uuid4().hex for _ in range(2000)]
    for rid in ids:  # a moved id reads from its old cell first; an id that stayed has no fallback
        stayed = m.cell_of(rid) == bigger.cell_of(rid)
        assert bigger.previous_of(rid) == (None if stayed else m.cell_of(rid))
    assert bigger.settled().previous is None
    with pytest.raises(ConfigError, match="already"):
        bigger.with_cell(Cell("c", "redis://x:1"))


def test_the_file_form_round_trips_and_is_private(tmp_path: Path):
    m = two().with_cell(Cell("c", "redis://:secret@10.0.0.3:6379/0", "amqp://guest:guest@10.0.0.3//"))
    path = tmp_path / "cells.json"
    save_cells(m, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_cells(path) == m
    assert "secret" not in json.dumps(m.describe())


@pytest.mark.parametrize("doc, message", [
    ({}, "at least one cell"),
    ({"cells": {"a": "redis://h:1"}, "extra": 1}, "no field 'extra'"),
    ({"cells": {"a b": "redis://h:1"}}, "cell name"),
    ({"cells": {"a": "http://h:1"}}, "scheme 'http'"),
    ({"cells": {"a": 5}}, "give its Redis URL"),
    ({"cells": {"a": "redis://h:1", "b": "redis://g:1"}, "slots": {"a": ["0-9000"], "b": ["9000-16383"]}},
     "slot 9000 is given to both 'a' and 'b'"),
    ({"cells": {"a": "redis://h:1", "b": "redis://g:1"}, "slots": {"a": ["0-100"], "b": ["102-16383"]}},
     "slot 101 is held by no cell"),
    ({"cells": {"a": "redis://h:1"}, "slots": {"z": ["0-16383"]}}, "names cell 'z'"),
    ({"cells": {"a": "redis://h:1"}, "slots": {"a": ["0-16384"]}}, "not a slot range"),
])
def test_a_bad_cells_file_names_what_is_wrong(doc: dict, message: str):
    with pytest.raises(ConfigError, match=message):
        parse_cells(doc)


def test_a_missing_or_broken_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_cells(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        load_cells(tmp_path / "bad.json")
