"""deploy/launch-workers.sh run as a process: one worker per GPU (or MIG instance), CUDA_VISIBLE_DEVICES
respected, SIGTERM and a dying worker stop the set, no GPU refused, every worker's health probed."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tests.unit.test_deploy import _flag

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "deploy" / "launch-workers.sh"


# ---------------------------------------------------------------------------------------------
# helpers


# ---------------------------------------------------------------------------------------------
# docker-compose.yml


# ---------------------------------------------------------------------------------------------
# Dockerfiles


# ---------------------------------------------------------------------------------------------
# KEDA


# ---------------------------------------------------------------------------------------------
# launch-workers.sh

FAKE_VELA2 = r"""#!/usr/bin/env bash
# Records its argv and CUDA_VISIBLE_DEVICES, then idles until SIGTERM (recorded too).
rec="$FAKE_LOG_DIR/worker.$$"
printf '%s\n' "$@" > "$rec.args"
printf '%s' "${CUDA_VISIBLE_DEVICES-unset}" > "$rec.cvd"
if [[ -n "${FAKE_FAIL_GPU:-}" && "$FAKE_FAIL_GPU" == "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    # crash once the other workers are up, so that the launcher has someone to stop
    for _ in $(seq 200); do
        compgen -G "$FAKE_LOG_DIR/*.ready" >/dev/null && break
        sleep 0.02
    done
    exit 7
fi
sleep 30 &
child=$!
trap 'kill "$child" 2>/dev/null; echo term > "$rec.term"; exit 0' TERM
touch "$rec.ready"
wait "$child"
"""

TWO_GPUS = """#!/bin/sh
echo "GPU 0: NVIDIA H200 (UUID: GPU-0b6e-aaaa)"
echo "GPU 1: NVIDIA H200 (UUID: GPU-0b6e-bbbb)"
"""


@pytest.fixture
def fakes(tmp_path):
    """make(nvidia_smi=..., **env) -> (env, log folder): PATH starts with fake vela2 / nvidia-smi."""
    bin_dir, log_dir = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log_dir.mkdir()

    def install(name: str, text: str) -> None:
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)

    install("vela2", FAKE_VELA2)

    def make(nvidia_smi: str | None = TWO_GPUS, **extra: str) -> tuple[dict[str, str], Path]:
        if nvidia_smi is not None:
            install("nvidia-smi", nvidia_smi)
        base = {k: v for k, v in os.environ.items() if k not in {"CUDA_VISIBLE_DEVICES", "VELA2_METRICS_PORT"}}
        env = {**base, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG_DIR": str(log_dir), **extra}
        return env, log_dir

    return make


def _default_signals() -> None:
    # A runner started as a background job of a non-interactive shell passes SIGINT on ignored, and
    # bash cannot trap a signal ignored at its start: the launcher starts as a terminal would start it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def _launched(env: dict[str, str], *args: str):
    proc = subprocess.Popen(
        ["bash", str(LAUNCHER), *args],
        env=env,
        start_new_session=True,
        preexec_fn=_default_signals,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc
    finally:
        # The launcher and the fakes share the session started above: end whatever of it is left.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=5)


def _wait_for(log_dir: Path, suffix: str, n: int, timeout_s: float = 5.0) -> list[Path]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(log_dir.glob(f"worker.*.{suffix}"))
        if len(found) >= n:
            return found
        time.sleep(0.02)
    raise AssertionError(f"{len(list(log_dir.glob('worker.*.' + suffix)))} of {n} workers wrote .{suffix}")


def _workers(log_dir: Path) -> list[tuple[str, list[str], bool]]:
    """(CUDA_VISIBLE_DEVICES, argv, got SIGTERM) per started fake worker, by GPU."""
    out = []
    for args in log_dir.glob("worker.*.args"):
        stem = str(args)[: -len(".args")]
        out.append((Path(stem + ".cvd").read_text(), args.read_text().splitlines(), Path(stem + ".term").exists()))
    return sorted(out)


@pytest.mark.integration  # bash processes
def test_launcher_parses():
    subprocess.run(["bash", "-n", str(LAUNCHER)], check=True)
    assert os.access(LAUNCHER, os.X_OK)


@pytest.mark.integration  # bash processes
def test_launcher_one_worker_per_gpu_and_sigterm_reaches_all(fakes):
    env, log_dir = fakes()
    with _launched(env, "--checkpoint", "/models/ckpt", "--redis", "redis://redis:6379/0") as proc:
        _wait_for(log_dir, "ready", 2)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=5)
        assert proc.returncode == 0, out
    workers = _workers(log_dir)
    assert [w[0] for w in workers] == ["0", "1"]
    for k, (_gpu, argv, termed) in enumerate(workers):
        assert argv[0] == "worker"
        assert _flag(argv, "--checkpoint") == "/models/ckpt"
        assert _flag(argv, "--device") == "cuda:0"  # the one device CUDA_VISIBLE_DEVICES leaves
        assert _flag(argv, "--metrics-port") == str(9464 + k)
        assert termed, f"worker {k} did not get SIGTERM"


@pytest.mark.integration  # bash processes
def test_launcher_respects_cuda_visible_devices(fakes):
    env, log_dir = fakes(nvidia_smi="#!/bin/sh\nexit 1\n", CUDA_VISIBLE_DEVICES="3, 5", VELA2_METRICS_PORT="9600")
    with _launched(env) as proc:
        _wait_for(log_dir, "ready", 2)
        proc.send_signal(signal.SIGINT)  # Ctrl-C: forwarded as SIGTERM
        out, _ = proc.communicate(timeout=5)
        assert proc.returncode == 0, out
    workers = _workers(log_dir)
    assert [(w[0], _flag(w[1], "--metrics-port"), w[2]) for w in workers] == [("3", "9600", True), ("5", "9601", True)]


@pytest.mark.integration  # bash processes
def test_launcher_stops_the_set_when_a_worker_dies(fakes):
    env, log_dir = fakes(FAKE_FAIL_GPU="1")
    with _launched(env, "--checkpoint", "/models/ckpt") as proc:
        out, _ = proc.communicate(timeout=8)
        assert proc.returncode == 7, out
        assert "exited on its own with status 7" in out
    assert [(w[0], w[2]) for w in _workers(log_dir)] == [("0", True), ("1", False)]


@pytest.mark.integration  # bash processes
def test_launcher_refuses_without_gpus(fakes):
    env, log_dir = fakes(CUDA_VISIBLE_DEVICES="")
    with _launched(env) as proc:
        out, _ = proc.communicate(timeout=5)
        assert proc.returncode == 2 and "no visible GPU" in out
    assert not list(log_dir.iterdir())


@pytest.mark.integration  # bash processes
def test_launcher_lists_mig_instances(fakes):
    mig = (
        "#!/bin/sh\n"
        "echo 'GPU 0: NVIDIA H200 (UUID: GPU-aaaa)'\n"
        "echo 'GPU 1: NVIDIA H200 (UUID: GPU-bbbb)'\n"
        "echo '  MIG 3g.71gb     Device  0: (UUID: MIG-1111)'\n"
        "echo '  MIG 3g.71gb     Device  1: (UUID: MIG-2222)'\n"
        "echo 'GPU 2: NVIDIA H200 (UUID: GPU-cccc)'\n"
    )
    env, _ = fakes(nvidia_smi=mig)
    listed = subprocess.run(["bash", str(LAUNCHER), "--list"], env=env, capture_output=True, text=True, timeout=5)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["0", "MIG-1111", "MIG-2222", "2"]


@pytest.mark.integration  # bash processes
def test_launcher_health_probes_every_worker(fakes):
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the http.server hook name)
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(b"vela2_queue_depth 0\n")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Metrics)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def health(visible: str) -> int:
        env, _ = fakes(CUDA_VISIBLE_DEVICES=visible, VELA2_METRICS_PORT=str(port))
        return subprocess.run(["bash", str(LAUNCHER), "--health"], env=env, capture_output=True, timeout=15).returncode

    try:
        assert health("0") == 0
        # with two GPUs the second worker would be on port + 1, where nothing listens (or something else does)
        with socket.socket() as probe:
            taken = probe.connect_ex(("127.0.0.1", port + 1)) == 0
        if not taken:
            assert health("0,1") == 1
    finally:
        server.shutdown()
        server.server_close()
    assert health("0") == 1


