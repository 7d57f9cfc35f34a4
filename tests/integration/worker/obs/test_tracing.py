"""OpenTelemetry traces across real processes (issue 23): a producer process traced with the SDK's
in-memory exporter, the HTTP route joining a caller's W3C context, and a worker process exporting
to its console: every request's worker spans continue the producer's trace."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

SUPPORT = Path(__file__).resolve().parents[3] / "support"
MODEL = "vela2-demo"
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def console_spans(log: str) -> list[dict]:
    """The spans ConsoleSpanExporter printed into a worker's log (indented JSON objects)."""
    decoder, spans, at = json.JSONDecoder(), [], 0
    while (at := log.find('{\n    "name"', at)) != -1:
        span, end = decoder.raw_decode(log, at)
        spans.append(span)
        at = end
    return spans


def test_a_request_trace_runs_from_the_caller_through_the_queue_to_the_worker(redis_url, start_worker):
    worker = start_worker(redis_url, env={"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "w-test"})
    worker.wait_ready()
    run = subprocess.run([sys.executable, str(SUPPORT / "traced_producer.py"), redis_url, MODEL,
                          f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    produced = json.loads(run.stdout.strip().splitlines()[-1])
    submits = [s for s in produced if s["name"] == "vela2.submit"]
    (caller,) = [s for s in produced if s["name"] == "caller"]
    assert len(submits) == 4  # one per message: 3 rows of submit_many, 1 SystemOne request over HTTP
    row_submits = [s for s in submits if s["trace_id"] == caller["trace_id"]]
    assert len(row_submits) == 3 and all(s["parent_id"] == caller["span_id"] for s in row_submits)
    (http_submit,) = [s for s in submits if s not in row_submits]
    assert http_submit["trace_id"] == "0x" + CALLER_TRACE and http_submit["parent_id"] == "0x" + CALLER_SPAN

    deadline = time.monotonic() + 60  # each request's spans are written when its result is stored
    while time.monotonic() < deadline:
        spans = console_spans(worker.log())
        if len([s for s in spans if s["name"] == "vela2.worker"]) >= 4:
            break
        time.sleep(0.2)
    by_id = {s["context"]["span_id"]: s for s in spans}
    workers = [s for s in spans if s["name"] == "vela2.worker"]
    assert sorted(s["attributes"]["vela2.request_id"] for s in workers) == ["t-0", "t-1", "t-2", "t-http"]
    for submit in submits:
        (mine,) = [s for s in workers if s["parent_id"] == submit["span_id"]]
        assert mine["context"]["trace_id"] == submit["trace_id"]  # the producer's trace, continued
        assert mine["attributes"]["vela2.status"] == "ok" and len(mine["attributes"]["vela2.digest"]) == 32
        assert mine["resource"]["attributes"]["service.name"] == "w-test"
        children = {s["name"]: s for s in spans if s["parent_id"] == mine["context"]["span_id"]}
        assert set(children) == {"vela2.render", "vela2.model", "vela2.decode", "vela2.store"}
        (wait,) = [s for s in spans if s["name"] == "vela2.queue_wait" and s["parent_id"] == submit["span_id"]]
        assert wait["start_time"] <= mine["start_time"]
        # the model span links to the batches the request ran in; each such batch links back to it
        batch_ids = [link["context"]["span_id"] for link in children["vela2.model"]["links"]]
        assert batch_ids and all(by_id[b]["name"] == "vela2.batch" for b in batch_ids)
        assert all(submit["span_id"] in [link["context"]["span_id"] for link in by_id[b]["links"]] for b in batch_ids)
        assert by_id[batch_ids[0]]["attributes"]["vela2.sequences"] >= 1
