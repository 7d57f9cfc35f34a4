"""What one request costs Redis (issue 42), path by path, with one demo worker (CPU) serving them:

    python -m bench.redis_cost --out bench/results/redis-cost.json

A redis-server of its own (AOF on, appendfsync everysec, as the issue measured). Around each path:
CONFIG RESETSTAT, then INFO commandstats (every command's calls, those run inside Lua scripts
included, and their µs), INFO cpu (the main thread's CPU seconds) and INFO memory (used_memory
before and after: the results and markers a path leaves, kept with their TTL). Per request:
commands, Redis main-thread CPU µs, commandstats µs and bytes kept. The worker's own background
(heartbeats, lease renewals, restores) runs meanwhile and is counted, as in production. Paths:

- `submit_result_queued`: Client.submit of one row per message for --n rows, then Client.result
  of each (the worker answers while they are submitted);
- `one_at_a_time`: Client.submit then Client.result, one request in flight, --n-one requests;
- `submit_many_16`: Client.submit_many(chunk_size=16) of --n rows + Client.results_many;
- `idle_worker`: no traffic for --idle-s seconds: commands and µs a second; beside it
  `redis_alone_cpu_us_per_s`, the same Redis before any client connected (its own cron, AOF), and
  `worker_cpu_us_per_s`, the difference: what the idle worker costs.

`--before DIR` is not an option: to measure another checkout, run this file from it (it uses only
Client.submit / result / submit_many / results_many and the process harness), e.g. with
`PYTHONPATH=DIR` so that the worker processes it starts import that checkout too.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis as redis_lib

from bench.queue_bench import bench_redis, cpu_checkpoint, machine_info, short_rows
from producer.client import Client
from stack.harness import WorkerProcess
from vela2.wire.keys import result_key, submitted_key

log = logging.getLogger("bench.redis_cost")
MODEL = "vela2-demo"
GOALS = {"submit_result_queued": {"cpu_us": 60, "commands": 10}, "one_at_a_time": {"cpu_us": 150},
         "idle_worker": {"cpu_us_per_s": 500}, "stored_bytes_per_short_answer": 600}
OWN = ("config", "info")  # this benchmark's own commands: not counted


def _stats(r: redis_lib.Redis) -> dict[str, Any]:
    """(calls by command, their µs, main-thread CPU s, used_memory) now."""
    cmds = {k.removeprefix("cmdstat_"): v for k, v in r.info("commandstats").items()
            if k.removeprefix("cmdstat_").split("|")[0] not in OWN}
    cpu = r.info("cpu")
    main = cpu.get("used_cpu_sys_main_thread", cpu["used_cpu_sys"]) + cpu.get("used_cpu_user_main_thread",
                                                                              cpu["used_cpu_user"])
    return {"calls": {k: int(v["calls"]) for k, v in cmds.items()}, "usec": sum(int(v["usec"]) for v in cmds.values()),
            "cpu_s": float(main), "memory": int(r.info("memory")["used_memory"])}


def measure(r: redis_lib.Redis, name: str, n: int, run: Any) -> dict[str, Any]:
    """Run `run()` (n requests) between a CONFIG RESETSTAT and the stats; the per-request figures."""
    memory0 = int(r.info("memory")["used_memory"])
    r.config_resetstat()
    cpu0 = _stats(r)["cpu_s"]
    t0 = time.monotonic()
    run()
    seconds = time.monotonic() - t0
    s = _stats(r)
    calls = sum(s["calls"].values())
    top = sorted(s["calls"].items(), key=lambda kv: -kv[1])[:8]
    out = {"requests": n, "seconds": round(seconds, 2), "commands_per_request": round(calls / n, 2),
           "cpu_us_per_request": round((s["cpu_s"] - cpu0) * 1e6 / n, 1),
           "commandstats_usec_per_request": round(s["usec"] / n, 1),
           "memory_bytes_per_request": round((s["memory"] - memory0) / n),
           "top_commands_per_request": {k: round(v / n, 2) for k, v in top}}
    log.info("%s: %s", name, json.dumps(out))
    return out


def _kept(r: redis_lib.Redis, rid: str) -> dict[str, int]:
    return {"result_value_bytes": int(r.strlen(result_key(rid))), "marker_bytes": int(r.strlen(submitted_key(rid)))}


def paths(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Each path's figures (module docstring), the worker running."""
    r = redis_lib.Redis.from_url(url)
    c = Client(url, model=MODEL)
    out: dict[str, Any] = {}
    try:
        warm = short_rows(50, "warm-")
        c.results_many(c.submit_many(warm), timeout_s=120)  # first batches of every shape

        rows = short_rows(args.n, "q-")

        def queued() -> None:
            ids = [c.submit(row) for row in rows]
            for rid in ids:
                c.result(rid, timeout_s=120)

        out["submit_result_queued"] = {**measure(r, "submit_result_queued", args.n, queued), **_kept(r, "q-0")}
        ones = short_rows(args.n_one, "o-")

        def one_at_a_time() -> None:
            for row in ones:
                c.result(c.submit(row), timeout_s=60)

        out["one_at_a_time"] = measure(r, "one_at_a_time", args.n_one, one_at_a_time)
        many = short_rows(args.n, "m-")

        def submit_many() -> None:
            got = c.results_many(c.submit_many(many, chunk_size=16), timeout_s=120)
            assert all(v is not None for v in got.values()), "a request was not answered"

        out["submit_many_16"] = measure(r, "submit_many_16", args.n, submit_many)
        time.sleep(2.0)  # the last acks and beats settle
        idle = measure(r, "idle_worker", 1, lambda: time.sleep(args.idle_s))
        out["idle_worker"] = {"seconds": idle["seconds"],
                              "commands_per_s": round(idle["commands_per_request"] / idle["seconds"], 1),
                              "cpu_us_per_s": round(idle["cpu_us_per_request"] / idle["seconds"], 1),
                              "top_commands_per_s": {k: round(v / idle["seconds"], 2)
                                                     for k, v in idle["top_commands_per_request"].items()}}
    finally:
        c.close()
        r.close()
    return out


