"""The pytest plugin of vela2 (entry point `pytest11`: loaded by pytest wherever vela2 is installed).

Fixtures, each fresh per test:

- ``vela2_redis``: a `Vela2Redis`: a fakeredis server (in this process, also served on a loopback
  TCP port for code that needs a URL: the HTTP route, Celery) and its clients; or, with
  ``--vela2-redis-url URL`` (or ``$VELA2_TEST_REDIS_URL``), that Redis, flushed (FLUSHDB of the
  URL's database) before and after each test.
- ``vela2_client``: a `producer.Client` on it, for the model `--vela2-model` (default vela2-demo).
- ``vela2_async_client``: a `producer.AsyncClient` on it (use it inside one event loop).
- ``vela2_fake_worker``: a `producer.testing.FakeWorker` on it, answering in a thread. Configure
  it per test with the marker ``@pytest.mark.vela2(answer=..., thread=False, ...)``: every keyword
  but `thread` goes to FakeWorker; ``thread=False`` leaves the thread off (call `drain()`).

The fixtures need fakeredis with Lua (the `testing` extra); a missing one fails the
test with that line. Assertions: `producer.testing.assert_ok`.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

ENV_REDIS_URL = "VELA2_TEST_REDIS_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vela2", "vela2 fixtures (producer.testing.pytest_plugin)")
    group.addoption("--vela2-redis-url", default=None,
                    help=f"run the vela2_* fixtures on this Redis instead of fakeredis (default ${ENV_REDIS_URL}); "
                    "its database is flushed before and after each test")
    group.addoption("--vela2-model", default=None, help="the model name of the vela2_* fixtures (default vela2-demo)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vela2(**kw): keyword arguments of the vela2_fake_worker fixture's "
                            "FakeWorker (answer=, result_expires_s=, online_result_expires_s=, ...; "
                            "thread=False: no thread, call drain())")


def _fakeredis() -> Any:
    try:
        import fakeredis
        import lupa  # noqa: F401  (fakeredis runs Lua scripts with it)
    except ImportError as e:
        missing = str(e)
    else:
        return fakeredis
    from producer.testing.fake_worker import TESTING_EXTRA

    pytest.fail(f"the vela2 fixtures need fakeredis with Lua support: {TESTING_EXTRA} ({missing})", pytrace=False)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Vela2Redis:
    """One test's Redis: a fakeredis server (`server`), or a real one under `--vela2-redis-url`.

    `client()` / `async_client()` make clients of it (in-process fakeredis clients, or redis-py
    clients of the URL), closed after the test. `url` serves it over TCP on loopback for code that
    only takes a URL (the HTTP route's `create_app`, a Celery app): the fakeredis TCP server starts
    on the first read of `url`.
    """

    def __init__(self, real_url: str | None = None):
        self.real_url = real_url
        self.server: Any = None  # the fakeredis.FakeServer (None on a real Redis)
        self._tcp: Any = None
        self._url: str | None = real_url
        self._clients: list[Any] = []
        if real_url is None:
            self._fake = _fakeredis()
            self.server = self._fake.FakeServer()

    @property
    def url(self) -> str:
        """A redis:// URL of this Redis (the fakeredis one is served on a free loopback port)."""
        if self._url is None:
            self._tcp = self._fake.TcpFakeServer(("127.0.0.1", _free_port()), server_type="redis")
            self._tcp.fake_server = self.server  # the same data as the in-process clients
            self._tcp.daemon_threads = True  # a connection left open never holds up the teardown
            self._tcp.block_on_close = False
            threading.Thread(target=self._tcp.serve_forever, kwargs={"poll_interval": 0.05},
                             name="vela2-fakeredis-tcp", daemon=True).start()
            self._url = f"redis://127.0.0.1:{self._tcp.server_address[1]}/0"
        return self._url

    def client(self) -> Any:
        """A synchronous Redis client of it (closed after the test)."""
        if self.real_url is None:
            c = self._fake.FakeRedis(server=self.server)
        else:
            import redis

            c = redis.Redis.from_url(self.real_url)
        self._clients.append(c)
        return c

    def async_client(self) -> Any:
        """An asyncio Redis client of it; use it in one event loop."""
        if self.real_url is None:
            return self._fake.FakeAsyncRedis(server=self.server)
        import redis.asyncio

        return redis.asyncio.Redis.from_url(self.real_url)

    def flush(self) -> None:
        """Empty it (FLUSHDB of the URL's database on a real Redis)."""
        c = self.client()
        c.flushdb()

    def close(self) -> None:
        """Close its clients and stop the TCP server (if it was started)."""
        if self.real_url is not None:
            self.flush()
        for c in self._clients:
            c.close()
        if self._tcp is not None:
            self._tcp.shutdown()
            self._tcp.server_close()


def _model(config: pytest.Config) -> str:
    from producer.client import DEFAULT_MODEL

    return str(config.getoption("vela2_model") or DEFAULT_MODEL)


@pytest.fixture
def vela2_redis(request: pytest.FixtureRequest) -> Iterator[Vela2Redis]:
    """A fresh fakeredis for this test (or the `--vela2-redis-url` Redis, flushed); see Vela2Redis."""
    url = request.config.getoption("vela2_redis_url") or os.environ.get(ENV_REDIS_URL) or None
    r = Vela2Redis(url)
    if url is not None:
        r.flush()
    yield r
    r.close()


@pytest.fixture
def vela2_client(vela2_redis: Vela2Redis, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A producer.Client on this test's Redis, for the model `--vela2-model` (default vela2-demo)."""
    from producer.client import Client

    with Client(redis=vela2_redis.client(), model=_model(request.config)) as client:
        yield client


@pytest.fixture
def vela2_async_client(vela2_redis: Vela2Redis, request: pytest.FixtureRequest) -> Any:
    """A producer.AsyncClient on this test's Redis (its connections open in the loop that first uses
    it: use it in one event loop; `await client.aclose()` there when done with a real Redis)."""
    from producer.aio import AsyncClient

    return AsyncClient(redis=vela2_redis.async_client(), model=_model(request.config))


@pytest.fixture
def vela2_fake_worker(vela2_redis: Vela2Redis, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A producer.testing.FakeWorker on this test's Redis, answering from a thread (marker
    ``@pytest.mark.vela2(thread=False, answer=..., ...)`` configures it); stopped after the test."""
    from producer.testing import FakeWorker

    marker = request.node.get_closest_marker("vela2")
    kw: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    thread = kw.pop("thread", True)
    kw.setdefault("model", _model(request.config))
    worker = FakeWorker(vela2_redis.client(), **kw)
    if thread:
        worker.start()
    yield worker
    worker.stop()
