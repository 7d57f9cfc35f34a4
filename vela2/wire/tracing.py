"""OpenTelemetry tracing across the hops, as both sides see it on the wire (optional: the `otel`
extra installs opentelemetry; without it every function here does nothing).

Off unless configured: `configure(service)` installs an SDK tracer provider only when the standard
variables ask for an exporter (`OTEL_TRACES_EXPORTER` = `otlp` or `console`, or an
`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), named by `OTEL_SERVICE_NAME`
or `service`; an application that installed its own provider keeps it (and is traced through it).

On the wire: the producer starts a `vela2.submit` span (kind PRODUCER) per message and puts its W3C
trace context (`traceparent`, `tracestate`) and the time it was queued (`vela2_sent_at`, unix
seconds) in the message headers; the worker continues that trace (worker.obs.tracing).
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

SENT_HEADER = "vela2_sent_at"  # unix seconds when the producer queued the message (traced messages only)
TRACER_NAME = "vela2"
TRACE_HEADERS = ("traceparent", "tracestate")  # W3C trace context
SHOWN_IDS = 8  # request ids a submit span names (a chunk's first ones)

_configured = False


@functools.cache
def _trace() -> Any:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


def wanted() -> str | None:
    """The exporter the OTEL_* variables ask for (otlp / console), or None."""
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter and exporter != "none":
        return exporter.split(",")[0]
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return "otlp"
    return None


def configure(service: str) -> bool:
    """Install a tracer provider from the OTEL_* variables when they ask for one and none is
    installed yet (once per process); returns whether tracing is on. Raises ImportError naming the
    extra when the variables ask for tracing and opentelemetry is not installed."""
    global _configured
    if _configured or active():
        return active()
    exporter = wanted()
    if exporter is None:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError as e:
        raise ImportError(f"OTEL_* variables ask for traces ({exporter}) but opentelemetry is not installed: "
                          f"pip install 'vela2[otel]' ({e})", name="opentelemetry") from None
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)}))
    if exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER must be otlp, console or none; got {exporter!r}")
    trace.set_tracer_provider(provider)
    _configured = True
    return True


def active() -> bool:
    """Whether a real tracer provider is installed (by `configure` or by the application)."""
    trace = _trace()
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def tracer() -> Any:
    """The vela2 tracer (a no-op one when tracing is off)."""
    trace = _trace()
    return trace.get_tracer(TRACER_NAME) if trace is not None else None


def message_headers(queue: str, request_ids: tuple[str, ...]) -> dict[str, Any]:
    """The headers that carry a message's trace: a `vela2.submit` span (a child of the caller's
    current span, e.g. the HTTP route's), ended as the message is queued. {} when tracing is off."""
    if not active():
        return {}
    from opentelemetry import propagate, trace

    carrier: dict[str, Any] = {}
    span = tracer().start_span("vela2.submit", kind=trace.SpanKind.PRODUCER, attributes={
        "messaging.system": "redis", "messaging.destination.name": queue, "vela2.requests": len(request_ids),
        "vela2.request_ids": list(request_ids[:SHOWN_IDS])})
    try:
        propagate.inject(carrier, context=trace.set_span_in_context(span))
    finally:
        span.end()
    carrier[SENT_HEADER] = time.time()
    return carrier


def parent(headers: dict[str, Any]) -> Any:
    """The trace context a message's headers carry, or None (untraced, or tracing off here)."""
    if "traceparent" not in headers or not active():
        return None
    from opentelemetry import propagate

    return propagate.extract({k: headers[k] for k in TRACE_HEADERS if isinstance(headers.get(k), str)})


def incoming(headers: Any) -> Any:
    """Attach the trace context of an incoming HTTP request (W3C headers) as the current context;
    returns the token for `detach`, or None when there is nothing to join."""
    if not active() or "traceparent" not in headers:
        return None
    from opentelemetry import context, propagate

    return context.attach(propagate.extract({k: headers[k] for k in TRACE_HEADERS if k in headers}))


def detach(token: Any) -> None:
    """Undo `incoming`."""
    if token is not None:
        from opentelemetry import context

        context.detach(token)
