"""Fixtures of the integration tests (every test here is marked `integration`): real redis-server
processes on free loopback ports (stack.harness), Redis Sentinel deployments, a throwaway RabbitMQ
vhost, worker processes on the demo checkpoint (`python -m celery -A worker.app worker`, the plain
Celery start path, configured through VELA2_* variables only; `faults=` runs it under
stack.faults), the shipped fake worker in a thread, and `vela2 http` server processes.

Without a redis-server binary (or a RabbitMQ) the tests that need it fail when CI is set (CI must
run them) and are skipped elsewhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from producer.testing import FakeWorker
from stack.harness import RabbitVhost, RedisServer, WorkerProcess, find_redis_server, start_route
from tests.support.sentinel_cluster import SentinelCluster

HERE = Path(__file__).resolve().parent
MODEL = "vela2-demo"
# Small, fast worker settings for the tiny demo model on CPU.
WORKER_SETTINGS = {"max_batch_tokens": 2048, "max_wait_ms": 10, "render_threads": 1, "shutdown_timeout_s": 30}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


def _need_redis_server() -> None:
    if find_redis_server() is None:
        msg = "redis-server is not installed (apt-get install redis-server); integration tests need it"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def redis_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., RedisServer]]:
    """A factory of fresh redis-server processes (stack.harness.RedisServer, keyword arguments as
    there), stopped at the end of the session."""
    started: list[RedisServer] = []

    def start(**kw: object) -> RedisServer:
        _need_redis_server()
        server = RedisServer(tmp_path_factory.mktemp("redis"), **kw).start()  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def sentinel_cluster_factory(tmp_path: Path) -> Iterator[Callable[..., SentinelCluster]]:
    """A factory of Redis Sentinel deployments (tests/support/sentinel_cluster.py: a master, a replica
    and `sentinels=` sentinels on free loopback ports, started and in sync), stopped after the test."""
    started: list[SentinelCluster] = []

    def start(**kw: Any) -> SentinelCluster:
        _need_redis_server()
        cluster = SentinelCluster(tmp_path / f"sentinel-cluster{len(started)}", **kw)
        started.append(cluster)
        return cluster.start()

    yield start
    for cluster in started:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_server(redis_server_factory: Callable[[], RedisServer]) -> RedisServer:
    """The session's shared redis-server."""
    return redis_server_factory()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The shared redis-server's URL for one test, flushed before and after it."""
    redis_server.flushall()
    yield redis_server.url()
    redis_server.flushall()


@pytest.fixture(scope="session")
def rabbitmq_vhost() -> Iterator[RabbitVhost]:
    """A throwaway vhost on the RabbitMQ at 127.0.0.1:5672 (stack.harness.RabbitVhost), deleted at
    the end of the session. Without a RabbitMQ answering there the AMQP tests fail when CI is set
    (.ci/run starts one) and are skipped elsewhere."""
    problem = RabbitVhost.unavailable()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    vhost = RabbitVhost.create()
    yield vhost
    vhost.delete()


@pytest.fixture
def amqp_url(rabbitmq_vhost: RabbitVhost) -> Iterator[str]:
    """The session vhost's amqp:// URL for one test; the queues it leaves are deleted after it."""
    yield rabbitmq_vhost.url
    rabbitmq_vhost.delete_queues()


@pytest.fixture
def start_worker(tmp_path: Path, demo_dir: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """start_worker(redis_url, env={...}, faults=Faults(...), **settings) -> a started (not yet ready)
    WorkerProcess (killed after the test)."""
    started: list[WorkerProcess] = []
    numbers = count(1)

    def start(redis_url: str, *, env: dict[str, str] | None = None, **settings: object) -> WorkerProcess:
        name = f"w{next(numbers)}"
        w = WorkerProcess.start(redis_url, demo_dir, tmp_path / f"{name}.log", name=name, env=env,
                                **{**WORKER_SETTINGS, **settings})
        started.append(w)
        return w

    yield start
    for w in started:
        w.kill()


@pytest.fixture
def real_worker(start_worker: Callable[..., WorkerProcess]) -> Iterator[Callable[[str], WorkerProcess]]:
    """real_worker(redis_url) -> a ready worker process on the demo checkpoint, stopped warmly after."""
    started: list[WorkerProcess] = []

    def start(redis_url: str) -> WorkerProcess:
        w = start_worker(redis_url)
        started.append(w)
        return w.wait_ready()

    yield start
    WorkerProcess.stop_all(started, 30)


@pytest.fixture
def fake_worker(redis_url: str) -> Iterator[Callable[..., FakeWorker]]:
    """fake_worker(**kw) -> a FakeWorker answering from a thread on the test's Redis, or on `url=`
    (keywords as FakeWorker's; stopped after the test). It decodes messages with the real decoder
    and writes results with the real result writer, so clients and backfill see exactly what a
    worker would leave in Redis, thousands of rows a second."""
    started: list[FakeWorker] = []

    def start(url: str | None = None, **kw: Any) -> FakeWorker:
        w = FakeWorker(url or redis_url, model=kw.pop("model", MODEL), **kw).start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """http_server(redis_url, *args) -> base URL of a running `python -m producer.http.app` process
    (on loopback with --no-auth unless `args` name API keys; `redis_url` None with "--cells", F)."""
    procs: list[subprocess.Popen] = []

    def start(redis_url: str | None, *args: str) -> str:
        auth = () if "--api-keys-file" in args else ("--no-auth",)
        proc, base = start_route(redis_url, MODEL, tmp_path / f"http{len(procs)}.log", *auth, *args)
        procs.append(proc)
        return base

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

