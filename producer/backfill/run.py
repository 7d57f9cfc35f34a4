"""`run_backfill`: one backfill run, from its arguments to its summary. The arguments are checked
before anything is read (URLs, window, chunk size, durations, deadline); then OUT is prepared for
resuming (producer.backfill.output), and every line of IN goes through the windowed submit loop
(producer.backfill.window) into OUT."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from producer.arguments import check_seconds
from producer.backfill.output import LineWriter, scan_out, take_out_retries
from producer.backfill.summary import BackfillSummary
from producer.backfill.window import DEFAULT_STALL_WARN_S, BackfillRun
from producer.brokers import check_wait_replicas
from producer.cells import CellsClient
from producer.client import DEFAULT_MODEL, DEFAULT_REDIS_URL, Client
from vela2.errors import ConfigError, InvalidRequest
from vela2.progress import Progress
from vela2.wire.cells import CellMap, load_cells
from vela2.wire.messages import deadline_to_expires
from vela2.wire.urls import BROKER_SCHEMES, RESULT_STORE_SCHEMES, check_url

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 1024  # rows in flight
DEFAULT_CHUNK_SIZE = 16  # rows per queue message
DEFAULT_TIMEOUT_S = 3600.0  # per row, from its submission; then an error line of type "timeout"
DEFAULT_POLL_S = 0.05  # pause between result polls while waiting
# Durations in seconds checked before anything is read: name -> whether 0 is allowed (a redis_timeout_s
# of 0 gives up at the first failed call; a 0 poll, timeout or stall warning makes no sense).
DURATIONS = {"timeout_s": False, "poll_s": False, "stall_warn_s": False, "redis_timeout_s": True}


def count_lines(path: str | Path, block: int = 1 << 20) -> int:
    """Lines of a file (a last line without newline counts), read in blocks: constant memory."""
    n = 0
    last = b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(block):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def _progress(progress: bool | None, in_path: str | Path) -> Progress:
    """The run's progress on stderr (vela2.progress): lines of IN handled, of its line count (read
    first, in blocks, unless `progress` is False); `progress` None = a bar on a terminal, else a line
    every few seconds; True = a bar; False = nothing."""
    total = None if progress is False else count_lines(in_path)
    return Progress("backfill", total, unit="line", show=progress)


def run_backfill(
    in_path: str | Path,
    out_path: str | Path,
    *,
    redis_url: str = DEFAULT_REDIS_URL,
    model: str = DEFAULT_MODEL,
    window: int = DEFAULT_WINDOW,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    deadline_s: float | None = None,
    progress: bool | None = None,
    poll_s: float = DEFAULT_POLL_S,
    redis: Any = None,
    redis_timeout_s: float | None = None,
    tenant: str | None = None,
    retry: str | None = None,
    stall_warn_s: float = DEFAULT_STALL_WARN_S,
    broker_url: str | None = None,
    wait_replicas: int = 0,
    cells: CellMap | str | Path | None = None,
) -> BackfillSummary:
    """Score every request of IN through the queue into OUT (see producer.backfill).

    `window`: most rows in flight; `chunk_size`: rows per message; `timeout_s`: per row, then an
    error line of type "timeout"; `deadline_s`: Celery `expires` per message (the worker answers
    `expired` after it); `progress`: as `_progress`. `redis` replaces the connection made from
    `redis_url` (tests). `redis_timeout_s`: the longest Redis outage the run rides out (default
    `timeout_s`), then RedisUnavailable. `tenant`: the ids are this tenant's
    (producer.scope.Scope; OUT holds them as given). `retry`: "timeouts" or "errors", the lines of
    OUT scored again (producer.backfill). `stall_warn_s`: warn after this long without an answer
    while the queue does not shrink. `broker_url`: the workers' broker when it is not the Redis at
    `redis_url`. `wait_replicas`: each push returns only once this many replicas of the broker's Redis
    hold its messages (Client's `wait_replicas`; a push that reaches fewer is retried like a Redis
    timeout). `cells`: Redis cells (vela2.wire.cells: a CellMap or its file) instead of `redis_url` /
    `broker_url`: each row is queued and read in its id's cell (a cell's outage is ridden out as one
    Redis's, up to `redis_timeout_s`). Returns the summary (also logged). A URL of the wrong scheme
    raises ConfigError naming it (password masked) before anything is read.
    """
    durations = dict(timeout_s=timeout_s, poll_s=poll_s, stall_warn_s=stall_warn_s, redis_timeout_s=redis_timeout_s)
    cell_map = _checked(cells, redis_url if redis is None else None, broker_url, window=window, chunk_size=chunk_size,
                        wait_replicas=wait_replicas, deadline_s=deadline_s, durations=durations)
    t0 = time.monotonic()
    retried = take_out_retries(out_path, retry) if retry else set()
    done, torn = scan_out(out_path)
    client = (Client(redis_url, model=model, redis=redis, tenant=tenant, broker_url=broker_url,
                     wait_replicas=wait_replicas) if cell_map is None
              else CellsClient(cell_map, model=model, tenant=tenant, wait_replicas=wait_replicas))
    bar = _progress(progress, in_path)
    job = BackfillRun(
        client, LineWriter(out_path), window=window, chunk_size=chunk_size, timeout_s=timeout_s, deadline_s=deadline_s,
        poll_s=poll_s, bar=bar, redis_timeout_s=redis_timeout_s, stall_warn_s=stall_warn_s,
        drop_failed=retried if retry == "errors" else None,
    )  # fmt: skip
    job.summary.torn_bytes, job.summary.retried = torn, len(retried)
    try:
        job.run(in_path, done)
    finally:
        _close(job, bar, client if redis is None else None, t0)
    log.info("%s", job.summary.line())
    return job.summary


def _close(job: BackfillRun, bar: Progress, client: Client | CellsClient | None, t0: float) -> None:
    """End a run, whatever stopped it: OUT and the bar closed, the client too when the run made it."""
    job.writer.close()
    bar.close()
    if client is not None:
        client.close()
    job.summary.elapsed_s = time.monotonic() - t0


def _checked(cells: CellMap | str | Path | None, redis_url: str | None, broker_url: str | None,
             **kw: Any) -> CellMap | None:
    """`check_arguments` of a run (over cells: each cell's broker; `redis_url` None: a ready client)
    and its cells (None: one Redis)."""
    if cells is None:
        check_arguments(redis_url, broker_url, **kw)
        return None
    if redis_url is None:
        raise ConfigError("give cells or a ready redis client, not both")
    cell_map = cells if isinstance(cells, CellMap) else load_cells(cells)
    for cell in cell_map.cells:
        check_arguments(None, cell.broker_url, **kw)
    return cell_map


def check_arguments(redis_url: str | None, broker_url: str | None, *, window: int, chunk_size: int,
                    wait_replicas: int, deadline_s: float | None, durations: dict[str, float | None]) -> None:
    """Refuse the arguments of a run before anything is read, in this order: the result store's URL
    (None: a ready client was given) and the broker's (ConfigError naming it, password masked), the
    window, the replicas to wait for, the chunk size, the durations and the deadline (InvalidRequest /
    LimitExceeded naming them)."""
    if redis_url is not None:
        check_url(redis_url, "result store", RESULT_STORE_SCHEMES)
    if broker_url:
        check_url(broker_url, "broker", BROKER_SCHEMES)
    if window < 1:
        raise InvalidRequest(f"window must be at least 1; got {window}")
    check_wait_replicas(wait_replicas, broker_url)
    if chunk_size < 1:
        raise InvalidRequest(f"chunk_size must be at least 1; got {chunk_size}")
    check_durations(durations)
    deadline_to_expires(deadline_s)  # a deadline out of bounds is refused before anything is queued


def check_durations(values: dict[str, float | None], *, as_flags: bool = False) -> None:
    """`check_seconds` over DURATIONS, each named as its parameter or (`as_flags`) its flag: `--poll-s`."""
    for name, value in values.items():
        check_seconds("--" + name.replace("_", "-") if as_flags else name, value, zero_ok=DURATIONS[name])
