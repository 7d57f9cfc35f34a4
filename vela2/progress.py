"""Progress of a long command on stderr: a bar on a terminal, a plain line every few seconds otherwise.

Every long command reports through `Progress` (init-demo, train, import, calibrate, eval, jobs
--wait, backfill). On a terminal it redraws one bar in place; anywhere else (make, CI, a log file) it
writes a whole line when it starts, then at most one every `LINE_INTERVAL_S`, and one when it ends:

    train: step 120/600 (20%), 3.2 step/s, loss 0.412, 38 s elapsed, ~2 min left

It writes to stderr so that stdout stays a command's output (ids, JSON, results). Standard library
only: the producer (no torch) reports through it too. Safe to update from several threads (the
weights' reading threads of `vela2 import`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

LINE_INTERVAL_S = 5.0  # between plain lines: often enough to show life in a CI log, rare enough to read
BAR_INTERVAL_S = 0.2  # between redraws of the bar on a terminal
BAR_WIDTH = 20  # characters of the bar itself ([#####-----]); at most a quarter of the terminal's width


def display_mode(stream: TextIO, show: bool | None) -> str:
    """How progress appears on `stream`: `show` False -> "off"; True -> "bar" (even off a terminal);
    None -> "bar" on a terminal, else "lines"."""
    if show is False:
        return "off"
    if show:
        return "bar"
    try:
        return "bar" if stream.isatty() else "lines"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return "lines"


def format_duration(seconds: float) -> str:
    """`38 s`, `2 min`, `1.5 h`: as precise as a person reading a progress line needs."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _value(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    return f"{v:,}" if isinstance(v, int) else f"{v:.4g}"


class Progress:
    """Counts `done` of `total` (None: unknown) things of `unit` (`step`, `line`, ...) under `label`.

    `update(n, **fields)` counts n more (the fields, e.g. `loss=0.41`, replace those shown after
    the count); `close()` (or leaving a `with` block) writes the last line. `show`: None = a bar on a
    terminal, plain lines elsewhere; True = a bar always; False = nothing. `initial`: already done
    when it starts (a resumed run); the rate and the time left count only what this run does.
    """

    def __init__(self, label: str, total: int | None = None, *, unit: str = "", initial: int = 0,
                 show: bool | None = None, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, interval_s: float | None = None):
        self.label, self.total, self.unit = label, total, unit
        self.stream = sys.stderr if stream is None else stream
        self.mode = display_mode(self.stream, show)
        self.interval_s = interval_s if interval_s is not None else (
            BAR_INTERVAL_S if self.mode == "bar" else LINE_INTERVAL_S)
        self.initial = self.done = initial
        self.fields: dict[str, Any] = {}
        self.clock = clock
        self.started = clock()
        self._shown_at = self.started
        self._ending: str | None = None  # "done in" / "stopped after" once closed
        self._lock = threading.Lock()  # updates may come from several threads
        with self._lock:
            self._show(self.started)  # the first line: the command is alive and says what it counts

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(stopped=exc_type is not None)

    def update(self, n: int = 1, **fields: Any) -> None:
        """Count `n` more done; `fields` (when given) replace the ones shown after the count."""
        with self._lock:
            self.done += n
            if fields:
                self.fields = fields
            self._maybe_show()

    def set_postfix(self, refresh: bool = False, **fields: Any) -> None:
        """Replace the fields shown after the count (tqdm's name: the backfill loop calls it);
        `refresh` shows them now rather than at the next interval."""
        with self._lock:
            self.fields = fields
            if refresh:
                self._show(self.clock())
            else:
                self._maybe_show()

    def close(self, stopped: bool = False) -> None:
        """Write the last line (or the bar's last state and a newline): "done in" the time it took,
        or "stopped after" it when `stopped` (an error) or short of the total. Idempotent."""
        with self._lock:
            if self._ending is not None:
                return
            short = self.total is not None and self.done < self.total
            self._ending = "stopped after" if stopped or short else "done in"
            self._show(self.clock())
            if self.mode == "bar":
                self._write("\n")

    def text(self, now: float) -> str:
        """The plain line of the current state at time `now`."""
        elapsed = now - self.started
        parts = [self._count(), *self._rate(elapsed)]
        parts += [f"{k.replace('_', ' ')} {_value(v)}" for k, v in self.fields.items()]
        return f"{self.label}: " + ", ".join([*parts, self._times(elapsed)])

    def bar(self, now: float, columns: int) -> str:
        """The bar of the current state at time `now`, cut to `columns` characters."""
        elapsed = now - self.started
        head = f"{self.label}: "
        if self.total:
            width = min(BAR_WIDTH, columns // 4)
            filled = min(width, width * self.done // self.total)
            head += f"[{'#' * filled}{'-' * (width - filled)}] "
        # the times before the fields: what a narrow terminal cuts off is the fields
        parts = [self._count(), self._times(elapsed), *self._rate(elapsed),
                 *(f"{k.replace('_', ' ')} {_value(v)}" for k, v in self.fields.items())]
        return (head + " | ".join(parts))[: max(columns - 1, 1)].rstrip(" |")

    def _times(self, elapsed: float) -> str:
        """`38 s elapsed, ~2 min left` while running; `done in 2 min` (or `stopped after`) at the end."""
        if self._ending is not None:
            return f"{self._ending} {format_duration(elapsed)}"
        left = self._left(elapsed)
        return f"{format_duration(elapsed)} elapsed" + ("" if left is None else f", ~{format_duration(left)} left")

    def _count(self) -> str:
        unit = f"{self.unit} " if self.unit else ""
        if self.total is None:
            return f"{unit}{self.done:,}"
        pct = f" ({100 * self.done // self.total}%)" if self.total > 0 else ""
        return f"{unit}{self.done:,}/{self.total:,}{pct}"

    def _rate(self, elapsed: float) -> list[str]:
        """This run's rate, as a list of at most one part (none before anything is done)."""
        if elapsed <= 0 or self.done <= self.initial:
            return []
        rate = (self.done - self.initial) / elapsed
        per = f" {self.unit}/s" if self.unit else "/s"
        return [(f"{rate:,.0f}" if rate >= 10 else f"{rate:.2g}") + per]  # .2g would write 99.5 as 1e+02

    def _left(self, elapsed: float) -> float | None:
        """The seconds left at this run's rate (None without a total or a rate, or when done)."""
        if self.total is None or self.done >= self.total or self.done <= self.initial or elapsed <= 0:
            return None
        return (self.total - self.done) * elapsed / (self.done - self.initial)

    def _maybe_show(self) -> None:
        now = self.clock()
        if now - self._shown_at >= self.interval_s:
            self._show(now)

    def _show(self, now: float) -> None:
        self._shown_at = now
        if self.mode == "lines":
            self._write(self.text(now) + "\n")
        elif self.mode == "bar":
            self._write("\r" + self.bar(now, _columns(self.stream)) + "\x1b[K")  # K: clear the old tail

    def _write(self, s: str) -> None:
        try:
            self.stream.write(s)
            self.stream.flush()
        except (OSError, ValueError):  # stderr gone (a closed pipe): the command's work goes on
            pass


def _columns(stream: TextIO) -> int:
    """The terminal's width behind `stream` (80 when it has none)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 80
