"""A worker that cannot start: `vela2 worker` with a missing checkpoint, a wrong Redis password and
a visibility timeout it refuses, and `celery -A worker.app worker` with the same timeout, must each
exit 2 at once with one line naming why (never 0, never a traceback), so a supervisor sees it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis as redis_lib

from bench.faults.context import Suite
from bench.faults.report import Outcome
from stack.harness import RedisServer


class PasswordRedisServer(RedisServer):
    """A redis-server with `--requirepass PASSWORD` (its url() carries the password)."""

    PASSWORD = "right-password"

    def url(self, db: int = 0) -> str:
        return f"redis://:{self.PASSWORD}@127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0, **kw: Any) -> Any:
        return redis_lib.Redis(host="127.0.0.1", port=self.port, db=db, password=self.PASSWORD, **kw)


def _run_cli(argv: list[str], log_dir: Path, name: str, timeout_s: float) -> dict[str, Any]:
    """Run a command (child environment of the harness), bounded by `timeout_s`; its exit code,
    seconds, stderr lines and the `vela2 worker` lines among them."""
    from stack.harness import ROOT, child_env, die_with_parent

    err_path, out_path = log_dir / f"{name}.stderr", log_dir / f"{name}.stdout"
    t0 = time.monotonic()
    with open(err_path, "wb") as err, open(out_path, "wb") as outf:
        p = subprocess.Popen(argv, stdout=outf, stderr=err, cwd=ROOT, env=child_env({"OMP_NUM_THREADS": "1"}),
                             preexec_fn=die_with_parent)
        try:
            code: int | None = p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            code = None
    seconds = time.monotonic() - t0
    lines = err_path.read_text(errors="replace").strip().splitlines()
    return {
        "exit": code,
        "seconds": round(seconds, 2),
        "stderr_lines": len(lines),
        "reason_lines": [x.strip()[:400] for x in lines if "vela2 worker:" in x],
        "traceback": any("Traceback" in x for x in lines),
    }


def scenario_start_failures(s: Suite, out: Outcome) -> None:
    """A worker that cannot start exits 2 at once with one line on stderr naming why (never 0, never
    a traceback), so a supervisor sees it: `vela2 worker` with a missing checkpoint, a wrong Redis
    password (redis-server --requirepass), a visibility timeout the worker refuses (0.001 s); and
    `celery -A worker.app worker` with VELA2_VISIBILITY_TIMEOUT_S=0.001."""
    r = s.redis()
    locked = s.redis(kind=PasswordRedisServer, extra_args=("--requirepass", PasswordRedisServer.PASSWORD))
    exe = Path(sys.executable).with_name("vela2")
    cli = [str(exe)] if exe.exists() else [sys.executable, "-m", "vela2.cli"]
    cases = {
        "missing_checkpoint": (["--checkpoint", str(s.workdir / "no-such-checkpoint"), "--redis", r.url()],
                               "config.json does not exist", 15.0),
        "wrong_password": (["--checkpoint", str(s.checkpoint), "--redis",
                            f"redis://:wrong-password@127.0.0.1:{locked.port}/0"], "refuses the credentials", 15.0),
        "visibility_0.001": (["--checkpoint", str(s.checkpoint), "--redis", r.url(), "--device", s.device,
                              "--visibility-timeout-s", "0.001"], "visibility timeout 0.001 s is too short", 60.0),
    }
    results: dict[str, Any] = {}
    for name, (args, words, limit) in cases.items():
        got = _run_cli([*cli, "worker", *args], s.workdir, name, limit + 60)
        results[name] = got
        reason = got["reason_lines"]
        out.check(f"vela2 worker, {name}: exit 2 within {limit:g} s", got["exit"] == 2 and got["seconds"] < limit,
                  {"exit": got["exit"], "seconds": got["seconds"]})
        out.check(f"vela2 worker, {name}: one line on stderr naming why, no traceback",
                  len(reason) == 1 and words in reason[0] and not got["traceback"],
                  {"reason": reason, "stderr_lines": got["stderr_lines"]})
    w = s.worker(r.url(), visibility_timeout_s=0.001)
    t0 = time.monotonic()
    code = w.wait_exit(120)
    took = time.monotonic() - t0
    line = next((x.strip() for x in w.log().splitlines() if "cannot start" in x), None)
    out.check("celery -A worker.app worker, VELA2_VISIBILITY_TIMEOUT_S=0.001: exit 2 with the reason logged",
              code == 2 and line is not None and "visibility timeout 0.001 s is too short" in line,
              {"exit": code, "line": line})
    results["celery_visibility_0.001"] = {"exit": code, "seconds": round(took, 2), "reason_line": line}
    out.notes.update({"command": " ".join(Path(c).name for c in cli) + " worker ...", "results": results})
