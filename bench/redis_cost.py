"""What one request costs Redis (issue 42), path by path, with one demo worker (CPU) serving them:

    python -m bench.redis_cost --out bench/results/redis-cost.json

A redis-server of its own (AOF on, appendfsync everysec, as the issue measured: set by CONFIG SET
after it starts). Around each path: CONFIG RESETSTAT, then INFO commandstats (every command's
calls, those run inside Lua scripts included, and their µs; this benchmark's own CONFIG and INFO
left out), INFO cpu (the main thread's CPU seconds) and INFO memory (used_memory before and after:
the results, markers and job records a path leaves, kept with their TTL; `kept_bytes_per_request`:
the same less the clients' and AOF buffers, which come and go with connections). Per request:
commands, Redis main-thread CPU µs, commandstats µs, bytes kept, and the commands by calls
(`top_commands_per_request`). Beside them the bytes of the first request's stored result value
(STRLEN of its `celery-task-meta-<id>`) and of its submitted marker, and their means over the
path's first SAMPLE requests. The worker's own background (heartbeats, lease renewals, restores)
runs meanwhile and is counted, as in production; `idle_worker` shows its size. Every path uses
fresh ids. Paths:

- `submit_result_queued`: Client.submit of one row per message for --n rows, all queued up front
  (the worker stopped by SIGSTOP while they are submitted, SIGCONT after), then Client.result of
  each: the single-row path at load;
- `submit_result_running`: the same with the worker running while they are submitted (it keeps up,
  so its takes find one or two messages each: more takes per request);
- `one_at_a_time`: Client.submit then Client.result, one request in flight, --n-one requests;
- `submit_many_16`: Client.submit_many(chunk_size=16) of --n rows + Client.results_many;
- `bulk_job_line`: producer.jobs.submit_job of --n-job JSONL rows, then job_info every 0.25 s until
  the job ends (those polls, two commands each, are counted: `job_info_polls`);
- `http_system_one`: `python -m producer.http.app --no-auth` (started for this path, stopped after)
  and --n-http SystemOne requests POSTed to /v1/system_one (each waiting for its answer) from
  --http-connections threads, one httpx connection each;
- `idle_worker`: no traffic for --idle-s seconds: commands and µs a second; beside it
  `redis_alone_cpu_us_per_s`, the same Redis before any client connected (its own cron, AOF), and
  `worker_cpu_us_per_s`, the difference: what the idle worker costs.

`--before DIR` is not an option: to measure another checkout, run this file from it (it uses only
the client, the jobs module, the route and the process harness), e.g. with `PYTHONPATH=DIR` so that
the worker and route processes it starts import that checkout too.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import redis as redis_lib

from bench.queue_bench import bench_redis, cpu_checkpoint, short_rows
from bench.report import git_commit, header, write_report
from producer.client import Client
from producer.jobs import job_info, submit_job
from stack.harness import WorkerProcess, start_route
from vela2.wire.jobs import request_wire_id
from vela2.wire.keys import result_key, submitted_key

log = logging.getLogger("bench.redis_cost")
MODEL = "vela2-demo"
GOALS = {"submit_result_queued": {"cpu_us": 60, "commands": 10}, "one_at_a_time": {"cpu_us": 150},
         "idle_worker": {"cpu_us_per_s": 500}, "stored_bytes_per_short_answer": 600}
# What the issue measured (its "before", an older commit, another machine): for comparison only.
ISSUE_MEASURED = {"submit_result_queued": {"commands_per_request": 20, "cpu_us_per_request": 214},
                  "one_at_a_time": {"commands_per_request": 45, "cpu_us_per_request": 1062},
                  "submit_many_16": {"commands_per_request": 11.6, "cpu_us_per_request": 44},
                  "http_system_one": {"commands_per_request": 18, "cpu_us_per_request": 189},
                  "bulk_job_line": {"commands_per_request": 9.6, "cpu_us_per_request": 39},
                  "idle_worker": {"commands_per_s": 101, "cpu_us_per_s": 4363}}
OWN = ("config", "info")  # this benchmark's own commands: not counted
JOB_POLL_S = 0.25
TOP = 12  # commands listed per path
SAMPLE = 60  # requests of a path whose stored bytes are read (ten of each short_rows group)


def system_one(rid: str, k: int) -> dict[str, Any]:
    """A short SystemOne request (one choice task), the shape of the tests' tenants REQUEST."""
    return {"model": MODEL, "id": rid, "input": {"user": f"Where is my refund for order {k}?"},
            "tasks": [{"name": "intent", "kind": "choice", "question": "What does the user want?",
                       "options": ["refund", "other"]}]}


