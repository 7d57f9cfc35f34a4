"""Fixtures shared by every test package: real redis-server processes on free loopback ports (the
process harness, stack.harness), and the demo checkpoint (written once per session) with its model.

`redis_server_factory()` starts a fresh `redis-server` (no persistence) in a temporary directory;
every server is stopped at the end of the session. `redis_server` is the one shared server and
`redis_url` hands it to a test, FLUSHALL before and after. Without a redis-server binary the
integration tests fail when CI is set (CI must run them) and are skipped elsewhere.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# The test folders tests/vela2, tests/worker and tests/producer carry no __init__.py, so with pytest's
# default import mode they would shadow the real packages as namespace packages whenever the repo
# root is not on sys.path (plain `pytest` with an editable install). Put the root first and import
# the real packages before any test module is collected.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
import pytest  # noqa: E402

import producer  # noqa: E402,F401
import vela2  # noqa: E402,F401
import worker  # noqa: E402,F401
from stack.harness import RabbitVhost, RedisServer, find_redis_server  # noqa: E402
from tests.sentinel_cluster import SentinelCluster  # noqa: E402

# A test that uses one of these fixtures starts a process (redis-server, a worker, an HTTP server):
# it is marked `integration`, so `pytest -m "not integration"` is the fast loop.
PROCESS_FIXTURES = {"redis_server", "redis_url", "redis_server_factory", "start_worker", "real_worker",
                    "http_server", "fake_worker", "amqp_url", "sentinel_cluster_factory"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
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
    """A factory of Redis Sentinel deployments (tests/sentinel_cluster.py: a master, a replica and
    `sentinels=` sentinels on free loopback ports, started and in sync), stopped after the test."""
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
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo checkpoint directory, written (trained: minutes) once per session by `vela2.init_demo`.

    VELA2_TEST_DEMO_DIR=DIR copies a checkpoint `vela2 init-demo` already wrote instead (the inner
    loop; CI never sets it): it must come from the code under test, or the demo's tests measure an
    older model."""
    path = tmp_path_factory.mktemp("demo") / "ckpt"
    if given := os.environ.get("VELA2_TEST_DEMO_DIR"):
        import shutil

        return Path(shutil.copytree(given, path))
    return vela2.init_demo(path)


@pytest.fixture(scope="session")
def untrained_demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model before training (seeded random weights) as a checkpoint: what the tests of
    `vela2 train` start from."""
    from vela2.model.checkpoint import save
    from vela2.train.demo_model import untrained_demo_model

    path = tmp_path_factory.mktemp("demo-untrained") / "ckpt"
    save(untrained_demo_model(), path)
    return path


@pytest.fixture(scope="session")
def demo_model(demo_dir: Path):
    """The demo model held in float32 (runs precision fp32 and bf16). Tests must not mutate it (a test
    that swaps its calibration restores it)."""
    import torch

    return vela2.load(demo_dir, dtype=torch.float32)


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
