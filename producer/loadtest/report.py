"""Percentiles and the summary of one load point (pure: no I/O)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

STAGES = ("queue_ms", "render_ms", "model_ms", "decode_ms")  # the answers' own timings
PERCENTILES = (50, 90, 99)


@dataclass
class Outcome:
    """One request of a measured window: when it was due (seconds from the window's start), when the
    client sent it (its lag behind schedule), how long from due to answered (None: lost), its status
    ("ok", "error", ...; "lost" when no answer came within the timeout) and its answer's timings."""

    due_s: float
    lag_s: float
    latency_s: float | None
    status: str
    timings: dict[str, float] = field(default_factory=dict)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank percentile: the smallest value with at least p% of `values` at or below it
    (None for no values). p in (0, 100]."""
    if not values:
        return None
    if not 0 < p <= 100:
        raise ValueError(f"p must be in (0, 100]; got {p}")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def distribution(values: Sequence[float], scale: float = 1.0, digits: int = 1) -> dict[str, float | None]:
    """p50 / p90 / p99 / max of `values` times `scale`, rounded."""
    out: dict[str, float | None] = {}
    for p in PERCENTILES:
        v = percentile(values, p)
        out[f"p{p}"] = None if v is None else round(v * scale, digits)
    out["max"] = round(max(values) * scale, digits) if values else None
    return out


def summarize(outcomes: Iterable[Outcome], rate: float, window_s: float) -> dict[str, Any]:
    """The figures of one point: offered `rate` (requests/s) over `window_s` seconds."""
    done = list(outcomes)
    answered = [o for o in done if o.latency_s is not None]
    ok = [o for o in answered if o.status == "ok"]
    latencies = [o.latency_s for o in answered if o.latency_s is not None]
    # completions within the window (due + latency inside it) over the window: what the server kept up with
    in_window = sum(1 for o in answered if o.latency_s is not None and o.due_s + o.latency_s <= window_s)
    return {
        "offered_per_s": round(rate, 3),
        "window_s": round(window_s, 3),
        "sent": len(done),
        "answered": len(answered),
        "ok": len(ok),
        "errors": len(answered) - len(ok),
        "lost": len(done) - len(answered),
        "arrivals_per_s": round(len(done) / window_s, 3) if window_s else None,
        "completions_per_s": round(in_window / window_s, 3) if window_s else None,
        "latency_ms": distribution(latencies, 1e3),
        "stages_ms": {stage: distribution([o.timings[stage] for o in ok if stage in o.timings])
                      for stage in STAGES},
        "client_lag_ms": distribution([o.lag_s for o in done], 1e3),
        "error_types": _counts(o.status for o in answered if o.status != "ok"),
    }


def _counts(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def line(point: dict[str, Any]) -> str:
    """One human line of a point's summary."""
    lat = point["latency_ms"]
    head = "one at a time" if point.get("sequential") else f"{point['offered_per_s']:g}/s"
    return (f"{head}: sent {point['sent']}, ok {point['ok']}, errors {point['errors']}, "
            f"lost {point['lost']}; completions {point['completions_per_s']}/s; latency ms p50 {lat['p50']} "
            f"p90 {lat['p90']} p99 {lat['p99']} max {lat['max']}")
