"""The examples of README.md and docs/ run as tests (tests/unit/test_docs.py finds them): the `pytest`
blocks in a pytest subprocess with the plugin loaded by its entry point, once on fakeredis and once on
a real redis-server; the `script` blocks as they are, answered by a FakeWorker; the Quickstart for
real: its worker command started as written, its request answered by that worker."""

from __future__ import annotations

import contextlib
import gc
import io
import subprocess
import sys
from pathlib import Path

import pytest

from stack.harness import WorkerProcess, child_env, die_with_parent
from tests.unit.test_docs import DEFAULT_REDIS_URL, examples

ROOT = Path(__file__).resolve().parents[2]


def _run_pytest_examples(tmp_path: Path, *args: str) -> None:
    blocks = examples("pytest")
    for i, code in enumerate(blocks):
        (tmp_path / f"test_docs_example_{i}.py").write_text(code, encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                         env=child_env(), capture_output=True, text=True, timeout=240)
    n_tests = sum(code.count("\ndef test_") + code.startswith("def test_") for code in blocks)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"{n_tests} passed" in run.stdout, run.stdout[-2000:]


@pytest.mark.integration  # a pytest subprocess
def test_the_pytest_examples_pass_on_fakeredis(tmp_path):
    _run_pytest_examples(tmp_path)


def test_the_pytest_examples_pass_on_a_real_redis_too(tmp_path, redis_url):
    _run_pytest_examples(tmp_path, "--vela2-redis-url", redis_url)


def test_the_script_examples_run(redis_url):
    """On a real redis-server: a fakeredis server answers each connection in a thread of its own, so
    Celery's result consumer (SUBSCRIBE on one connection, then GET on another, no later re-read)
    missed an answer stored between the two about one run in three."""
    import redis as redis_lib

    from producer.testing import FakeWorker

    with FakeWorker(redis_lib.Redis.from_url(redis_url)) as worker:
        _run_scripts(redis_url)
    assert worker.requests > 0  # the examples' requests were answered by it


def _run_scripts(url: str) -> None:
    for code in examples("script"):
        # REDIS_URL for the examples that name the workers' Redis; the literal default URL for those
        # written as a reader types them
        namespace = {"REDIS_URL": url}
        exec(compile(code.replace(DEFAULT_REDIS_URL, url), "docs", "exec"), namespace)
        app = namespace.get("app")
        namespace.clear()
        gc.collect()  # a Celery AsyncResult's __del__ talks to Redis: let it run while the server is up
        if app is not None:
            app.close()


@pytest.mark.integration  # a worker process
def test_the_quickstart_runs_as_written(redis_url, demo_dir, tmp_path):
    """In a directory laid out as a checkout after `make install` and `vela2 init-demo` (.venv: the
    environment running these tests; .cache/vela2-demo: the tests' demo checkpoint), the worker
    command runs as written on the test's redis-server (VELA2_REDIS_URL, which the worker reads when
    no --redis is given); the request, its literal URL made the same server's, prints what the page
    shows."""
    [command], [request] = examples("quickstart-worker"), examples("quickstart-request")
    [shown] = examples("quickstart-output")
    venv = Path(sys.prefix)
    assert (venv / "bin" / "vela2").exists(), f"{venv} has no vela2 script: install the project (make install)"
    (tmp_path / ".venv").symlink_to(venv)
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "vela2-demo").symlink_to(demo_dir)
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["bash", "-c", "exec " + command.strip()], cwd=tmp_path, stdout=log,
                                stderr=subprocess.STDOUT, env=child_env({"VELA2_REDIS_URL": redis_url}),
                                preexec_fn=die_with_parent)
    worker = WorkerProcess("quickstart", proc, log_path)
    printed = io.StringIO()
    try:
        worker.wait_ready()
        with contextlib.redirect_stdout(printed):
            exec(compile(request.replace(DEFAULT_REDIS_URL, redis_url), "README.md", "exec"), {})
    finally:
        exit_code = worker.terminate()
    assert printed.getvalue() == shown, worker.log()[-2000:]
    assert exit_code == 0, worker.log()[-4000:]  # a warm stop