def _memory(r: redis_lib.Redis) -> dict[str, int]:
    """used_memory, and `kept`: used_memory less the clients' buffers and the AOF buffer (what the
    keys hold, without the connections' noise: a connection's buffers come and go)."""
    m = r.info("memory")
    buffers = sum(int(m.get(k, 0)) for k in ("mem_clients_normal", "mem_clients_slaves", "mem_aof_buffer"))
    return {"memory": int(m["used_memory"]), "kept": int(m["used_memory"]) - buffers}


def _stats(r: redis_lib.Redis) -> dict[str, Any]:
    """Calls by command and their µs (OWN left out), the main thread's CPU s and the memory, now."""
    cmds = {k.removeprefix("cmdstat_"): v for k, v in r.info("commandstats").items()
            if k.removeprefix("cmdstat_").split("|")[0] not in OWN}
    cpu = r.info("cpu")
    main = cpu.get("used_cpu_sys_main_thread", cpu["used_cpu_sys"]) + cpu.get("used_cpu_user_main_thread",
                                                                              cpu["used_cpu_user"])
    return {"calls": {k: int(v["calls"]) for k, v in cmds.items()}, "usec": sum(int(v["usec"]) for v in cmds.values()),
            "cpu_s": float(main), **_memory(r)}


def measure(r: redis_lib.Redis, name: str, n: int, run: Callable[[], Any]) -> dict[str, Any]:
    """Run `run()` (n requests) between a CONFIG RESETSTAT and the stats; the per-request figures."""
    memory0 = _memory(r)
    r.config_resetstat()
    cpu0 = _stats(r)["cpu_s"]
    t0 = time.monotonic()
    run()
    seconds = time.monotonic() - t0
    s = _stats(r)
    calls = sum(s["calls"].values())
    top = sorted(s["calls"].items(), key=lambda kv: -kv[1])[:TOP]
    out = {"requests": n, "seconds": round(seconds, 2), "commands_per_request": round(calls / n, 2),
           "cpu_us_per_request": round((s["cpu_s"] - cpu0) * 1e6 / n, 1),
           "commandstats_usec_per_request": round(s["usec"] / n, 1),
           "memory_bytes_per_request": round((s["memory"] - memory0["memory"]) / n),
           "kept_bytes_per_request": round((s["kept"] - memory0["kept"]) / n),
           "top_commands_per_request": {k: round(v / n, 2) for k, v in top}}
    log.info("%s: %s", name, json.dumps(out))
    return out


def _kept(r: redis_lib.Redis, ids: list[str]) -> dict[str, Any]:
    """The bytes of the first request's stored result value and of its submitted marker (0: none),
    and their means over `ids` (short_rows cycles through its groups: the mean is the mix's)."""
    pipe = r.pipeline(transaction=False)
    for rid in ids:
        pipe.strlen(result_key(rid))
        pipe.strlen(submitted_key(rid))
    got = [int(v) for v in pipe.execute()]
    values, markers = got[0::2], got[1::2]
    return {"result_value_bytes": values[0], "marker_bytes": markers[0], "sampled": len(ids),
            "result_value_bytes_mean": round(sum(values) / len(ids)),
            "marker_bytes_mean": round(sum(markers) / len(ids))}


def _sample(prefix: str, n: int) -> list[str]:
    """The ids `<prefix>0` .. of the first SAMPLE requests of a path."""
    return [f"{prefix}{k}" for k in range(min(n, SAMPLE))]


