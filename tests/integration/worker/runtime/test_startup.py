"""A worker that cannot start says so and exits non-zero; one started while Redis is full waits."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import redis as redis_lib

from producer.client import Client
from stack.harness import ROOT, child_env
from vela2.wire.keys import online_queue
from vela2.wire.urls import PASSWORD_IN_ARGV

MODEL = "vela2-demo"


def run_cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vela2.cli", "worker", *args], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=timeout_s)


def test_a_worker_that_cannot_start_exits_2_with_one_line(redis_server_factory, demo_dir, tmp_path):
    locked = redis_server_factory(extra_args=["--requirepass", "secret"])
    no_ckpt = run_cli("--checkpoint", str(tmp_path / "missing"), "--redis", locked.url())
    assert no_ckpt.returncode == 2 and no_ckpt.stderr.strip().splitlines() == [
        f"vela2 worker: {tmp_path / 'missing' / 'config.json'} does not exist"]
    wrong = run_cli("--checkpoint", str(demo_dir), "--redis", f"redis://:wrong@127.0.0.1:{locked.port}/0")
    assert wrong.returncode == 2 and "refuses the credentials" in wrong.stderr and "wrong" not in wrong.stderr
    warning, error = wrong.stderr.strip().splitlines()  # the password in argv is warned about first
    assert PASSWORD_IN_ARGV in warning and error.startswith("vela2 worker: Redis at redis://:**@")
    gone = run_cli("--checkpoint", str(demo_dir), "--redis", "redis://127.0.0.1:1/0", "--redis-wait-s", "1")
    assert gone.returncode == 2 and "did not answer within 1 s" in gone.stderr.splitlines()[-1]


def test_a_worker_started_while_redis_is_full_waits_and_then_answers(redis_server_factory, start_worker):
    server = redis_server_factory(extra_args=["--maxmemory", "16mb"])
    client = Client(server.url(), model=MODEL)
    row = {"task": "choice:boolq", "text": "The sky is green.", "questions": [{"options": ["yes", "no"]}]}
    ids = client.submit_many([{**row, "id": f"full-{i}"} for i in range(10)])
    r = server.client()
    filled = 0
    try:
        while True:
            r.set(f"fill:{filled}", b"x" * 100_000)
            filled += 1
    except redis_lib.exceptions.OutOfMemoryError:
        pass
    worker = start_worker(server.url())
    deadline = time.monotonic() + 120
    while "Redis refuses writes" not in worker.log():
        assert worker.alive() and time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.1)
    assert worker.alive() and r.llen(online_queue(MODEL)) == 10  # waiting, nothing taken or lost
    r.delete(*[f"fill:{i}" for i in range(filled)])
    got = client.results_many(ids, timeout_s=120)
    assert all(v is not None and v.status.value == "ok" for v in got.values())
    assert worker.terminate() == 0 and "Redis accepts writes again" in worker.log()
    client.close()
    r.close()


def test_wait_replicas_needs_that_many_replicas_connected_at_start(redis_server_factory):
    """A worker that acks only once N replicas hold its results waits for them within redis_wait_s,
    then refuses to start with a clear line instead of scoring, storing and never acking."""
    import pytest

    from vela2.errors import ConfigError
    from worker.runtime.checks import check_redis

    master = redis_server_factory()
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"has 0 replicas connected, and wait_replicas is 1: none of its results "
                                          r"could be acked \(waited 0.5 s, redis_wait_s\)"):
        check_redis(master.url(), 0.5, replicas=1)
    assert time.monotonic() - t0 < 10
    check_redis(master.url(), 0.5)  # no replicas asked for: the standalone master is fine
    redis_server_factory(extra_args=["--replicaof", "127.0.0.1", str(master.port)])
    check_redis(master.url(), 30, replicas=1)  # waits for the replica's sync, then passes
    with pytest.raises(ConfigError, match="has 1 replicas connected, and wait_replicas is 2"):
        check_redis(master.url(), 0.5, replicas=2)


def _health(port: int, path: str) -> tuple[int, dict]:
    """(HTTP status, JSON body) of a worker's /livez or /readyz; OSError while nothing listens."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _watch_health(port: int, proc: subprocess.Popen, deadline_s: float) -> list[tuple[int, int, str]]:
    """(/livez code, /readyz code, /readyz reason) every 20 ms from launch until /readyz says 200."""
    seen: list[tuple[int, int, str]] = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            live, _ = _health(port, "/livez")
            ready, body = _health(port, "/readyz")
        except OSError:  # not listening yet: the process is still importing Python itself
            time.sleep(0.02)
            continue
        seen.append((live, ready, body["reason"]))
        if ready == 200:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"never ready; seen {seen[-3:]}")


