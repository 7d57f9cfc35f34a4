"""What the producer's commands (`vela2 backfill`, `vela2 jobs`) share in reading their arguments:
the environment variable of the model's name, and the check of a duration given in seconds."""

from __future__ import annotations

import math

from vela2.errors import InvalidRequest

ENV_MODEL = "VELA2_MODEL"


def check_seconds(name: str, value: float | None, *, zero_ok: bool = False) -> None:
    """Refuse a duration that is not a finite number of seconds > 0 (>= 0 with `zero_ok`; None: unset)
    with InvalidRequest naming it and the value: NaN compares false with everything, so `--timeout-s
    nan` never timed out, and a negative `--poll-s` crashed in time.sleep mid-run."""
    if value is None or (math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
        return
    raise InvalidRequest(f"{name} must be a finite number of seconds {'>= 0' if zero_ok else '> 0'}; got {value:g}")