def submit_then_result(c: Client, rows: list[dict[str, Any]], pause_pid: int | None) -> None:
    """Client.submit each row (the process `pause_pid` stopped meanwhile, if given), then Client.result each."""
    if pause_pid is not None:
        os.kill(pause_pid, signal.SIGSTOP)
    try:
        ids = [c.submit(row) for row in rows]
    finally:
        if pause_pid is not None:
            os.kill(pause_pid, signal.SIGCONT)
    for rid in ids:
        c.result(rid, timeout_s=120)


def queued_paths(r: redis_lib.Redis, c: Client, worker_pid: int, n: int) -> dict[str, Any]:
    """`submit_result_queued` (the worker stopped, SIGSTOP, while the n rows are submitted: all
    queued up front, as at load) and `submit_result_running` (the same with the worker running: it
    takes what has come so far, in small takes)."""
    out: dict[str, Any] = {}
    for name, prefix, pause in (("submit_result_queued", "q-", worker_pid), ("submit_result_running", "s-", None)):
        run = functools.partial(submit_then_result, c, short_rows(n, prefix), pause)
        out[name] = {**measure(r, name, n, run), **_kept(r, _sample(prefix, n))}
    return out


def client_paths(r: redis_lib.Redis, c: Client, n_one: int, n: int) -> dict[str, Any]:
    """`one_at_a_time` and `submit_many_16` (module docstring)."""
    ones = short_rows(n_one, "o-")

    def one_at_a_time() -> None:
        for row in ones:
            c.result(c.submit(row), timeout_s=60)

    out = {"one_at_a_time": {**measure(r, "one_at_a_time", n_one, one_at_a_time), **_kept(r, _sample("o-", n_one))}}
    many = short_rows(n, "m-")

    def submit_many() -> None:
        got = c.results_many(c.submit_many(many, chunk_size=16), timeout_s=120)
        assert all(v is not None for v in got.values()), "a request was not answered"

    out["submit_many_16"] = {**measure(r, "submit_many_16", n, submit_many), **_kept(r, _sample("m-", n))}
    return out


def job_path(r: redis_lib.Redis, c: Client, n: int) -> dict[str, Any]:
    """`bulk_job_line`: one job of n JSONL rows, waited on with job_info until it ends."""
    lines = [json.dumps(row).encode() + b"\n" for row in short_rows(n, "j-")]
    job: dict[str, Any] = {}

    def run() -> None:
        job["id"] = submit_job(c, lines).id
        job["polls"] = 0
        deadline = time.monotonic() + 600
        while not (info := job_info(c, job["id"])).ended:
            job["polls"] += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job['id']} did not end within 600 s: {info.counts}")
            time.sleep(JOB_POLL_S)
        job["polls"] += 1
        job["status"], job["counts"] = info.status, info.counts

    got = measure(r, "bulk_job_line", n, run)
    if job["status"] != "completed" or job["counts"].get("ok") != n:
        raise RuntimeError(f"job {job['id']} ended {job['status']}: {job['counts']}")
    wire = c.scope.wire(job["id"])
    kept = _kept(r, [request_wire_id(wire, k) for k in range(min(n, SAMPLE))])
    return {**got, **kept, "job_info_polls": job["polls"]}


