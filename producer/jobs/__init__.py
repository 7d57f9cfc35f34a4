"""Bulk jobs that outlive their client: submit a JSONL file as a job, watch it, cancel it, read it back.

    client = Client("redis://127.0.0.1:6379/0", model="vela2-demo")
    with open("in.jsonl", "rb") as f:
        job = submit_job(client, f, window_s=86_400)          # a JobSubmitted: its id, lines, ...
    job_info(client, job.id).counts                           # queued / ok / error / expired / cancelled
    cancel_job(client, job.id)                                # workers answer what they did not start `cancelled`
    for line, ok in job_lines(client, job.id):                # in input order, one per input line
        ...

The record lives in Redis (vela2.wire.jobs), not in this process: once `submit_job` has returned
(or even while it runs: the job id is known at once, `on_created`), anyone may read its status,
cancel it or read its results, and the workers count every answer on it as they store it.

Input lines: a row, a SystemOne request, or an OpenAI-batch line `{"custom_id": ..., "body": <row or
SystemOne request>}` (`method` / `url` are accepted and ignored); blank lines are skipped. A line
that cannot be queued (not JSON, no object, an invalid request, a bad custom_id, over the message
size) is answered at once with its error result, stored and counted on the job like any other:
never dropped. Each line is its own request (`<job>#<line>`, vela2.wire.jobs), so two lines with the
same id are both answered; the output line carries the caller's id back.

Memory: `submit_job` streams its input (PUSH_LINES lines at a time) and `job_lines` its output
(READ_PAGE lines at a time): neither holds a job in memory, whatever its size.

Modules: `submit` (submit_job), `input_lines` (an input line as a request or its error),
`records` (job_info, cancel_job, list_jobs), `output` (job_lines), `cli` (`vela2 jobs`, write_results).
"""

from producer.jobs.cli import main, write_results
from producer.jobs.output import READ_PAGE, job_lines
from producer.jobs.records import PRUNE_OLDEST, cancel_job, job_info, list_jobs
from producer.jobs.submit import PUSH_LINES, JobSubmitted, submit_job

__all__ = ["PRUNE_OLDEST", "PUSH_LINES", "READ_PAGE", "JobSubmitted", "cancel_job", "job_info", "job_lines",
           "list_jobs", "main", "submit_job", "write_results"]
