"""The process harness: redis-server and worker processes on loopback, for the demo, parity, the
tests, the benchmarks and the fault suite (one implementation for all of them).

    with RedisServer(workdir, aof=True) as redis:           # a fresh redis-server on a free port
        w = WorkerProcess.start(redis.url(), checkpoint, workdir / "w1.log", max_wait_ms=10)
        w.wait_ready()
        ...
        w.terminate()                                        # warm shutdown; w.engine_stats() reads
                                                             # the engine's JSON stats line
A worker is `python -m celery -A worker.app worker` (the plain Celery start path) configured only
by VELA2_* variables (named by worker.settings); redis-server comes from PATH, else from where
shared/device/setup.sh unpacks it on the GPU machine. Children die with the process that started
them (PR_SET_PDEATHSIG), so a killed test or bench leaves nothing behind. No celery, no torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stack.faults import Faults
from worker.engine.stats import STATS_LOG_PREFIX
from worker.settings import to_env

ROOT = Path(__file__).resolve().parents[1]  # the checkout (children get it first on PYTHONPATH)
FALLBACK_REDIS = Path("/tmp/redis/usr/bin/redis-server")  # where shared/device/setup.sh unpacks it
FALLBACK_REDIS_LIBS = "/tmp/redis/usr/lib/x86_64-linux-gnu"
READY_TIMEOUT_S = 300.0  # import + model load + warm-up batches (a 9B model, or a busy 2-core CPU)
READY_LOG_MARK = " ready."  # what Celery logs once the consumer runs (after our engine started)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent() -> None:
    """(preexec_fn, Linux) SIGTERM this child when its parent dies."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def find_redis_server() -> tuple[str, dict[str, str]] | None:
    """(redis-server executable, environment to run it in), or None when there is none."""
    exe = shutil.which("redis-server")
    env = dict(os.environ)
    if exe:
        return exe, env
    if FALLBACK_REDIS.is_file():
        env["LD_LIBRARY_PATH"] = f"{FALLBACK_REDIS_LIBS}:{env.get('LD_LIBRARY_PATH', '')}".rstrip(":")
        return str(FALLBACK_REDIS), env
    return None


def wait_for_redis(url: str, timeout_s: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    """Poll PING until Redis at `url` answers; RuntimeError after `timeout_s` or if `proc` exits."""
    import redis

    deadline = time.monotonic() + timeout_s
    while True:
        client = redis.Redis.from_url(url, socket_timeout=1)
        try:
            client.ping()
            return
        except (redis.AuthenticationError, redis.exceptions.NoPermissionError):
            return  # it answers (and wants a password)
        except redis.ResponseError as e:
            if "NOAUTH" in str(e):
                return
            raise
        except redis.RedisError:
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError(f"redis at {url} did not answer within {timeout_s:g} s") from None
            time.sleep(0.05)
        finally:
            client.close()


RABBITMQ_HOST_PORT = ("127.0.0.1", 5672)
DEFAULT_RABBITMQ = f"amqp://guest:guest@{RABBITMQ_HOST_PORT[0]}:{RABBITMQ_HOST_PORT[1]}"


class RabbitVhost:
    """A throwaway vhost on the local RabbitMQ (guest/guest), made and deleted with `rabbitmqctl`
    (root), so a test session or a fault suite run never meets another's queues."""

    def __init__(self, name: str, server: str = DEFAULT_RABBITMQ):
        self.name = name
        self.url = f"{server.rstrip('/')}/{name}"  # server: amqp://user:pw@host:port of the local RabbitMQ

    @staticmethod
    def unavailable() -> str | None:
        """Why no vhost can be made here (nothing on 127.0.0.1:5672, no rabbitmqctl), or None."""
        if shutil.which("rabbitmqctl") is None:
            return "rabbitmqctl is not installed (apt-get install rabbitmq-server); the AMQP tests need it"
        try:
            socket.create_connection(RABBITMQ_HOST_PORT, timeout=2).close()
        except OSError as e:
            return f"no RabbitMQ answers on {RABBITMQ_HOST_PORT[0]}:{RABBITMQ_HOST_PORT[1]} ({e}); .ci/run starts one"
        return None

    @classmethod
    def create(cls, server: str = DEFAULT_RABBITMQ) -> RabbitVhost:
        """A new vhost named vela2-<pid>-<n> on `server` (this host's RabbitMQ, amqp://user:pw@host:port),
        its user given every permission on it."""
        import uuid
        from urllib.parse import urlsplit

        vhost = cls(f"vela2-{os.getpid()}-{uuid.uuid4().hex[:8]}", server)
        user = urlsplit(server).username or "guest"
        for args in (["add_vhost", vhost.name], ["set_permissions", "-p", vhost.name, user, ".*", ".*", ".*"]):
            subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=120)
        return vhost

    def queues(self) -> dict[str, dict[str, str]]:
        """Every queue of the vhost: name -> {type, messages_ready, messages_unacknowledged, consumers}
        (rabbitmqctl: seconds per call, not for a polling loop; a quorum queue's counts lag by its
        stats interval, so read them with `ready`)."""
        fields = ["name", "type", "messages_ready", "messages_unacknowledged", "consumers"]
        out = subprocess.run(["rabbitmqctl", "-q", "list_queues", "-p", self.name, "--no-table-headers", *fields],
                             check=True, capture_output=True, text=True, timeout=120).stdout
        rows = [line.split("\t") for line in out.splitlines() if line.strip()]
        return {r[0]: dict(zip(fields[1:], r[1:], strict=True)) for r in rows if len(r) == len(fields)}

    def ready(self, queue: str) -> int:
        """Messages ready (not delivered) in `queue`, by a passive declare (fast); 0 when it does not exist."""
        from kombu import Connection

        with Connection(self.url, connect_timeout=5) as conn:
            try:
                return int(conn.default_channel.queue_declare(queue, passive=True).message_count)
            except Exception as e:  # NOT_FOUND closes the channel: no such queue yet
                if "NOT_FOUND" in str(e):
                    return 0
                raise

    def delete_queues(self) -> None:
        """Delete every queue of the vhost (between tests)."""
        from kombu import Connection

        names = list(self.queues())
        with Connection(self.url, connect_timeout=5) as conn:
            for name in names:
                conn.default_channel.queue_delete(name)

    def drop_connections(self, why: str) -> None:
        """Close every client connection of this vhost from the broker's side (what clients see when
        RabbitMQ restarts; the server and its other vhosts keep running)."""
        subprocess.run(["rabbitmqctl", "-q", "close_all_connections", "--vhost", self.name, "--limit", "1000", why],
                       check=True, capture_output=True, timeout=120)

    def delete(self) -> None:
        """Delete the vhost and everything in it."""
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", self.name], capture_output=True, timeout=120)


