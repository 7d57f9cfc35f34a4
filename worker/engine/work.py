"""What the engine holds: a delivery (one queue message), the message as the engine tracks it, a
request of it and one rendered sequence of a request; small rules over them."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vela2.api import systemone
from vela2.api.schemas import RowResult, guess_id_task
from vela2.errors import Vela2Error
from vela2.wire.jobs import LINE_SEP
from vela2.wire.messages import request_digest
from worker.engine.attempts import Verdict


@dataclass
class Delivery:
    """One queue message handed to the engine by the consumer (or by a test)."""

    headers: dict[str, Any]
    body: bytes
    ack: Callable[[], None]  # remove the message from the broker (called once, after its results are stored)
    reject: Callable[[bool], None]  # reject(requeue): give it back to its queue (True) or drop it
    content_type: str | None = "application/json"
    received: float = field(default_factory=time.monotonic)
    backfill: bool = False  # from the backfill queue: its batches yield to online ones
    tag: str | None = None  # the broker's delivery tag (its visibility lease is renewed while held)


@dataclass(eq=False)
class Message:
    """A delivery while the engine holds it: acked once nothing of it is pending."""

    delivery: Delivery
    id: str
    chunk: bool
    pending: set[str] = field(default_factory=set)  # ids (and dead-letter tokens) not stored yet
    counts: Counter = field(default_factory=Counter)
    summarized: bool = False  # a chunk's summary is queued (it is stored after all its rows)
    finalized: bool = False
    job: str | None = None  # the bulk job its results are counted on (vela2.wire.jobs)
    tenant: str | None = None  # the tenant whose fair share its requests run in (None: keyless)


@dataclass(eq=False)
class Request:
    """One request of a message, from intake to its stored answer."""

    rid: str  # the id its result is stored under
    obj: Any
    msg: Message
    received: float
    expires: datetime | None
    system_one: Any = None  # the parsed SystemOne request, when it is one
    prep: Any = None  # pipeline.Prepared
    outputs: list[Any] = field(default_factory=list)  # per sequence; emptied once decoded
    remaining: int = 0  # sequences without output yet
    model_ms: float = 0.0
    started: float | None = None  # when its first batch started
    verdict: Verdict | None = None  # what the attempt counters said (None: not counted yet in this delivery)
    closed: bool = False  # a result exists (or is being decoded); nothing more to run
    key: int = 0  # its number in this engine (the key of its work in the CPU processes)
    decoding: bool = False  # its outputs went to a CPU process to be decoded
    rendered_digest: str | None = None  # its digest, computed where it was rendered (off this thread)

    @property
    def digest(self) -> str:
        """Its content digest, stored with its answer (an id reused for other content conflicts)."""
        return self.rendered_digest or request_digest(self.obj)

    @property
    def task(self) -> str | None:
        """Its task: the rendered row's, else what its object says."""
        return self.prep.task if self.prep is not None else guess_id_task(self.obj)[1]

    def timings(self) -> dict[str, float]:
        """Its queue and model milliseconds so far (the decode adds render and decode)."""
        return {"queue_ms": ((self.started or self.received) - self.received) * 1e3, "model_ms": self.model_ms}

    def system_one_answer(self, res: RowResult) -> dict[str, Any]:
        """The SystemOne answer carrying a non-ok RowResult (the request parsed or not)."""
        try:
            parsed = self.system_one or systemone.parse_request(self.obj)
            return systemone.to_answer(parsed, res)
        except Vela2Error as e:
            return systemone.error_answer(self.obj, e)


@dataclass(eq=False)
class Seq:
    """One rendered sequence (a window) of a request, waiting for or in a batch."""

    req: Request
    index: int
    seq: Any  # rendering.Sequence

    @property
    def tokens(self) -> int:
        return int(self.seq.num_tokens)


def job_of(msg: Message, rid: str) -> str | None:
    """The job the result `rid` of `msg` is counted on: the message's, for that job's lines only (a
    chunk refused whole is answered under its own id too, and that error is no line of the job)."""
    job = msg.job
    return job if job is not None and rid.startswith(job + LINE_SEP) else None


def clip(text: str, n: int = 300) -> str:
    """`text`, cut to `n` characters for a log line or an error message."""
    return text if len(text) <= n else text[: n - 3] + "..."
