"""The HTTP route's published contract is what it enforces: schemathesis, every check, against a real
`vela2 http` (uvicorn) process and a real worker on the demo checkpoint.

The run covers the coverage (boundary values of every constraint, valid and invalid), fuzzing and
stateful phases: about 1,400 requests, in under a minute on one core. Its configuration and hooks
are in tests/integration/producer/http/contract/: every 5xx is a failure (a request whose caller's deadline
passed before a worker scored it is a 410, no server error), and bodies breaking a rule JSON Schema
cannot state (the request schema's description names them) are not generated as valid ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from producer.client import Client
from producer.jobs import job_info, submit_job
from stack.harness import ROOT, child_env

CONTRACT = Path(__file__).resolve().parent / "contract"
MAX_EXAMPLES = 100  # per operation and phase
SEED = 1  # a fixed seed: the same requests on every run (raise MAX_EXAMPLES, or vary it, to explore)


ROW = {"id": "st-1", "task": "choice:boolq", "text": "It rained.", "questions": [{"options": ["yes", "no"]}]}


def completed_job(redis_url: str, timeout_s: float = 120.0) -> str:
    """A bulk job of one row, answered by the worker: the job id the run's job routes use."""
    with Client(redis_url, model="vela2-demo") as client:
        job = submit_job(client, [json.dumps(ROW).encode()]).id
        deadline = time.monotonic() + timeout_s
        while job_info(client, job).status != "completed":
            assert time.monotonic() < deadline, job_info(client, job)
            time.sleep(0.05)
    return job


def answered_request(redis_url: str, timeout_s: float = 120.0) -> str:
    """A SystemOne request answered by the worker: the id the run's GET /v1/results routes read
    (random ids are 404s, or 410s of requests the run sent with tiny deadlines: never a valid read)."""
    request = {"model": "vela2-demo", "id": "st-answered", "input": "It rained.",
               "tasks": [{"name": "rain", "kind": "choice", "options": ["yes", "no"]}]}
    with Client(redis_url, model="vela2-demo") as client:
        rid = client.submit(request)
        assert client.result(rid, timeout_s=timeout_s).status == "ok"
    return rid


@pytest.mark.timeout(600)
def test_schemathesis_finds_no_failure_against_the_route_and_a_worker(redis_url, real_worker, http_server, tmp_path):
    real_worker(redis_url)
    base = http_server(redis_url, "--log-level", "warning")
    job = completed_job(redis_url)
    env = child_env({"SCHEMATHESIS_HOOKS": "vela2_st_hooks", "PYTHONPATH": os.pathsep.join([str(CONTRACT), str(ROOT)]),
                     "VELA2_ST_JOB_ID": job, "VELA2_ST_REQUEST_ID": answered_request(redis_url)})
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONTRACT / "schemathesis.toml"), "--no-color",
         "run", f"{base}/openapi.json", "--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED),
         "--workers", "1", "--generation-database", "none", "--request-timeout", "60"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert "No issues found" in out and "Stateful" in out and "Coverage" in out, out[-3000:]