@pytest.mark.parametrize("launch", ["vela2 worker", "celery with faults"])
def test_health_answers_from_the_first_second_and_names_the_stage(launch, redis_url, demo_dir, tmp_path):
    """/livez is 200 while the model loads, /readyz 503 naming the stage, then 200: probes need no
    initial delay as long as the load (the warm-up slowed by a fault so its stage is seen)."""
    from stack.faults import Faults
    from stack.harness import WorkerProcess, free_port

    port = free_port()
    command = [sys.executable, "-m", "worker.cli"] if launch == "vela2 worker" else None
    w = WorkerProcess.start(redis_url, demo_dir, tmp_path / "w.log", command=command,
                            faults=Faults(delay_s=0.3) if command is None else None, metrics_port=port,
                            max_batch_tokens=2048, render_threads=1)
    try:
        seen = _watch_health(port, w.proc, 180)
        starting = [reason for live, ready, reason in seen if ready == 503]
        assert starting and all(live == 200 for live, _, _ in seen)  # live all along, ready only at the end
        assert all(r.startswith("starting: ") for r in starting)
        assert {"starting: loading the model", "starting: warming up"} & set(starting)
        if command is None:  # the slowed warm-up lasts seconds: its stage is seen
            assert "starting: warming up" in starting
        assert "ready" in w.log()
        log = w.log()
        assert log.index("start-up: checking the settings and Redis") < log.index("start-up: warming up")
    finally:
        w.kill()


def test_compiled_kernels_land_in_the_compile_cache_dir(tmp_path):
    """torch.compile, set up as the worker sets it up (use_compile_cache before anything compiles,
    torch already imported), writes its caches under compile_cache_dir: a volume there keeps them."""
    code = (
        "import sys, torch\n"
        "from worker.runtime.startup import use_compile_cache\n"
        "use_compile_cache(sys.argv[1])\n"
        "f = torch.compile(lambda x: torch.sin(x) * 2 + 1)\n"
        "print(float(f(torch.ones(8)).sum()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cc")], cwd=ROOT, env=child_env(),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    written = [p for p in (tmp_path / "cc" / "inductor").rglob("*") if p.is_file()]
    assert written, "inductor wrote nothing under compile_cache_dir"


def test_weights_that_differ_from_the_manifest_stop_the_worker(redis_url, demo_dir, tmp_path):
    """A weight byte changed after the manifest was written passes the cheap check at start (same size
    and header); the background check finds it once the worker serves: /readyz 503 names the file, the
    worker takes no more work, finishes and exits with status 3."""
    import shutil

    from stack.harness import WorkerProcess, free_port
    from vela2.model.manifest import WEIGHTS
    from worker.runtime.verify import CHECKPOINT_CHANGED_EXIT

    ckpt = shutil.copytree(demo_dir, tmp_path / "ckpt")
    with open(ckpt / WEIGHTS, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    port = free_port()
    w = WorkerProcess.start(redis_url, ckpt, tmp_path / "w.log", command=[sys.executable, "-m", "worker.cli"],
                            metrics_port=port, max_batch_tokens=2048, render_threads=1, verify_mb_s=5)
    try:
        seen: list[tuple[int, str]] = []
        deadline = time.monotonic() + 180
        while w.proc.poll() is None and time.monotonic() < deadline:
            try:
                code, body = _health(port, "/readyz")
                seen.append((code, body["reason"]))
            except OSError:
                pass
            time.sleep(0.05)
        assert w.proc.poll() == CHECKPOINT_CHANGED_EXIT, w.log()[-3000:]
        assert (200, "ok") in seen  # it served (the cheap check passed), then:
        assert any(code == 503 and reason.startswith(f"checkpoint files differ from manifest.json: {WEIGHTS}: its "
                                                     "bytes hash to") for code, reason in seen), seen[-5:]
        assert "DIFFERS from its manifest.json" in w.log()
    finally:
        w.kill()


@pytest.mark.parametrize("manifest", ["kept", "removed"])
def test_a_worker_verifies_its_manifest_in_the_background_or_hashes_without_one(redis_url, demo_dir, tmp_path,
                                                                                  manifest):
    """With a manifest: ready, then every byte verified in the background. Without one: the worker
    still starts, its digest hashed from every byte at start, a warning naming the fix."""
    import shutil

    from stack.harness import WorkerProcess
    from vela2.model import checkpoint
    from vela2.model.manifest import MANIFEST

    ckpt = shutil.copytree(demo_dir, tmp_path / "ckpt")
    if manifest == "removed":
        (ckpt / MANIFEST).unlink()
    w = WorkerProcess.start(redis_url, ckpt, tmp_path / "w.log", max_batch_tokens=2048, render_threads=1)
    try:
        w.wait_ready()
        assert "start-up: loading weights: " in w.log()  # the stage names the reading's progress
        if manifest == "kept":
            deadline = time.monotonic() + 60
            while "every byte agrees with its manifest" not in w.log() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "every byte agrees with its manifest" in w.log()
        else:
            assert "it has no manifest.json, so its identity was hashed from every byte" in w.log()
            assert f"`vela2 manifest {ckpt}` writes a manifest" in w.log()
        client = Client(redis_url, model=MODEL)
        res = client.result(client.submit({"id": "m-1", "task": "choice:t", "text": "Is it?",
                                           "questions": [{"question": "Is it?", "options": ["yes", "no"]}]}),
                            timeout_s=120)
        assert res.served_by is not None and res.served_by.digest == checkpoint.digest(ckpt)
        client.close()
        assert w.terminate() == 0
    finally:
        w.kill()
