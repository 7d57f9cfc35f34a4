"""The worker's half of a request's trace (vela2.wire.tracing has the wire side).

A traced message's requests get, when their result is stored, spans continuing the producer's
`vela2.submit` span, written after the fact from the times the engine recorded (the hot path only
notes times; no span is open while a request waits):

    vela2.queue_wait   the message's `vela2_sent_at` -> the worker received it
    vela2.worker       received -> result stored (attributes: request id, status, model, digest)
      vela2.render     received -> rendered (waiting for a render process included; render_ms the CPU part)
      vela2.model      its first batch started -> its last batch ended (links: every batch it ran in)
      vela2.decode     last batch ended -> answer ready
      vela2.store      answer ready -> stored in Redis

and every batch that held a traced request is a `vela2.batch` span (sequences, tokens, device
seconds) linked to each traced request in it. Times: wall clock, from the host's monotonic clock
(shared by the worker's processes) through one offset taken at start.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from vela2.wire import tracing

log = logging.getLogger(__name__)


@dataclass
class RequestTrace:
    """What the engine notes about one traced request (monotonic seconds)."""

    parent: Any  # the producer's context (from the message headers)
    sent_at: float | None  # unix seconds, from the message headers
    received: float
    rendered: float | None = None
    render_ms: float | None = None
    first_batch: float | None = None
    last_batch: float | None = None
    answered: float | None = None
    batches: list[Any] = field(default_factory=list)  # SpanContexts of the batches it ran in


class WorkerTracing:
    """Turns the engine's notes into spans; built only while tracing is on (vela2.wire.tracing)."""

    def __init__(self, model: str, digest: str | None):
        from opentelemetry import trace

        self.trace = trace
        self.tracer = tracing.tracer()
        self.model, self.digest = model, digest
        self.offset_ns = time.time_ns() - time.monotonic_ns()  # monotonic -> unix, for explicit span times

    def _ns(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self.offset_ns

    def request(self, headers: dict[str, Any], received: float) -> RequestTrace | None:
        """The trace of a request of a message with these headers, or None when it is not traced."""
        parent = tracing.parent(headers)
        if parent is None:
            return None
        sent = headers.get(tracing.SENT_HEADER)
        return RequestTrace(parent, float(sent) if isinstance(sent, int | float) else None, received)

    def batch(self, traces: list[RequestTrace], start: float, end: float, sequences: int, tokens: int) -> None:
        """A batch that ran from `start` to `end` (monotonic) and held these traced requests."""
        try:
            self._batch(traces, start, end, sequences, tokens)
        except Exception as e:  # tracing must never hold up a batch's results
            log.warning("tracing a batch failed: %s", e)

    def _batch(self, traces: list[RequestTrace], start: float, end: float, sequences: int, tokens: int) -> None:
        links = [self.trace.Link(self.trace.get_current_span(t.parent).get_span_context()) for t in traces]
        span = self.tracer.start_span("vela2.batch", context=self.trace.set_span_in_context(
            self.trace.INVALID_SPAN), links=links, start_time=self._ns(start), attributes={
            "vela2.sequences": sequences, "vela2.tokens": tokens, "vela2.device_s": round(end - start, 6),
            "vela2.model": self.model})
        span.end(end_time=self._ns(end))
        ctx = span.get_span_context()
        for t in traces:
            t.first_batch = start if t.first_batch is None else min(t.first_batch, start)
            t.last_batch = end if t.last_batch is None else max(t.last_batch, end)
            t.batches.append(ctx)

    def stored(self, t: RequestTrace, request_id: str, status: str, now: float) -> None:
        """The request's result is stored (at monotonic `now`): write its spans."""
        try:
            self._stored(t, request_id, status, now)
        except Exception as e:  # tracing must never hold up acks
            log.warning("tracing request %s failed: %s", request_id, e)

    def _stored(self, t: RequestTrace, request_id: str, status: str, now: float) -> None:
        trace = self.trace
        if t.sent_at is not None:
            wait = self.tracer.start_span("vela2.queue_wait", context=t.parent, kind=trace.SpanKind.CONSUMER,
                                          start_time=int(t.sent_at * 1e9))
            wait.end(end_time=max(int(t.sent_at * 1e9), self._ns(t.received)))
        root = self.tracer.start_span("vela2.worker", context=t.parent, kind=trace.SpanKind.CONSUMER,
                                      start_time=self._ns(t.received), attributes={
                                          "vela2.request_id": request_id, "vela2.status": status,
                                          "vela2.model": self.model, "vela2.digest": self.digest or ""})
        inner = trace.set_span_in_context(root)
        answered = t.answered if t.answered is not None else now

        def child(name: str, start: float | None, end: float | None, **attributes: Any) -> None:
            if start is None or end is None:
                return
            span = self.tracer.start_span(name, context=inner, start_time=self._ns(start), attributes=attributes,
                                          links=[trace.Link(c) for c in t.batches] if name == "vela2.model" else None)
            span.end(end_time=self._ns(max(start, end)))

        child("vela2.render", t.received, t.rendered, **({"vela2.render_ms": t.render_ms} if t.render_ms else {}))
        child("vela2.model", t.first_batch, t.last_batch, **{"vela2.batches": len(t.batches)})
        child("vela2.decode", t.last_batch, answered)
        child("vela2.store", answered, now)
        root.end(end_time=self._ns(now))
