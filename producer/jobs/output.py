"""A bulk job's output: one line per input line, in input order (`job_lines`), read READ_PAGE lines
per round trip as the answers come. A line is the answer under the caller's id, or for an
OpenAI-batch input line OpenAI's output shape (`output_line`); once the job has ended, a line with
no stored answer gets a stand-in error (its answer expired, or the job failed before answering it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from producer.answers import http_status
from producer.cells import CellsClient, job_client
from producer.client import Client
from producer.jobs.records import job_info
from vela2.api.schemas import Status
from vela2.wire.jobs import JOB_ERROR_BYTES, KIND_OPENAI, JobInfo, parse_ids_entry, request_wire_id
from vela2.wire.keys import job_ids_key, result_key
from vela2.wire.results import parse_answer

READ_PAGE = 1000  # output lines read per round trip
DEFAULT_POLL_S = 0.2  # pause between reads while waiting for answers


def output_line(kind: str, caller: str, wire: str, answer: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The output line of one input line and whether it is ok: the answer under the caller's id, or
    for an OpenAI-batch line OpenAI's output shape (`custom_id`, `response` {status_code, body},
    `error`; expired / cancelled lines: `response` null and error code batch_expired / batch_cancelled)."""
    body = {**answer, "id": caller}
    status = answer.get("status")
    ok = status == Status.ok.value
    if kind != KIND_OPENAI:
        return body, ok
    err = answer.get("error") or {}
    line: dict[str, Any] = {"id": wire, "custom_id": caller}
    if status in (Status.expired.value, Status.cancelled.value):
        line["response"] = None
        line["error"] = {"code": f"batch_{status}", "message": err.get("message", "")}
    else:
        line["response"] = {"status_code": http_status(answer), "body": body}
        line["error"] = None if ok else {"code": err.get("type", "error"), "message": err.get("message", "")}
    return line, ok


def _missing(wire: str, info: JobInfo) -> dict[str, Any]:
    """The stand-in answer of a line with no stored result once its job has ended: the answer expired
    from the result store, or (a failed job) was never given."""
    if info.status == "failed":
        message = "the job failed (its submitter stopped before its input was all registered); never answered"
        return {"id": wire, "status": Status.error.value, "error": {"type": "job_failed", "message": message}}
    message = "the answer expired from the result store (result_expires) before it was read"
    return {"id": wire, "status": Status.error.value, "error": {"type": "result_expired", "message": message}}


def _kept(answer: dict[str, Any], wire: str) -> dict[str, Any]:
    """An invalid line's error answer from its ids entry (its id put back); one whose answer was
    not kept (the submission's JOB_ERROR_BYTES spent before it) says so."""
    if answer:
        return {**answer, "id": wire}
    message = (f"the line was invalid; its error message was not kept: a job keeps the errors of its first "
               f"{JOB_ERROR_BYTES:,} bytes of invalid lines")
    return {"id": wire, "status": Status.error.value, "error": {"type": "invalid_request", "message": message}}


def job_lines(client: Client | CellsClient, job_id: str, *, timeout_s: float | None = None,
              poll_s: float = DEFAULT_POLL_S) -> Iterator[tuple[dict[str, Any], bool]]:
    """(output line, ok) for every input line of the job, in input order, as the answers come:
    READ_PAGE lines per round trip, waiting (polls every `poll_s`) where the next answer is not in
    yet. TimeoutError after `timeout_s` without the job's end (what was yielded stays yielded);
    JobNotFound when there is no such job."""
    client = job_client(client, job_id)
    info = job_info(client, job_id)  # JobNotFound first, for an id no job can have too
    job = client.scope.wire(job_id)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pos = 0
    while True:
        entries = client.redis.lrange(job_ids_key(job), pos, pos + READ_PAGE - 1)
        wires = [request_wire_id(job, pos + i) for i in range(len(entries))]
        raws = client.redis.mget([result_key(w) for w in wires]) if wires else []
        for raw, entry, wire in zip(raws, entries, wires, strict=True):
            kind, caller, invalid = parse_ids_entry(entry)
            answer = _kept(invalid, wire) if invalid is not None else parse_answer(raw)
            if answer is None:
                if not info.ended:
                    break
                answer = _missing(wire, info)
            yield output_line(kind, caller, client.scope.caller(wire), answer)
            pos += 1
        else:
            if entries:
                continue  # the whole page was in: the next one at once
            if info.ended or (info.input_done and pos >= info.total):
                return
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"job {job_id} is {info.status} after {timeout_s:g} s: {pos:,} of "
                               f"{info.total:,} lines read")
        time.sleep(poll_s)
        info = job_info(client, job_id)