def goals(out: dict[str, Any]) -> dict[str, Any]:
    """Each goal of the issue beside the figure it bounds."""
    q, one, idle = out["submit_result_queued"], out["one_at_a_time"], out["idle_worker"]
    rows = [("submit_result_queued cpu µs", q["cpu_us_per_request"], GOALS["submit_result_queued"]["cpu_us"]),
            ("submit_result_queued commands", q["commands_per_request"], GOALS["submit_result_queued"]["commands"]),
            ("one_at_a_time cpu µs", one["cpu_us_per_request"], GOALS["one_at_a_time"]["cpu_us"]),
            ("idle_worker cpu µs/s (less Redis alone)", idle["worker_cpu_us_per_s"],
             GOALS["idle_worker"]["cpu_us_per_s"]),
            ("stored bytes per short answer", q["result_value_bytes"] + q["marker_bytes"],
             GOALS["stored_bytes_per_short_answer"])]
    return {name: {"value": v, "goal": g, "met": v <= g} for name, v, g in rows}


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The paths on a redis-server of their own with one demo worker; the goals beside them."""
    checkpoint, extra = cpu_checkpoint("demo", Path(args.cache_dir))
    with bench_redis(work / "redis") as (url, what, _):
        r = redis_lib.Redis.from_url(url)
        r.config_set("appendonly", "yes")
        r.config_set("appendfsync", "everysec")
        info = r.info("server")
        alone = measure(r, "redis_alone", 1, lambda: time.sleep(args.idle_s))  # Redis's own idle cost
        r.close()
        worker = WorkerProcess.start(url, checkpoint, work / "worker.log", name="cost", device="cpu", **extra)
        try:
            worker.wait_ready()
            out = paths(url, args)
        finally:
            worker.terminate()
    idle = out["idle_worker"]
    idle["redis_alone_cpu_us_per_s"] = round(alone["cpu_us_per_request"] / alone["seconds"], 1)
    idle["worker_cpu_us_per_s"] = round(idle["cpu_us_per_s"] - idle["redis_alone_cpu_us_per_s"], 1)
    return {"redis": {"what": what, "version": info["redis_version"], "appendonly": "yes",
                      "appendfsync": "everysec"}, "paths": out, "goals": goals(out)}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench.redis_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2_000, help="requests of the queued and submit_many paths")
    ap.add_argument("--n-one", type=int, default=300, help="requests of the one-at-a-time path")
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "vela2-bench"))
    ap.add_argument("--out", default="bench/results/redis-cost.json")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    report: dict[str, Any] = {"command": "python -m bench.redis_cost " + " ".join(argv), "machine": machine_info(),
                              "cpu_count": os.cpu_count(), "commit": commit,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="vela2-redis-cost-") as tmp:
        report.update(run(args, Path(tmp)))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
