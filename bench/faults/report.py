"""The report: one Outcome per scenario run (counts, notes, checks, passed), the suite's summary
figures over every run (lost, changed, runs per scenario, passed), the JSON file and the table
printed at the end. A run passes when it lost nothing, changed no answer and every check held."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.faults.accounting import Tracker
from bench.faults.context import log

COUNTS = ("requests", "answered_ok", "answered_error", "expired", "lost", "duplicate_answers_changed")


@dataclass
class Outcome:
    """One scenario run's line in the report (reliability.json's `scenarios`)."""

    name: str
    run: int = 1  # which run of the scenario (--repeat)
    requests: int = 0
    answered_ok: int = 0
    answered_error: int = 0
    expired: int = 0
    lost: int = 0
    duplicate_answers_changed: int = 0
    seconds: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    passed: bool = True

    def check(self, what: str, ok: bool, detail: Any = None) -> bool:
        """Record one of the scenario's own claims (a failed one fails the suite)."""
        self.checks.append({"check": what, "ok": bool(ok), **({"detail": detail} if detail is not None else {})})
        if not ok:
            log.error("%s: check failed: %s (%s)", self.name, what, detail)
        return bool(ok)

    def skip(self, what: str, reason: str) -> None:
        """Record a claim that could not be tested here, with why (never silently)."""
        self.checks.append({"check": what, "ok": True, "skipped": reason})
        log.warning("%s: check skipped: %s (%s)", self.name, what, reason)

    def settle(self, tracker: Tracker) -> dict[str, bytes | None]:
        """Fill the counts from the tracker; returns the raw stored answers by id."""
        f = tracker.final()
        for k in COUNTS:
            setattr(self, k, f[k])
        if f["lost_ids"]:
            self.notes["lost_ids"] = f["lost_ids"]
        return f["raw"]

    def add(self, tracker: Tracker) -> None:
        """Add the tracker's counts to those already here (a scenario of several parts)."""
        f = tracker.final()
        for k in COUNTS:
            setattr(self, k, getattr(self, k) + f[k])
        if f["lost_ids"]:
            self.notes.setdefault("lost_ids", []).extend(f["lost_ids"])

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed = (
            self.lost == 0 and self.duplicate_answers_changed == 0 and all(c["ok"] for c in self.checks)
        )
        return d



def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """Add the figures over every run to the report: `lost`, `changed`, `runs` (per scenario, one
    entry per run, in order: lost, changed, passed, seconds) and `passed` (every run passed, the
    fuzz found no crash, the soak lost nothing)."""
    report["lost"] = sum(x["lost"] for x in report["scenarios"])
    report["changed"] = sum(x["duplicate_answers_changed"] for x in report["scenarios"])
    runs: dict[str, dict[str, list[Any]]] = {}
    for x in report["scenarios"]:
        per = runs.setdefault(x["name"], {"lost": [], "changed": [], "passed": [], "seconds": []})
        per["lost"].append(x["lost"])
        per["changed"].append(x["duplicate_answers_changed"])
        per["passed"].append(x["passed"])
        per["seconds"].append(x["seconds"])
    report["runs"] = runs
    report["passed"] = all(x["passed"] for x in report["scenarios"]) and not report.get("fuzz", {}).get("crashes")
    if "soak" in report:
        report["passed"] = report["passed"] and report["soak"]["lost"] == 0
    return report


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")


def table(report: dict[str, Any]) -> list[str]:
    """The lines printed at the end: one per scenario run, then the fuzz and soak figures."""
    lines = [
        f"{'scenario':15s} {'run':>3s} {'requests':>8s} {'ok':>6s} {'error':>6s} {'expired':>7s} {'lost':>5s} "
        f"{'changed':>7s} {'seconds':>7s}  result"
    ]
    for x in report["scenarios"]:
        failed = "; ".join(c["check"] for c in x["checks"] if not c["ok"])
        lines.append(
            f"{x['name']:15s} {x['run']:3d} {x['requests']:8d} {x['answered_ok']:6d} {x['answered_error']:6d} "
            f"{x['expired']:7d} {x['lost']:5d} {x['duplicate_answers_changed']:7d} {x['seconds']:7.1f}  "
            f"{'passed' if x['passed'] else 'FAILED: ' + failed}"
        )
    if "fuzz" in report:
        f = report["fuzz"]
        lines.append(f"fuzz: {f['inputs_tried']} inputs tried, {f['crashes']} crashes")
    if "soak" in report:
        k = report["soak"]
        lines.append(f"soak: {k['requests']} requests in {k['minutes']} min, lost {k['lost']}, RSS {k['rss_mb']}")
    return lines
