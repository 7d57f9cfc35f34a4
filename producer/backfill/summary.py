"""What one backfill run did (`BackfillSummary`): its counters, the summary line `vela2 backfill`
prints at the end, and the same as JSON (`--json`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class BackfillSummary:
    """What one run did. `error` includes `invalid` (bad lines), `timeout`, `result_expired` and
    `id_conflict` rows."""

    rows: int = 0  # non-blank input lines read
    submitted: int = 0  # rows queued by this run
    written: int = 0  # lines appended to OUT by this run
    ok: int = 0
    error: int = 0
    expired: int = 0
    cancelled: int = 0  # rows answered `cancelled` (Client.cancel of their ids)
    invalid: int = 0  # lines answered at once with an error (bad JSON, invalid request)
    timeout: int = 0  # rows without a result after timeout_s (written as error type "timeout")
    result_expired: int = 0  # rows answered whose answer expired from Redis unread (error "result_expired")
    id_conflict: int = 0  # rows whose id already names other content in Redis (error "id_conflict")
    rescored: int = 0  # rows whose answer from an earlier run had expired from Redis: queued again
    redis_outages: int = 0  # times Redis became unreachable during the run (each retried until back)
    skipped: int = 0  # ids already in OUT (earlier runs)
    retried: int = 0  # lines of earlier runs taken out of OUT to be scored again (--retry)
    stall_warnings: int = 0  # times nothing was answered for stall_warn_s and the queue did not shrink
    duplicates: int = 0  # later lines repeating an id seen earlier in IN (the first wins)
    blank: int = 0  # empty lines, ignored
    recovered: int = 0  # results already in Redis when this run reached the row (not queued again)
    torn_bytes: int = 0  # bytes of a torn last line truncated from OUT before appending
    max_in_flight: int = 0  # peak rows in flight; never above `window`
    window: int = 0
    elapsed_s: float = 0.0
    duplicate_ids: list[str] = field(default_factory=list)  # the first few, for the report

    @property
    def rows_per_s(self) -> float:
        """Lines written per second of this run."""
        return self.written / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        """The one summary line printed at the end."""
        dups = f" {self.duplicate_ids[:5]}" if self.duplicate_ids else ""
        return (
            f"backfill: {self.rows:,} rows: ok {self.ok:,}, error {self.error:,} (invalid {self.invalid:,}, "
            f"timeout {self.timeout:,}, result_expired {self.result_expired:,}, id_conflict {self.id_conflict:,}), "
            f"expired {self.expired:,}, "
            + (f"cancelled {self.cancelled:,}, " if self.cancelled else "")
            + f"skipped {self.skipped:,} (already in OUT), "
            + (f"retried {self.retried:,}, " if self.retried else "")
            + f"duplicates {self.duplicates:,}{dups}; wrote {self.written:,} lines in {self.elapsed_s:.1f} s "
            f"({self.rows_per_s:,.1f} rows/s); max in flight {self.max_in_flight:,} (window {self.window:,})"
            + (f"; redis outages {self.redis_outages:,}" if self.redis_outages else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields plus rows_per_s."""
        return {**asdict(self), "rows_per_s": self.rows_per_s}
