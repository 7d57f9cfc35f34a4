"""Redis memory of a bulk job of N rows, measured with MEMORY USAGE on a real redis-server.

Submits a job of `--rows` demo rows (producer.jobs.submit_job, chunks of 16 rows a message), then
measures the job's keys while it waits (its hash, its ids list, the queued messages); answers it
with the fake worker (stub answers: the shape and size of a real choice answer, numbers aside) and
measures the stored results. Writes a JSON report (`--out`).

    python -m bench.job_memory --rows 20000 --out bench/results/job-memory.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from producer.client import Client
from producer.jobs import submit_job
from producer.testing import FakeWorker
from stack.harness import RedisServer
from vela2.wire.jobs import request_wire_id
from vela2.wire.keys import backfill_queue, job_ids_key, job_key, priority_lists, result_key

MODEL = "vela2-demo"


def demo_row(i: int) -> dict[str, Any]:
    """A typical short row: ~120 characters of text, one yes / no question."""
    return {"id": f"row-{i:08d}", "task": "choice:boolq",
            "text": f"Order {i} arrived two days late and the box was damaged; the customer asks for a refund.",
            "questions": [{"question": "Is this a complaint?", "options": ["yes", "no"]}]}


def usage(r: Any, key: str) -> int:
    """MEMORY USAGE of one key (all its elements: SAMPLES 0), 0 when absent."""
    return int(r.memory_usage(key, samples=0) or 0)


def measure(rows: int) -> dict[str, Any]:
    """The report: bytes per job key, per row, before and after the answers."""
    with tempfile.TemporaryDirectory() as tmp, RedisServer(Path(tmp)) as server:
        r = server.client()
        redis_version = r.info("server")["redis_version"]
        client = Client(redis=r, model=MODEL)
        lines = (json.dumps(demo_row(i)).encode() + b"\n" for i in range(rows))
        base = int(r.info("memory")["used_memory"])
        job = submit_job(client, lines).id
        queued = {
            "job_hash": usage(r, job_key(job)),
            "ids_list": usage(r, job_ids_key(job)),
            "queue_messages": sum(usage(r, q) for q in priority_lists(backfill_queue(MODEL))),
            "used_memory_delta": int(r.info("memory")["used_memory"]) - base,
        }
        FakeWorker(r, MODEL).drain()
        results = 0
        for k in range(0, rows, 1000):
            pipe = r.pipeline(transaction=False)
            for i in range(k, min(rows, k + 1000)):
                pipe.memory_usage(result_key(request_wire_id(job, i)), samples=0)
            results += sum(int(n or 0) for n in pipe.execute())
        answered = {
            "job_hash": usage(r, job_key(job)),
            "ids_list": usage(r, job_ids_key(job)),
            "results": results,
            "queue_messages": sum(usage(r, q) for q in priority_lists(backfill_queue(MODEL))),
            "used_memory_delta": int(r.info("memory")["used_memory"]) - base,
        }
        r.close()
    row_bytes = len(json.dumps(demo_row(0)))
    return {
        "command": "python -m bench.job_memory " + " ".join(sys.argv[1:]),
        "machine": f"{platform.node()} ({platform.machine()}), redis-server {redis_version}",
        "rows": rows,
        "row_json_bytes": row_bytes,
        "queued": queued,
        "answered": answered,
        "per_row": {
            "ids_list": round(queued["ids_list"] / rows, 1),
            "queued_message": round(queued["queue_messages"] / rows, 1),
            "result": round(results / rows, 1),
            "while_queued_total": round(queued["used_memory_delta"] / rows, 1),
            "once_answered_total": round(answered["used_memory_delta"] / rows, 1),
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Measure and write the report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--out", default=None, help="write the JSON report here (else print it)")
    args = ap.parse_args(argv)
    report = measure(args.rows)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
