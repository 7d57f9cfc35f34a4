"""Fixtures of the producer tests: a fast fake worker (a thread), a real worker process on the demo
checkpoint, and a real `vela2 http` server process.

The fake worker BRPOPs the model's queues, decodes messages with the real decoder
(vela2.wire.messages.decode_delivery) and writes results with the real result writer
(vela2.wire.results.ResultStore, write-once + PUBLISH, submitted marker -> "answered"), so clients
and backfill see exactly what a worker would leave in Redis, thousands of rows a second. Like the
real worker it rides out a Redis restart: a failed BRPOP is retried, and the results of a message
it holds are written once Redis is back (nothing it popped is lost).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_lib

from stack.harness import ROOT, WorkerProcess, child_env, free_port
from vela2.schemas import Answer, RowResult, Status, expired_result
from vela2.systemone import is_system_one
from vela2.wire import keys
from vela2.wire.messages import decode_delivery, decode_envelope, message_id, request_digest
from vela2.wire.results import ResultStore, row_meta

MODEL = "vela2-demo"
WORKER_SETTINGS = {"max_batch_tokens": 2048, "max_wait_ms": 10, "render_threads": 1, "shutdown_timeout_s": 30}


def fake_answer(obj: dict[str, Any], rid: str) -> tuple[RowResult, dict[str, Any] | None]:
    """A well-formed ok result for a row (and the SystemOne answer for a SystemOne request)."""
    if is_system_one(obj):
        tasks = {t["name"]: {"kind": t["kind"], "probs": {}} for t in obj["tasks"]}
        row = RowResult(id=rid, task="set:fake", status=Status.ok, answers=[])
        return row, {"version": "1", "model": obj["model"], "id": rid, "status": "ok", "tasks": tasks}
    answers = [Answer(question=0, task=obj.get("task", "choice:x"), probs={"yes": 0.5, "no": 0.5}, decision="yes")]
    return RowResult(id=rid, task=obj.get("task"), status=Status.ok, answers=answers), None


class FakeWorker:
    """A thread that answers every message on the model's queues (online first)."""

    def __init__(self, redis_url: str, model: str = MODEL, *, delay_s: float = 0.0, result_ttl_s: int | None = None):
        self.redis = redis_lib.Redis.from_url(redis_url)
        self.store = ResultStore(self.redis) if result_ttl_s is None else ResultStore(self.redis, ttl_s=result_ttl_s)
        self.queues = keys.queues(model)
        self.delay_s = delay_s  # per message, before its results are written
        self.go = threading.Event()  # cleared: the worker takes nothing (the queue fills up)
        self.go.set()
        self.held = 0  # rows popped, not yet answered
        self.lock = threading.Lock()  # held while popping and while storing: queue + held is exact under it
        self.rows = 0
        self.messages = 0
        self.max_chunk = 0
        self.redis_errors = 0  # Redis calls that failed (a restart) and were retried
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-worker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.go.wait(0.05):
                continue
            try:
                with self.lock:
                    item = self.redis.brpop(self.queues, timeout=0.05)
                    if item is not None:
                        env = decode_envelope(item[1])
                        got = decode_delivery(message_id(env.headers) or "", env.headers, env.body, env.content_type)
                        self.held = len(got.requests)
            except redis_lib.exceptions.ConnectionError:  # Redis restarting (BusyLoadingError included)
                self.redis_errors += 1
                self._stop.wait(0.05)
                continue
            if item is None:
                continue
            self.max_chunk = max(self.max_chunk, len(got.requests))
            if self.delay_s:
                time.sleep(self.delay_s)
            writes = []
            for rid, obj in got.requests:
                if got.expires is not None and datetime.now(UTC) >= got.expires:
                    res, answer = expired_result(rid, obj.get("task"), "deadline passed"), None
                    if is_system_one(obj):
                        answer = {"version": "1", "model": obj["model"], "id": rid, "status": "expired"}
                else:
                    res, answer = fake_answer(obj, rid)
                writes.append((rid, row_meta(rid, res, answer, request_digest(obj))))  # as the worker stores
            while not self._stop.is_set():
                try:
                    with self.lock:
                        self.store.store(writes)
                        self.held = 0
                    break
                except redis_lib.exceptions.ConnectionError:
                    self.redis_errors += 1
                    self._stop.wait(0.05)
            self.rows += len(writes)
            self.messages += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.redis.close()


@pytest.fixture
def fake_worker(redis_url: str) -> Iterator[Callable[..., FakeWorker]]:
    """fake_worker(**kw) -> a running FakeWorker on the test's Redis, or on `url=` (stopped after
    the test)."""
    started: list[FakeWorker] = []

    def start(url: str | None = None, **kw: Any) -> FakeWorker:
        w = FakeWorker(url or redis_url, **kw)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.fixture
def real_worker(tmp_path: Path, demo_dir: Path) -> Iterator[Callable[[str], WorkerProcess]]:
    """real_worker(redis_url) -> a ready `celery -A worker.app worker` process on the demo checkpoint."""
    started: list[WorkerProcess] = []

    def start(redis_url: str) -> WorkerProcess:
        w = WorkerProcess.start(redis_url, demo_dir, tmp_path / f"worker{len(started)}.log", **WORKER_SETTINGS)
        started.append(w)
        return w.wait_ready()

    yield start
    WorkerProcess.stop_all(started, 30)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """http_server(redis_url, *args) -> base URL of a running `python -m producer.http` process
    (on loopback with --no-auth unless `args` name API keys)."""
    procs: list[subprocess.Popen] = []

    def start(redis_url: str, *args: str) -> str:
        port = free_port()
        log_path = tmp_path / f"http{len(procs)}.log"
        cmd = [sys.executable, "-m", "producer.http", "--redis", redis_url, "--port", str(port), "--model", MODEL]
        if "--api-keys-file" not in args:
            cmd.append("--no-auth")
        with open(log_path, "wb") as out:
            proc = subprocess.Popen([*cmd, *args], env=child_env(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/openapi.json", timeout=1)
                return base
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the http server did not start:\n{log_path.read_text()[-3000:]}") from None
                time.sleep(0.05)

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