def _post_all(base: str, bodies: list[dict[str, Any]], connections: int) -> list[int]:
    """POST every body to /v1/system_one from `connections` threads (one httpx client each, its share
    of the bodies in turn); the status codes that were not 200."""
    bad: list[int] = []

    def worker(share: list[dict[str, Any]]) -> None:
        with httpx.Client(base_url=base, timeout=120) as http:
            for body in share:
                code = http.post("/v1/system_one", json=body).status_code
                if code != 200:
                    bad.append(code)

    threads = [threading.Thread(target=worker, args=(bodies[k::connections],)) for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return bad


def http_path(url: str, r: redis_lib.Redis, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`http_system_one`: the route of this checkout (--no-auth), SystemOne requests from
    --http-connections connections, each waiting for its answer."""
    proc, base = start_route(url, MODEL, work / "route.log", "--no-auth")
    try:
        bad = _post_all(base, [system_one(f"hw-{k}", k) for k in range(2 * args.http_connections)],
                        args.http_connections)  # the route's connections and first batches
        if bad:
            raise RuntimeError(f"the route answered {bad[:5]} to warm-up requests")
        bodies = [system_one(f"h-{k}", k) for k in range(args.n_http)]
        got = measure(r, "http_system_one", args.n_http, lambda: bad.extend(_post_all(base, bodies,
                                                                                       args.http_connections)))
        if bad:
            raise RuntimeError(f"{len(bad)} requests were not answered 200 (e.g. {bad[:5]})")
    finally:
        proc.terminate()
        proc.wait(30)
    return {**got, **_kept(r, _sample("h-", args.n_http)), "connections": args.http_connections}


def idle_path(r: redis_lib.Redis, idle_s: float) -> dict[str, Any]:
    """`idle_worker`: no traffic for idle_s seconds, per second."""
    time.sleep(2.0)  # the last acks and beats settle
    idle = measure(r, "idle_worker", 1, lambda: time.sleep(idle_s))
    return {"seconds": idle["seconds"],
            "commands_per_s": round(idle["commands_per_request"] / idle["seconds"], 1),
            "cpu_us_per_s": round(idle["cpu_us_per_request"] / idle["seconds"], 1),
            "commandstats_usec_per_s": round(idle["commandstats_usec_per_request"] / idle["seconds"], 1),
            "top_commands_per_s": {k: round(v / idle["seconds"], 2)
                                   for k, v in idle["top_commands_per_request"].items()}}


def paths(url: str, work: Path, worker_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    """Each path's figures (module docstring), the worker running."""
    r = redis_lib.Redis.from_url(url)
    c = Client(url, model=MODEL)
    try:
        warm = short_rows(50, "warm-")
        c.results_many(c.submit_many(warm), timeout_s=120)  # first batches of every shape
        out = {**queued_paths(r, c, worker_pid, args.n), **client_paths(r, c, args.n_one, args.n)}
        if args.n_job:
            out["bulk_job_line"] = job_path(r, c, args.n_job)
        if args.n_http:
            out["http_system_one"] = http_path(url, r, work, args)
        out["idle_worker"] = idle_path(r, args.idle_s)
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
            ("stored bytes per short answer", q["result_value_bytes_mean"] + q["marker_bytes_mean"],
             GOALS["stored_bytes_per_short_answer"])]
    got = {name: {"value": v, "goal": g, "met": v <= g} for name, v, g in rows}
    got["stored bytes per short answer"]["of"] = (f"submit_result_queued: result value + marker, the mean of its "
                                                  f"first {q['sampled']} requests (all short_rows groups)")
    return got


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
            out = paths(url, work, worker.pid, args)
        finally:
            worker.terminate()
    idle = out["idle_worker"]
    idle["redis_alone_cpu_us_per_s"] = round(alone["cpu_us_per_request"] / alone["seconds"], 1)
    idle["worker_cpu_us_per_s"] = round(idle["cpu_us_per_s"] - idle["redis_alone_cpu_us_per_s"], 1)
    what = what.replace("no persistence", "started without persistence, then CONFIG SET appendonly yes")
    return {"redis": {"what": what, "version": info["redis_version"], "appendonly": "yes",
                      "appendfsync": "everysec"}, "paths": out, "goals": goals(out),
            "issue_measured": ISSUE_MEASURED}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench.redis_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2_000, help="requests of the queued, running and submit_many paths")
    ap.add_argument("--n-one", type=int, default=300, help="requests of the one-at-a-time path")
    ap.add_argument("--n-job", type=int, default=None, help="lines of the bulk job (default --n; 0: no job path)")
    ap.add_argument("--n-http", type=int, default=None, help="requests of the HTTP path (default --n; 0: none)")
    ap.add_argument("--http-connections", type=int, default=16)
    ap.add_argument("--idle-s", type=float, default=30.0, help="the idle paths' seconds (Redis alone, idle worker)")
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "vela2-bench"))
    ap.add_argument("--out", default="bench/results/redis-cost.json")
    args = ap.parse_args(argv)
    args.n_job = args.n if args.n_job is None else args.n_job
    args.n_http = args.n if args.n_http is None else args.n_http
    report = header("bench.redis_cost", argv, commit=git_commit())
    with tempfile.TemporaryDirectory(prefix="vela2-redis-cost-") as tmp:
        report.update(run(args, Path(tmp)))
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
