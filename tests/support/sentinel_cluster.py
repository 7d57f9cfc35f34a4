"""A Redis Sentinel deployment on free loopback ports, for the tests (test-only code): a master
(`redis-server`), a replica (`redis-server --replicaof`) and one or three sentinels
(`redis-server sentinel.conf --sentinel`), each started by stack.harness's redis-server lookup.

    cluster = SentinelCluster(tmp_path, sentinels=3).start()   # polled until the sentinels see the
    url = cluster.url()                                         # master, each other and the replica
    old = cluster.kill_master()                                 # SIGKILL, no restart
    new = cluster.wait_failover(old, timeout_s=20)              # the replica promoted

Every wait polls against a deadline and names what it waited for when the deadline passes.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from stack.harness import RedisServer, die_with_parent, find_redis_server, free_port, wait_for_redis

MASTER_NAME = "vela2"


def _poll(what: str, check: Any, timeout_s: float, interval_s: float = 0.1) -> Any:
    """check() until it returns something truthy (returned); RuntimeError naming `what` after timeout_s.
    Redis errors inside check() count as "not yet"."""
    import redis

    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            got = check()
            if got:
                return got
            last = got
        except redis.RedisError as e:
            last = e
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:g} s (last: {last!r})")
        time.sleep(interval_s)


class Sentinel:
    """One `redis-server --sentinel` process monitoring MASTER_NAME."""

    def __init__(self, workdir: Path, master_port: int, quorum: int, down_after_ms: int, failover_timeout_ms: int,
                 password: str | None = None):
        found = find_redis_server()
        if found is None:
            raise RuntimeError("no redis-server (apt-get install redis-server)")
        self.exe, self._env = found
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.conf = workdir / "sentinel.conf"  # sentinel rewrites its config file: one per sentinel
        self._settings = [
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {quorum}",
            f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}",
            f"sentinel failover-timeout {MASTER_NAME} {failover_timeout_ms}",
            f"sentinel parallel-syncs {MASTER_NAME} 1",
            # the sentinel's own password, which it also presents to the other sentinels
            *([f"requirepass {password}", f"sentinel sentinel-pass {password}"] if password else [])]
        self.password = password
        self.port = 0  # chosen at start, once the servers it monitors listen (free_port only finds a free one)
        self.proc: subprocess.Popen | None = None

    def start(self) -> Sentinel:
        self.port = free_port()
        self.conf.write_text("\n".join([f"port {self.port}", "bind 127.0.0.1", f"dir {self.workdir}",
                                        *self._settings, ""]))
        with open(self.workdir / "sentinel.log", "ab") as out:
            self.proc = subprocess.Popen([self.exe, str(self.conf), "--sentinel"], env=self._env, stdout=out,
                                         stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        wait_for_redis(f"redis://{f':{self.password}@' if self.password else ''}127.0.0.1:{self.port}", 20, self.proc)
        return self

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=2,
                           decode_responses=True)

    def master_addr(self) -> tuple[str, int] | None:
        with self.client() as c:
            got = c.execute_command("SENTINEL", "get-master-addr-by-name", MASTER_NAME)
        return (got[0], int(got[1])) if got else None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class SentinelCluster:
    """A master, a replica and `sentinels` sentinels (quorum: a majority of them) on loopback."""

    def __init__(self, workdir: Path, *, sentinels: int = 1, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 3000, redis_args: tuple[str, ...] = ("--repl-diskless-sync-delay", "0"),
                 sentinel_password: str | None = None):
        self.workdir = Path(workdir)
        self.master = RedisServer(self.workdir / "master", extra_args=redis_args)
        self.replica = RedisServer(self.workdir / "replica", extra_args=(
            *redis_args, "--replicaof", "127.0.0.1", str(self.master.port)))
        self.sentinels = [Sentinel(self.workdir / f"sentinel{i}", self.master.port, sentinels // 2 + 1,
                                   down_after_ms, failover_timeout_ms, sentinel_password) for i in range(sentinels)]
        self.sentinel_password = sentinel_password
        self.servers = {self.master.port: self.master, self.replica.port: self.replica}

    def url(self, db: int = 0, password: str | None = None) -> str:
        """The sentinel:// URL naming every sentinel and the master (vela2.wire.urls's form)."""
        auth = f":{password}@" if password else ""
        hosts = [f"sentinel://{auth}127.0.0.1:{s.port}/{db}" for s in self.sentinels]
        spw = f"&sentinel_password={self.sentinel_password}" if self.sentinel_password else ""
        return ";".join(hosts) + f"?master_name={MASTER_NAME}{spw}"

    def start(self, timeout_s: float = 30.0) -> SentinelCluster:
        """Start everything; return once the replica is in sync and every sentinel sees the master,
        the replica and the other sentinels."""
        self.master.start()
        self.replica.start()
        _poll("the replica in sync with the master", self._replica_synced, timeout_s)
        for s in self.sentinels:
            s.start()
        _poll("every sentinel seeing the master, the replica and the other sentinels", self._sentinels_ready,
              timeout_s)
        return self

    def _replica_synced(self) -> bool:
        info = self.replica.client().info("replication")
        return info.get("master_link_status") == "up" and self.master.client().info("replication").get(
            "connected_slaves") == 1

    def _sentinels_ready(self) -> bool:
        for s in self.sentinels:
            with s.client() as c:
                if s.master_addr() != ("127.0.0.1", self.master.port):
                    return False
                replicas = c.execute_command("SENTINEL", "replicas", MASTER_NAME)
                if not any(_fields(r).get("port") == str(self.replica.port) and
                           "s_down" not in _fields(r).get("flags", "") for r in replicas):
                    return False
                if len(c.execute_command("SENTINEL", "sentinels", MASTER_NAME)) != len(self.sentinels) - 1:
                    return False
        return True

    def master_port(self) -> int:
        """The port of the master the first live sentinel names."""
        for s in self.sentinels:
            if s.proc is not None and s.proc.poll() is None:
                addr = s.master_addr()
                if addr:
                    return addr[1]
        raise RuntimeError("no sentinel names a master")

    def kill_master(self) -> int:
        """SIGKILL the current master (no restart, no AOF flush); returns its port."""
        port = self.master_port()
        server = self.servers[port]
        assert server.proc is not None
        server.proc.kill()
        server.proc.wait()
        return port

    def replica_port(self) -> int:
        """The port of the server that is not the master now."""
        master = self.master_port()
        return next(port for port in self.servers if port != master)

    def partition_replica(self) -> int:
        """Freeze the replica (SIGSTOP) and have the master drop its link (CLIENT KILL TYPE replica),
        so the master goes on acknowledging writes that no replica receives (the frozen replica cannot
        reconnect; what the master sent before the kill is in its socket); returns its port (thaw it
        with `thaw`)."""
        port = self.replica_port()
        server = self.servers[port]
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        self.servers[self.master_port()].client().client_kill_filter(_type="replica")
        return port

    def thaw(self, port: int) -> None:
        """SIGCONT a server `partition_replica` froze."""
        proc = self.servers[port].proc
        assert proc is not None
        proc.send_signal(signal.SIGCONT)

    def restart(self, port: int) -> None:
        """Restart the killed server at `port` (with the data it last synced, if any); the sentinels
        make it a replica of the current master (`wait_rejoined`). Call it from the main thread: a
        server dies with the thread that started it (PR_SET_PDEATHSIG)."""
        self.servers[port].start()

    def wait_rejoined(self, port: int, timeout_s: float = 30.0) -> None:
        """Poll until the restarted server at `port` is a replica of the current master, in sync, and
        every sentinel lists it."""
        def joined() -> bool:
            info = self.servers[port].client().info("replication")
            master = self.master_port()
            if info.get("role") != "slave" or info.get("master_port") != master or info.get(
                    "master_link_status") != "up":
                return False
            for s in self.sentinels:
                with s.client() as c:
                    if not any(_fields(r).get("port") == str(port) and "s_down" not in _fields(r).get("flags", "")
                               for r in c.execute_command("SENTINEL", "replicas", MASTER_NAME)):
                        return False
            return True

        _poll(f"the server at port {port} rejoined as a replica", joined, timeout_s, 0.2)

    def wait_failover(self, old_port: int, timeout_s: float = 30.0) -> int:
        """Poll until every sentinel names a master other than `old_port` and it answers as a master;
        returns its port."""
        def promoted() -> int | None:
            ports = {s.master_addr() for s in self.sentinels}
            if len(ports) != 1:
                return None
            (addr,) = ports
            if addr is None or addr[1] == old_port:
                return None
            role = self.servers[addr[1]].client().info("replication").get("role")
            return addr[1] if role == "master" else None

        return int(_poll(f"a failover away from port {old_port}", promoted, timeout_s))

    def stop(self) -> None:
        for s in self.sentinels:
            s.stop()
        self.replica.stop()
        self.master.stop()


def _fields(reply: Any) -> dict[str, str]:
    """A SENTINEL replicas entry (a flat list, or a dict with RESP3) as a dict."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}
