"""(run by test_tracing.py as a process of its own) A producer traced with the OpenTelemetry SDK's
in-memory exporter: a caller span around Client.submit_many, and a POST to the HTTP route that
carries a W3C traceparent; prints the spans it finished as one JSON line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastapi.testclient import TestClient  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from producer import Client  # noqa: E402
from producer.http.app import create_app  # noqa: E402

url, model, http_traceparent = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [{"id": f"t-{k}", "task": "choice:boolq", "text": f"Is the sky blue? {k}",
         "questions": [{"question": "Is it?", "options": ["yes", "no"]}]} for k in range(3)]
client = Client(url, model=model)
with trace.get_tracer("test").start_as_current_span("caller"):
    ids = client.submit_many(rows)
results = client.results_many(ids, timeout_s=120)
assert all(r is not None and r.status == "ok" for r in results.values()), results
with TestClient(create_app(url, model, keys=None)) as http:
    posted = http.post("/v1/system_one?wait_s=60", headers={"traceparent": http_traceparent}, json={
        "version": "1", "model": model, "id": "t-http", "input": "Is the sky blue?",
        "tasks": [{"name": "q", "kind": "choice", "options": ["yes", "no"]}]})
    assert posted.status_code == 200, posted.text


print(json.dumps([{"name": s.name, "trace_id": f"0x{s.context.trace_id:032x}", "span_id": f"0x{s.context.span_id:016x}",
                   "parent_id": f"0x{s.parent.span_id:016x}" if s.parent else None,
                   "attributes": dict(s.attributes or {})} for s in exporter.get_finished_spans()]))
