"""A bulk job's record (vela2.wire.jobs) as callers read and change it: `job_info` (status, exact
counts, the model identities that answered it), `cancel_job`, `list_jobs` (the newest of a model and
tenant), and `prune_jobs_index`, which keeps the model's index of jobs about as large as the jobs
that exist."""

from __future__ import annotations

import time
from typing import Any

from producer.cells import CellsClient, job_client
from producer.client import Client
from vela2.errors import InvalidRequest, JobNotFound
from vela2.wire.jobs import CANCEL_JOB_SCRIPT, JOB_FIELDS, JobInfo, parse_job, served_counts
from vela2.wire.keys import job_key, jobs_key, scoped_id

PRUNE_OLDEST = 32  # index entries each new job checks, oldest first


def _job_key(client: Client, job_id: str) -> str:
    """The record key of the caller's job `job_id`; JobNotFound for an id no job can have."""
    try:
        return job_key(client.scope.wire(job_id))
    except InvalidRequest as e:
        raise JobNotFound(f"no job {job_id[:80]!r}: {e}") from None


def job_info(client: Client | CellsClient, job_id: str) -> JobInfo:
    """The job's record now, with the model identities that answered it (one round trip);
    JobNotFound when there is none (or it is another tenant's). A CellsClient reads the job's cell."""
    client = job_client(client, job_id)
    pipe = client.redis.pipeline(transaction=False)
    key = _job_key(client, job_id)
    pipe.hmget(key, JOB_FIELDS)
    pipe.hgetall(key)
    values, fields = pipe.execute()
    info = parse_job(values, time.time())
    if info is None:
        raise JobNotFound(f"no job {job_id!r} (never created, another tenant's, or expired with its results)")
    info.served = served_counts(fields)
    return info


def cancel_job(client: Client | CellsClient, job_id: str) -> JobInfo:
    """Ask a job to cancel: workers answer every request of it they have not started `cancelled`
    (without running it); those running finish and keep their answer; the job ends `cancelled`
    once all are answered. A job that has ended stays as it is. Returns the record after the call;
    JobNotFound when there is none."""
    client = job_client(client, job_id)
    code = client.redis.eval(CANCEL_JOB_SCRIPT, 1, _job_key(client, job_id), time.time())
    if code == -1:
        raise JobNotFound(f"no job {job_id!r} (never created, another tenant's, or expired with its results)")
    return job_info(client, job_id)


def prune_jobs_index(redis: Any, model: str) -> int:
    """Drop the model's oldest PRUNE_OLDEST index entries whose job record has expired (every
    tenant's; two round trips). Called by each new job, so the index stays about as large as the
    jobs that exist, even for jobs that nobody lists (those made over HTTP, which has no list route).
    Returns how many entries went."""
    raw = redis.zrange(jobs_key(model), 0, PRUNE_OLDEST - 1)
    oldest = [j.decode() if isinstance(j, bytes) else str(j) for j in raw]
    if not oldest:
        return 0
    pipe = redis.pipeline(transaction=False)
    for j in oldest:
        pipe.exists(job_key(j))
    gone = [j for j, alive in zip(oldest, pipe.execute(), strict=True) if not alive]
    if gone:
        redis.zrem(jobs_key(model), *gone)
    return len(gone)


def list_jobs(client: Client | CellsClient, limit: int = 100) -> list[JobInfo]:
    """The newest `limit` jobs of the client's model (and tenant), newest first; index entries of
    jobs that expired are removed on the way. A CellsClient lists every cell's, merged."""
    if limit < 1:
        raise InvalidRequest(f"limit must be at least 1; got {limit}")
    if isinstance(client, CellsClient):
        merged = [info for c in client.clients for info in list_jobs(c, limit)]
        return sorted(merged, key=lambda info: info.created_at, reverse=True)[:limit]
    prefix = scoped_id(client.scope.tenant, "")  # the tenant's prefix ("" is no id: not Scope.wire)
    out: list[JobInfo] = []
    start = 0
    while len(out) < limit:
        page = client.redis.zrevrange(jobs_key(client.model), start, start + limit - 1)
        if not page:
            break
        start += len(page)
        # a tenant reads only its own jobs; no tenant: only jobs of no tenant (scoped ids hold a "/")
        names: list[str] = [j.decode() if isinstance(j, bytes) else str(j) for j in page]
        jobs = [j for j in names if j.startswith(prefix) and "/" not in j[len(prefix):]]
        pipe = client.redis.pipeline(transaction=False)
        for j in jobs:
            pipe.hmget(job_key(j), JOB_FIELDS)
        gone = []
        for j, values in zip(jobs, pipe.execute(), strict=True):
            info = parse_job(values, time.time())
            if info is None:
                gone.append(j)
            elif len(out) < limit:
                out.append(info)
        if gone:
            client.redis.zrem(jobs_key(client.model), *gone)
            start -= len(gone)
    return out
