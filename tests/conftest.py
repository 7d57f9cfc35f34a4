"""Fixtures shared by every test package: real redis-server processes on free loopback ports, and
the demo checkpoint (written once per session) with its model.

`redis_server_factory()` starts a fresh `redis-server` (no persistence) in a temporary directory;
every server is stopped at the end of the session. `redis_server` is the one shared server and
`redis_url` hands it to a test, FLUSHALL before and after. Without a redis-server binary the
integration tests fail when CI is set (CI must run them) and are skipped elsewhere.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# The test folders tests/vela2, tests/worker and tests/producer carry no __init__.py, so with pytest's
# default import mode they would shadow the real packages as namespace packages whenever the repo
# root is not on sys.path (plain `pytest` with an editable install). Put the root first and import
# the real packages before any test module is collected.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
import pytest  # noqa: E402
import redis  # noqa: E402

import producer  # noqa: E402,F401
import vela2  # noqa: E402,F401
import worker  # noqa: E402,F401
from worker.demo import redis_server_command  # noqa: E402


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    """A redis-server process started by the fixture."""

    port: int
    proc: subprocess.Popen
    workdir: Path

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, db=db)

    def flushall(self) -> None:
        c = self.client()
        try:
            c.flushall()
        finally:
            c.close()


def _need_redis_server() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        msg = "redis-server is not installed (apt-get install redis-server); integration tests need it"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


@pytest.fixture(scope="session")
def redis_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], RedisServer]]:
    """A factory of fresh redis-server processes (stopped at the end of the session)."""
    started: list[RedisServer] = []

    def start() -> RedisServer:
        exe = _need_redis_server()
        workdir = tmp_path_factory.mktemp("redis")
        port = free_port()
        proc = subprocess.Popen(
            redis_server_command(exe, port, workdir),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        server = RedisServer(port, proc, workdir)
        started.append(server)
        deadline = time.monotonic() + 10
        while True:
            c = server.client()
            try:
                c.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.05)
            finally:
                c.close()
        return server

    yield start
    for server in started:
        server.proc.terminate()
        try:
            server.proc.wait(10)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


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
    """The demo checkpoint directory, written once per session by `vela2.init_demo`."""

    return vela2.init_demo(tmp_path_factory.mktemp("demo") / "ckpt")


@pytest.fixture(scope="session")
def demo_model(demo_dir: Path):
    """The demo model held in float32 (runs precision fp32 and bf16); tests must not mutate it."""
    import torch

    return vela2.load(demo_dir, dtype=torch.float32)