class RedisServer:
    """A redis-server on 127.0.0.1 in its own directory. `stop()` then `start()` keeps port and
    data (with `aof`, the append-only file, fsync every second, as production runs). Writes fail
    loudly when memory is full (noeviction), never evict."""

    def __init__(self, workdir: Path, *, aof: bool = False, port: int | None = None,
                 extra_args: Sequence[str] = ()):
        found = find_redis_server()
        if found is None:
            raise RuntimeError(f"no redis-server on PATH nor at {FALLBACK_REDIS} (apt-get install redis-server)")
        self.exe, self._env = found
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.aof = aof
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0, **kw: Any) -> Any:
        """A redis-py client of this server."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, db=db, **kw)

    def command(self) -> list[str]:
        persistence = ["--appendonly", "yes", "--appendfsync", "everysec"] if self.aof else ["--appendonly", "no"]
        return [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
                "--save", "", "--maxmemory-policy", "noeviction", *persistence, *self.extra_args]

    def start(self, timeout_s: float = 20.0) -> RedisServer:
        """Start (or restart) the server and wait until it answers."""
        with open(self.workdir / "redis.log", "ab") as out:
            self.proc = subprocess.Popen(self.command(), env=self._env, stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent)
        try:
            wait_for_redis(self.url(), timeout_s, self.proc)
        except RuntimeError:
            self.stop()
            raise
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM: redis-server fsyncs its AOF and exits (a graceful restart loses nothing)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def flushall(self) -> None:
        c = self.client()
        try:
            c.flushall()
        finally:
            c.close()

    def __enter__(self) -> RedisServer:
        return self if self.alive() else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def embedded_redis(workdir: Path) -> Iterator[tuple[str, str]]:
    """Yield (redis URL, what it is): a redis-server if one is installed, else fakeredis' TCP server
    in this process (the demo runs anywhere)."""
    if find_redis_server() is not None:
        with RedisServer(workdir) as server:
            yield server.url(), f"redis-server ({server.exe}) on port {server.port}"
        return
    from fakeredis import TcpFakeServer

    port = free_port()
    fake = TcpFakeServer(("127.0.0.1", port), server_type="redis")
    thread = threading.Thread(target=fake.serve_forever, name="fakeredis", daemon=True)
    thread.start()
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_for_redis(url)
        yield url, f"fakeredis TcpFakeServer (in-process) on port {port}"
    finally:
        fake.shutdown()
        fake.server_close()


def worker_command(hostname: str, faults: Faults | None = None) -> list[str]:
    """The command line of a worker process configured by VELA2_* variables (`celery -A worker.app`;
    with `faults`, `python -m stack.faults`, which runs the same worker with them injected)."""
    options = ["--loglevel", "INFO", "--without-mingle", "--without-gossip", "--without-heartbeat",
               "--hostname", hostname]
    if faults is not None:
        return [sys.executable, "-m", "stack.faults", *faults.argv(), "--", *options]
    return [sys.executable, "-m", "celery", "-A", "worker.app", "worker", *options]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: this one's without VELA2_* settings, this checkout first
    on PYTHONPATH, then `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VELA2_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def start_route(redis_url: str | None, model: str, log_path: Path, *args: str, before: str | None = None,
                timeout_s: float = 30.0) -> tuple[subprocess.Popen, str]:
    """A `python -m producer.http.app` process for `model` on a free loopback port (`args` added: keys,
    uploads, --cells...; `redis_url` None: no --redis; `before`: the route of another checkout, that
    directory first on sys.path) and its base URL once it answers; RuntimeError with the log's tail if
    it exits or does not answer first."""
    import httpx

    port = free_port()
    argv = [*(["--redis", redis_url] if redis_url is not None else []), "--port", str(port), "--model", model, *args]
    if before is None:
        cmd = [sys.executable, "-m", "producer.http.app", *argv]
    else:
        cmd = [sys.executable, "-c", f"import sys; sys.path.insert(0, {before!r}); from producer.http.app import main; "
               "sys.exit(main(sys.argv[1:]))", *argv]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, env=child_env(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(f"{base}/openapi.json", timeout=1)
            return proc, base
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the route did not start:\n{Path(log_path).read_text()[-3000:]}") from None
            time.sleep(0.05)


@dataclass
class WorkerProcess:
    """One worker subprocess and its log file."""

    name: str
    proc: subprocess.Popen
    log_path: Path
    metrics_port: int = 0
    started: float = field(default_factory=time.monotonic)
    ready_s: float | None = None  # start -> ready, once wait_ready() saw it
    exit_code: int | None = None

    @classmethod
    def start(cls, redis_url: str, checkpoint: str | Path | None, log_path: Path, *, name: str = "w",
              env: dict[str, str] | None = None, command: list[str] | None = None,
              faults: Faults | None = None, **settings: Any) -> WorkerProcess:
        """Start a worker with these settings (flat worker.settings names); `env` adds variables
        (OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES); `faults` injects faults (stack.faults: the worker
        runs under `python -m stack.faults`); `command` replaces `worker_command` (a profiled worker,
        say). Not yet ready: call wait_ready()."""
        values = {"redis_url": redis_url, "checkpoint": str(checkpoint) if checkpoint else None, **settings}
        environ = child_env({**to_env(values), **(env or {})})
        log_path = Path(log_path)
        with open(log_path, "wb") as out:  # the child keeps its own descriptor
            proc = subprocess.Popen(command or worker_command(f"{name}@%h", faults), env=environ, stdout=out,
                                    stderr=subprocess.STDOUT, cwd=ROOT, preexec_fn=die_with_parent)
        return cls(name, proc, log_path, int(settings.get("metrics_port") or 0))

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> WorkerProcess:
        """Block until the worker logs that it is ready; RuntimeError with its log tail if it exits
        first or takes longer than `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if READY_LOG_MARK in self.log():
                self.ready_s = time.monotonic() - self.started
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"worker {self.name} not ready after {timeout_s:.0f} s:\n{self.log()[-4000:]}")

    def wait_exit(self, timeout_s: float = 90.0) -> int:
        """Wait for the process to exit; SIGKILL it past `timeout_s`. Returns the exit code."""
        try:
            self.exit_code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.exit_code = self.proc.wait()
        return self.exit_code

    def terminate(self, timeout_s: float = 90.0) -> int:
        """Warm shutdown (SIGTERM); returns the exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout_s)

    def kill(self) -> int:
        """SIGKILL: nothing is finished, acked or returned."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.exit_code = self.proc.wait(30)
        return self.exit_code

    def rss_mb(self) -> float | None:
        """Resident memory of the worker process (from /proc)."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def engine_stats(self) -> dict[str, Any] | None:
        """The engine's counts from its last JSON stats line (None when it never stopped warmly)."""
        found = [line.split(STATS_LOG_PREFIX, 1)[1] for line in self.log().splitlines() if STATS_LOG_PREFIX in line]
        return json.loads(found[-1]) if found else None

    @staticmethod
    def stop_all(workers: Sequence[WorkerProcess], timeout_s: float = 90.0) -> list[int]:
        """Warm shutdown of every worker at once (SIGTERM to all, then wait; SIGKILL past the timeout)."""
        for w in workers:
            if w.alive():
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        return [w.wait_exit(max(0.1, deadline - time.monotonic())) for w in workers]
