"""The README's examples run as tests (tests/unit/test_readme.py finds them): the `pytest` blocks in a
pytest subprocess with the plugin loaded by its entry point, once on fakeredis and once on a real
redis-server; the `script` blocks as they are, answered by a FakeWorker."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from stack.harness import child_env
from tests.unit.test_readme import examples

ROOT = Path(__file__).resolve().parents[2]


def _run_pytest_examples(tmp_path: Path, *args: str) -> None:
    blocks = examples("pytest")
    for i, code in enumerate(blocks):
        (tmp_path / f"test_readme_example_{i}.py").write_text(code, encoding="utf-8")
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
        namespace = {"REDIS_URL": url}
        exec(compile(code, "README.md", "exec"), namespace)
        app = namespace.get("app")
        namespace.clear()
        gc.collect()  # a Celery AsyncResult's __del__ talks to Redis: let it run while the server is up
        if app is not None:
            app.close()


