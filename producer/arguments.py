"""What the producer's commands (`vela2 backfill`, `vela2 jobs`, `vela2 http`) share in reading their
arguments: the environment variable of the model's name, the check of a duration given in seconds,
and the cells of `--cells` (instead of `--redis` / `--broker`)."""

from __future__ import annotations

import math
from typing import Any

from vela2.errors import ConfigError, InvalidRequest
from vela2.wire.cells import CellMap, load_cells

ENV_MODEL = "VELA2_MODEL"


def check_seconds(name: str, value: float | None, *, zero_ok: bool = False) -> None:
    """Refuse a duration that is not a finite number of seconds > 0 (>= 0 with `zero_ok`; None: unset)
    with InvalidRequest naming it and the value: NaN compares false with everything, so `--timeout-s
    nan` never timed out, and a negative `--poll-s` crashed in time.sleep mid-run."""
    if value is None or (math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
        return
    raise InvalidRequest(f"{name} must be a finite number of seconds {'>= 0' if zero_ok else '> 0'}; got {value:g}")


def cells_from_args(args: Any, argv: list[str]) -> CellMap | None:
    """The cells of `--cells` (or $VELA2_CELLS_FILE), None without; ConfigError when `--redis`,
    `--redis-url-file` or `--broker` are given with it on the command line `argv` (each cell names
    its own Redis and broker: one of them would be silently unused)."""
    if not getattr(args, "cells", None):
        return None
    given = [f for f in ("--redis", "--redis-url-file", "--broker")
             if any(a == f or a.startswith(f + "=") for a in argv)]
    if given:
        raise ConfigError(f"--cells names each cell's Redis and broker: drop {', '.join(given)}")
    return load_cells(args.cells)
