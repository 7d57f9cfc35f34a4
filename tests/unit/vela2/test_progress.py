"""vela2.progress with a fake clock: plain lines at the interval plus a first and a last one off a
terminal, a bar redrawn in place on one, nothing when off; thread-safe counts; stdlib imports only."""

from __future__ import annotations

import io
import sys
import threading
from pathlib import Path

import pytest

from tests.unit.test_layers import imported_modules
from vela2 import progress
from vela2.progress import LINE_INTERVAL_S, Progress, display_mode, format_duration


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    """A stream that says it is a terminal (and has no file descriptor: the bar assumes 80 columns)."""

    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_line_comes_first_then_one_per_interval_and_one_at_the_end():
    clock, out = Clock(), io.StringIO()
    p = Progress("train", 600, unit="step", stream=out, clock=clock)
    assert p.mode == "lines"
    for _ in range(600):  # a step every 0.25 s: 150 s in all (exact in binary: no rounding at the edges)
        clock.now += 0.25
        p.update(1, loss=0.5)
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 + int(150 / LINE_INTERVAL_S) + 1, lines
    assert lines[0] == "train: step 0/600 (0%), 0 s elapsed"
    assert lines[1] == "train: step 20/600 (3%), 4 step/s, loss 0.5, 5 s elapsed, ~2 min left"
    assert lines[-1] == "train: step 600/600 (100%), 4 step/s, loss 0.5, done in 2 min"
    assert "\r" not in out.getvalue()


def test_no_line_comes_before_the_interval_has_passed():
    clock, out = Clock(), io.StringIO()
    p = Progress("eval", 100, unit="row", stream=out, clock=clock)
    for _ in range(49):
        clock.now += 0.1
        p.update(1)
    assert len(out.getvalue().splitlines()) == 1  # 4.9 s: only the first line
    clock.now = LINE_INTERVAL_S
    p.update(1)
    assert out.getvalue().splitlines()[-1].startswith("eval: row 50/100 (50%), ")


def test_a_run_that_ends_at_once_still_has_its_first_and_last_line_and_one_that_stops_says_so():
    clock, out = Clock(), io.StringIO()
    with Progress("import", 3, unit="tensor", stream=out, clock=clock) as p:
        clock.now = 2.0
        p.update(3)
    assert out.getvalue().splitlines() == ["import: tensor 0/3 (0%), 0 s elapsed",
                                           "import: tensor 3/3 (100%), 1.5 tensor/s, done in 2 s"]
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), Progress("backfill", 10, unit="line", stream=out, clock=clock) as p:
        p.update(4)
        raise KeyboardInterrupt
    assert out.getvalue().splitlines()[-1] == "backfill: line 4/10 (40%), stopped after 0 s"


def test_the_line_names_rate_fields_and_time_left_and_a_resumed_run_counts_only_its_own_steps():
    clock = Clock()
    p = Progress("train", 600, unit="step", stream=io.StringIO(), clock=clock)
    p.update(120, loss=0.41234, epoch="1/3", rows_in_flight=1200)
    assert p.text(38.0) == ("train: step 120/600 (20%), 3.2 step/s, loss 0.4123, epoch 1/3, rows in flight 1,200, "
                            "38 s elapsed, ~3 min left")
    resumed = Progress("train", 600, unit="step", initial=500, stream=io.StringIO(), clock=clock)
    resumed.update(50)
    assert resumed.text(100.0) == "train: step 550/600 (91%), 0.5 step/s, 2 min elapsed, ~2 min left"
    unknown = Progress("backfill", None, unit="line", stream=io.StringIO(), clock=clock)
    unknown.update(1500)
    assert unknown.text(10.0) == "backfill: line 1,500, 150 line/s, 10 s elapsed"


def test_on_a_terminal_one_bar_is_redrawn_in_place_and_ends_with_a_newline():
    clock, term = Clock(), Terminal()
    p = Progress("train", 40, unit="step", stream=term, clock=clock)
    assert p.mode == "bar"
    for _ in range(40):
        clock.now += 0.25
        p.update(1, loss=0.25)
    assert "\n" not in term.getvalue()  # redrawn in place until it ends
    p.close()
    text = term.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1
    draws = text.rstrip("\n").split("\r")[1:]
    assert len(draws) == 1 + 40 + 1  # first, every update (0.25 s apart: past the redraw interval), last
    assert all(d.endswith("\x1b[K") and len(d) - len("\x1b[K") <= 79 for d in draws)
    assert draws[0] == "train: [--------------------] step 0/40 (0%) | 0 s elapsed\x1b[K"
    assert draws[20] == "train: [##########----------] step 20/40 (50%) | 5 s elapsed, ~5 s left | 4 ste\x1b[K"
    # 80 columns: the fields at the end are what is cut
    assert draws[-1].startswith("train: [####################] step 40/40 (100%) | done in 10 s | 4 step/s | lo")


def test_the_bar_fits_a_narrow_terminal():
    p = Progress("backfill", 1000, unit="line", stream=Terminal(), clock=Clock())
    p.update(10, in_flight=512)
    assert p.bar(5.0, columns=40) == "backfill: [----------] line 10/1,000 (1"


def test_off_writes_nothing_and_show_forces_the_bar_off_a_terminal():
    out = io.StringIO()
    with Progress("train", 10, stream=out, show=False) as p:
        p.update(10)
    assert out.getvalue() == ""
    assert display_mode(io.StringIO(), True) == "bar"
    assert display_mode(Terminal(), None) == "bar" and display_mode(io.StringIO(), None) == "lines"


def test_updates_from_several_threads_all_count():
    out = io.StringIO()
    p = Progress("import", 4000, unit="tensor", stream=out)
    threads = [threading.Thread(target=lambda: [p.update(1) for _ in range(1000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p.close()
    assert p.done == 4000
    assert out.getvalue().splitlines()[-1].startswith("import: tensor 4,000/4,000 (100%), ")


def test_a_closed_stream_does_not_stop_the_work():
    class Broken(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError("stderr went away")

    with Progress("jobs", 2, stream=Broken()) as p:
        p.update(2)
    assert p.done == 2


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0 s"), (38.2, "38 s"), (89, "89 s"), (152, "3 min"),
                                               (5340, "89 min"), (5400, "1.5 h")])
def test_durations_read_as_a_person_needs_them(seconds, text):
    assert format_duration(seconds) == text


def test_it_imports_the_standard_library_alone():
    """The producer (no torch) reports through it: it must pull in nothing heavy."""
    imported = {name.split(".")[0] for name in imported_modules(Path(progress.__file__))}
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
