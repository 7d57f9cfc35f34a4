"""OUT, the backfill's output file: resumable and written whole lines at a time.

- `scan_out`: the ids OUT already answers (skipped by this run), after truncating a torn last line
  (a write a kill cut short);
- `take_out_retries`: with `--retry`, the lines to score again taken out of OUT (streamed to a
  temporary file renamed over it);
- `LineWriter`: appends each result as one unbuffered write of the whole line, fsync when closed.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from vela2.api.schemas import Status
from vela2.errors import InvalidRequest

log = logging.getLogger(__name__)

RETRY_CHOICES = ("errors", "timeouts")
LOST_TYPES = ("timeout", "result_expired")  # error types of lines this command wrote for rows never answered


def scan_out(path: str | Path) -> tuple[set[str], int]:
    """Ids already answered in OUT, and the byte count of a torn last line (truncated here).

    A line without its newline can only be the tail of a write cut short by a kill, so it is cut
    off and its id is done again. A complete line that is not JSON (edited by hand) is kept and
    logged; its id, if any, is done again.
    """
    done: set[str] = set()
    p = Path(path)
    if not p.exists():
        return done, 0
    torn = 0
    with open(p, "rb+") as f:
        good_end = 0
        for n, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                torn = len(line)
                break
            good_end += len(line)
            try:
                obj = json.loads(line)
                rid = obj["id"]
            except (ValueError, KeyError, TypeError):
                if line.strip():
                    log.warning("%s line %d is not a result line; its request will be answered again", p, n)
                continue
            if isinstance(rid, str):
                done.add(rid)
        if torn:
            log.warning("%s: truncating a torn last line (%d bytes, from an interrupted run)", p, torn)
            f.truncate(good_end)
    return done, torn


def is_retried(line: dict[str, Any], retry: str) -> bool:
    """Whether an OUT line is scored again under `--retry retry` (see producer.backfill)."""
    if retry == "errors":
        return line.get("status") != Status.ok.value
    err = line.get("error")
    return line.get("status") == Status.error.value and isinstance(err, dict) and err.get("type") in LOST_TYPES


def take_out_retries(path: str | Path, retry: str) -> set[str]:
    """Take the lines `retry` scores again out of OUT (streamed to a temporary file renamed over
    it); returns their ids. A torn last line is kept for `scan_out` to truncate."""
    if retry not in RETRY_CHOICES:
        raise InvalidRequest(f"retry must be one of {', '.join(RETRY_CHOICES)}; got {retry!r}")
    p = Path(path)
    if not p.exists():
        return set()
    ids: set[str] = set()
    tmp = p.with_name(p.name + ".retry-tmp")
    with open(p, "rb") as src, open(tmp, "wb") as dst:
        for line in src:
            try:
                obj = json.loads(line) if line.endswith(b"\n") else None
            except ValueError:
                obj = None
            if isinstance(obj, dict) and isinstance(obj.get("id"), str) and is_retried(obj, retry):
                ids.add(obj["id"])
                continue
            dst.write(line)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, p)
    return ids


class LineWriter:
    """Appends JSON lines to OUT: each line is one unbuffered write of the whole line (so a kill
    leaves at most a torn last line, which `scan_out` truncates); fsync when closed."""

    def __init__(self, path: str | Path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, obj: dict[str, Any]) -> None:
        """Append one JSON object as one line. A string UTF-8 cannot encode (a lone surrogate, e.g.
        quoted in a stored answer's message) is written as a JSON escape instead: a line is never lost
        to its encoding, and it reads back as the same string."""
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"
        try:
            encoded = text.encode("utf-8")
        except UnicodeEncodeError:
            encoded = (json.dumps(obj, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")
        data = memoryview(encoded)
        while data:
            data = data[os.write(self.fd, data) :]

    def close(self) -> None:
        """fsync and close."""
        try:
            os.fsync(self.fd)
        finally:
            os.close(self.fd)
