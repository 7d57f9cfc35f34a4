"""`vela2 demo`: the whole product on one machine, with nothing to set up.

An embedded Redis (redis-server on a free loopback port when installed, else an in-process
fakeredis TCP server), the demo checkpoint, one worker process (`celery -A worker.app worker`),
sample requests of every kind submitted through producer.Client (choice, score, set, PII span, a
bundled row, a long windowed row, a SystemOne request, a bulk chunk, a bad row), their answers
and per-request timings printed, then a warm shutdown of the worker and Redis.
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
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from producer.client import Client
from producer.messages import read_answers
from worker.app import ENV

WORKER_START_TIMEOUT_S = 120.0  # model load + warm-up batch on a slow CPU
ANSWER_TIMEOUT_S = 120.0


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_redis(url: str, timeout_s: float = 10.0) -> None:
    import redis

    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        finally:
            client.close()


def redis_server_command(exe: str, port: int, workdir: str | Path) -> list[str]:
    """A throwaway redis-server on a loopback port: no RDB snapshots, no AOF, files in `workdir`."""
    return [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(workdir)]


@contextlib.contextmanager
def embedded_redis(workdir: Path) -> Iterator[tuple[str, str]]:
    """Yield (redis URL, what it is): redis-server if installed, else fakeredis' TCP server."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    exe = shutil.which("redis-server")
    if exe:
        proc = subprocess.Popen(
            redis_server_command(exe, port, workdir),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for_redis(url)
            yield url, f"redis-server ({exe}) on port {port}"
        finally:
            proc.terminate()
            proc.wait(10)
        return
    from fakeredis import TcpFakeServer

    server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
    thread = threading.Thread(target=server.serve_forever, name="fakeredis", daemon=True)
    thread.start()
    try:
        _wait_for_redis(url)
        yield url, f"fakeredis TcpFakeServer (in-process) on port {port}"
    finally:
        server.shutdown()
        server.server_close()


def worker_command(hostname: str) -> list[str]:
    """The command line of a worker process configured by VELA2_* variables (`celery -A worker.app`)."""
    return [sys.executable, "-m", "celery", "-A", "worker.app", "worker", "--loglevel", "INFO",
            "--without-mingle", "--without-gossip", "--without-heartbeat", "--hostname", hostname]


def start_worker(redis_url: str, checkpoint: str | Path, log_path: Path, **settings: Any) -> subprocess.Popen:
    """Start `python -m celery -A worker.app worker` with VELA2_* settings; output to log_path."""
    env = dict(os.environ)
    env[ENV["redis_url"]] = redis_url
    env[ENV["checkpoint"]] = str(checkpoint)
    for name, value in settings.items():
        env[ENV[name]] = str(value)
    cmd = worker_command("vela2-demo@%h")
    with open(log_path, "wb") as log_file:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT)


def wait_until_ready(proc: subprocess.Popen, log_path: Path, timeout_s: float = WORKER_START_TIMEOUT_S) -> None:
    """Block until the worker logs that it is ready; RuntimeError (with its log) if it exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        if " ready." in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with code {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.1)
    raise RuntimeError(f"the worker was not ready after {timeout_s:.0f} s:\n{log_path.read_text()[-3000:]}")


def sample_requests(model_name: str) -> tuple[list[dict], dict, list[dict]]:
    """(online requests, a bad row, a bulk chunk of rows): every request type the product takes."""
    from vela2.demo import sample_rows

    rows = sample_rows()
    long_choice = {
        "id": "demo-long-choice",
        "task": "choice:oasst1",
        "text": rows[-1]["text"],
        "questions": [{"question": "Is the customer satisfied?", "options": ["yes", "no"]}],
    }
    system_one = {
        "model": model_name,
        "id": "demo-systemone",
        "input": {
            "user": "Hi, I am Carol Diaz, my email is carol@initech.com. Where is my refund?",
            "assistant": "Sorry Carol, the refund for order 4471 was sent on Monday.",
        },
        "tasks": [
            {
                "name": "intent",
                "kind": "choice",
                "question": "What does the user want?",
                "options": ["refund", "delivery", "other"],
            },
            {"name": "quality", "kind": "score", "options": ["1", "2", "3", "4", "5"]},
            {"name": "policy", "kind": "set", "options": ["violence", "self-harm", "privacy"]},
            {"name": "pii", "kind": "span", "labels": ["person", "email"], "fields": ["user"]},
            {"name": "topic", "kind": "classify", "labels": ["finance", "sports", "support"]},
            {"name": "ents", "kind": "extract", "labels": ["company"]},
        ],
    }
    bad = {"id": "demo-bad", "task": "choice:boolq", "text": "No options here.", "questions": [{"options": ["yes"]}]}
    chunk = [
        {"id": f"demo-bulk-{i}", "task": "choice:boolq", "text": text, "questions": [{"options": ["yes", "no"]}]}
        for i, text in enumerate(["The refund was sent.", "Nobody answered the phone.", "The team won the game."])
    ]
    return [*rows, long_choice, system_one], bad, chunk


def _describe(answer: dict[str, Any]) -> str:
    """A short human line for an answer (row result or SystemOne answer)."""
    if answer.get("status") != "ok":
        err = answer.get("error") or {}
        return f"{answer.get('status')}: {err.get('type')}: {err.get('message')}"
    parts = []
    items = (
        [(a.get("task"), a) for a in answer["answers"]]
        if "answers" in answer
        else [(name, a) for name, a in answer.get("tasks", {}).items()]
    )
    for name, a in items:
        if a.get("spans") is not None:
            spans = ", ".join(f"{s['label']}={s['text']!r}" for s in a["spans"][:6])
            more = f" (+{len(a['spans']) - 6})" if len(a["spans"]) > 6 else ""
            gate = " gate fired" if a.get("gate_fired") else ""
            parts.append(f"{name}: [{spans}{more}]{gate}")
        else:
            top = max(a["probs"].items(), key=lambda kv: kv[1])
            extra = f" expected={a['expected']:.2f}" if a.get("expected") is not None else ""
            parts.append(f"{name}: {json.dumps(a.get('decision'))} (top {top[0]} {top[1]:.2f}){extra}")
    return "; ".join(parts)


def _print_answers(ids: list[str], answers: dict[str, Any], seen_ms: dict[str, float]) -> None:
    print(f"{'request':<18} {'queue':>7} {'render':>7} {'model':>7} {'decode':>7} {'total':>8}  answer")
    for rid in ids:
        answer = answers.get(rid)
        if answer is None:
            print(f"{rid:<18} {'-':>7} {'-':>7} {'-':>7} {'-':>7} {'-':>8}  NO ANSWER")
            continue
        t = answer.get("timings") or {}
        cols = " ".join(
            f"{t[k]:7.1f}" if k in t else f"{'-':>7}" for k in ("queue_ms", "render_ms", "model_ms", "decode_ms")
        )
        print(f"{rid:<18} {cols} {seen_ms.get(rid, 0.0):8.1f}  {_describe(answer)}")
    print("(milliseconds; total = submit -> answer seen by the client)")


def _collect(client: Client, ids: list[str], t0: float, timeout_s: float) -> tuple[dict[str, Any], dict[str, float]]:
    """Poll answers (one MGET per poll) and note when each was first seen."""
    answers: dict[str, Any] = {}
    seen_ms: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(answers) < len(ids) and time.monotonic() < deadline:
        missing = [i for i in ids if i not in answers]
        for rid, answer in read_answers(client.redis, missing).items():
            if answer is not None:
                answers[rid] = answer
                seen_ms[rid] = (time.monotonic() - t0) * 1e3
        time.sleep(0.005)
    return answers, seen_ms


def run_demo(checkpoint: str | Path | None = None, *, max_batch_tokens: int = 4096, max_wait_ms: float = 10.0) -> int:
    """Run the demo; returns 0 when every request was answered and the worker shut down cleanly."""
    with tempfile.TemporaryDirectory(prefix="vela2-demo-") as tmp:
        work = Path(tmp)
        if checkpoint is None:
            import vela2

            print("writing the demo checkpoint ...", flush=True)
            checkpoint = vela2.init_demo(work / "checkpoint")
        from vela2.config import Vela2Config

        model_name = Vela2Config.read(checkpoint).name
        with embedded_redis(work) as (url, what):
            print(f"redis: {what}")
            log_path = work / "worker.log"
            worker = start_worker(url, checkpoint, log_path, max_batch_tokens=max_batch_tokens, max_wait_ms=max_wait_ms)
            ids: list[str] = []
            answers: dict[str, Any] = {}
            try:
                t_start = time.monotonic()
                try:
                    wait_until_ready(worker, log_path)
                except RuntimeError as e:
                    print(f"demo FAILED: {e}")
                    return 1
                print(f"worker ready in {time.monotonic() - t_start:.1f} s (pid {worker.pid}, model {model_name})")
                client = Client(url, model=model_name)
                online, bad, chunk = sample_requests(model_name)
                t0 = time.monotonic()
                ids = [client.submit(r) for r in online]
                ids.append(client.submit(bad, validate=False))  # let the worker answer it
                ids += client.submit_many(chunk, backfill=True, chunk_size=len(chunk))
                answers, seen_ms = _collect(client, ids, t0, ANSWER_TIMEOUT_S)
                print(
                    f"\n{len(ids)} requests ({len(online)} online, 1 bad, a bulk chunk of {len(chunk)}); "
                    f"all answered in {max(seen_ms.values(), default=0):.0f} ms\n"
                )
                _print_answers(ids, answers, seen_ms)
                client.close()
            finally:
                worker.send_signal(signal.SIGTERM)
                try:
                    code = worker.wait(60)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    code = worker.wait()
            summary = [line for line in log_path.read_text(errors="replace").splitlines() if "engine stopped" in line]
            print(
                f"\nworker stopped (exit code {code}): {summary[-1].split('engine stopped: ')[-1] if summary else '?'}"
            )
        missing = [i for i in ids if i not in answers]
        if missing or code != 0:
            print(f"demo FAILED: {len(missing)} unanswered {missing[:5]}; worker exit code {code}")
            print(log_path.read_text(errors="replace")[-3000:] if log_path.exists() else "")
            return 1
        print("demo OK")
        return 0


if __name__ == "__main__":
    sys.exit(run_demo())
