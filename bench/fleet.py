"""A fleet over Redis cells (issue 42, part 3): does throughput scale with the number of cells?

    python -m bench.fleet --cells 1 2 4 --out bench/results/fleet.json

For each cell count N of --cells: N redis-server processes (stack.harness.RedisServer, each on its
own loopback port; no persistence, or with --aof the append-only file fsynced every second), the
CellMap.even of them saved to a temporary cells file (vela2.wire.cells), --workers-per-cell fake
worker processes per cell (producer.testing.FakeWorker, answer="stub", on its cell's URL: they take
and store exactly as the real worker does, with no model) and --producers-per-cell x N producer
processes. Each producer drives producer.cells.CellsClient in a closed loop: submit_many of --batch
`short_rows` (chunk_size 1: a message a request, each routed to its id's cell), then results_many of
those ids, again and again; every id unique (the producer's tag, the batch number, the row). After
--warmup-s the figures are taken over --seconds:

- `requests_per_s`: answers that came back in the window (a batch is counted when its results_many
  returns) / the window's seconds;
- per cell: the Redis main thread's CPU (INFO cpu used_cpu_sys_main_thread + used_cpu_user_main_thread,
  difference over the window / its seconds: 1.0 is one core, what one Redis can use) and commands a
  second (INFO stats total_commands_processed, difference);
- the CPU seconds of each group of processes (redis, fake workers, producers; /proc), the machine's
  busy share (/proc/stat) and load average;
- `lost`: requests submitted and not answered once every producer has ended with a final results_many
  (--final-timeout-s) of any it still waited for: must be 0.

`ratios`: requests_per_s(N) / requests_per_s(1), beside the issue's goals (>= 1.8x at 2 cells, >= 3.4x
at 4). `bound_by` says per N what limited it: the cells (a Redis main thread near a full core), or the
machine's cores (producers and fake workers are Python processes: the Redis cells then are not
saturated), or neither. `one_cell_carries`: requests/s and Redis CPU per cell, and requests/s per
Redis core (the fake worker's path: the real worker's commands differ, see bench.redis_cost).

Subcommands `_worker` and `_producer` are the child processes (started by the benchmark; each runs
in its own process group, killed on any exit). Run from the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("bench.fleet")

ROOT = Path(__file__).resolve().parents[1]
MODEL = "vela2-demo"
GOALS = {2: 1.8, 4: 3.4}  # throughput(N) / throughput(1), issue 42
READY_TIMEOUT_S = 180.0  # every child imported and connected (many Python processes on few cores)
SATURATED = 0.85  # a Redis main thread at this share of a core or more: the cell is the bound
MACHINE_BUSY = 0.90  # the machine's cores busy at this share or more: the machine is the bound


# --- the child processes ----------------------------------------------------------------------------


def _stop_on_term() -> threading.Event:
    """An event set by SIGTERM / SIGINT (a child's way to end warmly)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _say(obj: Any) -> None:
    """One line to the parent (stdout)."""
    sys.stdout.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    sys.stdout.flush()


def _worker_main(argv: list[str]) -> int:
    """(child) A FakeWorker (answer="stub") in a thread on one cell's Redis until SIGTERM; then its
    counts as one JSON line."""
    ap = argparse.ArgumentParser(prog="python -m bench.fleet _worker")
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default=MODEL)
    args = ap.parse_args(argv)
    stop = _stop_on_term()
    from producer.testing import FakeWorker

    worker = FakeWorker(args.url, model=args.model, answer="stub").start()
    _say("ready")
    while not stop.wait(0.2):
        if worker.crashed is not None:
            break
    crashed = worker.crashed
    worker.stop(30)
    _say({"messages": worker.messages, "requests": worker.requests, "redis_errors": worker.redis_errors,
          "crashed": None if crashed is None else repr(crashed)})
    return 0 if crashed is None else 1


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]
    return {"p50": round(pick(0.5), 1), "p90": round(pick(0.9), 1), "p99": round(pick(0.99), 1),
            "max": round(s[-1], 1), "mean": round(sum(s) / len(s), 1)}


def _producer_main(argv: list[str]) -> int:
    """(child) A closed loop of submit_many + results_many over the cells: waits for the line
    "<t_measure> <t_end>" (time.time()) on stdin, runs until t_end, waits for what it still lacks,
    then prints its counts as one JSON line."""
    ap = argparse.ArgumentParser(prog="python -m bench.fleet _producer")
    ap.add_argument("--cells", required=True, help="the cells file")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--tag", required=True, help="this producer's id prefix")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--chunk-size", type=int, default=1)
    ap.add_argument("--batch-timeout-s", type=float, default=60.0)
    ap.add_argument("--final-timeout-s", type=float, default=30.0)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # the parent stops a producer only when the run is abandoned
    from bench.queue_bench import short_rows, with_prefix
    from producer.cells import CellsClient

    client = CellsClient(args.cells, model=args.model)
    template = short_rows(args.batch, "r")
    client.ping()  # every cell's connection made before the clock starts
    _say("ready")
    t_measure, t_end = (float(x) for x in sys.stdin.readline().split())
    submitted = answered = in_window = not_ok = batches = 0
    pending: list[str] = []
    latency_ms: list[float] = []
    try:
        while (t0 := time.time()) < t_end:
            ids = client.submit_many(with_prefix(template, f"{args.tag}b{batches}."), chunk_size=args.chunk_size)
            submitted += len(ids)
            got = client.results_many(ids, timeout_s=args.batch_timeout_s)
            done = time.time()
            batches += 1
            missing = [rid for rid, res in got.items() if res is None]
            pending += missing
            n_ok = sum(1 for res in got.values() if res is not None and res.status == "ok")
            n = len(ids) - len(missing)
            answered += n
            not_ok += n - n_ok
            if t_measure <= done < t_end:
                in_window += n
                latency_ms.append((done - t0) * 1e3)
        late = 0
        if pending:
            final = client.results_many(pending, timeout_s=args.final_timeout_s)
            late = sum(res is not None for res in final.values())
            answered += late
        _say({"submitted": submitted, "answered": answered, "answered_in_window": in_window, "not_ok": not_ok,
              "batches": batches, "answered_late": late, "lost": submitted - answered,
              "batch_ms": _percentiles(latency_ms)})
    finally:
        client.close()
    return 0


# --- the parent: processes ---------------------------------------------------------------------------


class Child:
    """A child process (`python -m bench.fleet <sub> ...`) in a process group of its own, its stdin
    and stdout piped (one line each way at a time), its stderr to a log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path):
        from stack.harness import child_env, die_with_parent

        self.name = name
        self.log_path = log_path
        with open(log_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.fleet", *argv], cwd=ROOT, env=child_env(),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         start_new_session=True, preexec_fn=die_with_parent)

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def line(self, timeout_s: float) -> str:
        """The next line the child prints; RuntimeError with its log's tail if it exits or is silent
        for `timeout_s`."""
        out: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
        ready, _, _ = select.select([out], [], [], timeout_s)
        text = out.readline().decode() if ready else ""
        if not text:
            tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
            state = "exited" if self.proc.poll() is not None else f"said nothing for {timeout_s:g} s"
            raise RuntimeError(f"{self.name} {state}:\n{tail}")
        return text.strip()

    def send(self, text: str) -> None:
        stdin: IO[bytes] = self.proc.stdin  # type: ignore[assignment]
        stdin.write(text.encode() + b"\n")
        stdin.flush()

    def signal(self, sig: int) -> None:
        """`sig` to the child's whole process group (nothing if it is gone)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the group and reap the child."""
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def _reap(children: list[Child], timeout_s: float = 30.0) -> None:
    """SIGTERM every child's group, wait up to `timeout_s`, SIGKILL what is left."""
    for c in children:
        if c.proc.poll() is None:
            c.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for c in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.proc.wait(max(0.1, deadline - time.monotonic()))
    for c in children:
        c.kill()  # the group too: a grandchild left behind dies here


# --- the parent: measuring ---------------------------------------------------------------------------


def _machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all cores so far (/proc/stat: busy = total - idle - iowait)."""
    with contextlib.suppress(OSError):
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
        return total - fields[3] - fields[4], total
    return 0, 0


def _redis_figures(r: Any) -> dict[str, float]:
    """The main thread's and the whole process's CPU seconds and the commands processed, now."""
    cpu = r.info("cpu")
    main = cpu.get("used_cpu_sys_main_thread", cpu["used_cpu_sys"]) + cpu.get("used_cpu_user_main_thread",
                                                                              cpu["used_cpu_user"])
    return {"main_cpu_s": float(main), "cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            "commands": int(r.info("stats")["total_commands_processed"]),
            "used_memory": int(r.info("memory")["used_memory"])}


def _snapshot(clients: list[Any], groups: dict[str, list[int]]) -> dict[str, Any]:
    from bench.queue_bench import proc_cpu_s

    return {"t": time.time(), "redis": [_redis_figures(r) for r in clients], "machine": _machine_cpu(),
            "groups": {name: sum(proc_cpu_s(p) or 0.0 for p in pids) for name, pids in groups.items()}}


def _sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.5))


def _bound_by(util: list[float], machine_busy: float, cpu_count: int, per_process: dict[str, float],
              other_cores: float) -> str:
    """What limited a run, in words: the Redis main threads' share of a core, the machine's cores, the
    Python processes' share of a core each (one core is all a Python process can use), or none."""
    top = max(util)
    if top >= SATURATED:
        return (f"redis: a cell's main thread used {top:.0%} of a core (>= {SATURATED:.0%}): the cells are "
                f"saturated")
    if machine_busy >= MACHINE_BUSY:
        other = (f" ({other_cores:.2f} cores of it other processes than this run's Redis, fake workers and "
                 f"producers)" if other_cores >= 0.2 else "")
        return (f"machine CPU: its {cpu_count} cores were {machine_busy:.0%} busy running the Python producers and "
                f"fake workers beside Redis{other}; the Redis cells were not saturated (busiest main thread "
                f"{top:.0%} of a core)")
    for group, share in per_process.items():
        if share >= SATURATED:
            return (f"{group.replace('_', ' ')}: each used {share:.0%} of a core on average (a Python process's "
                    f"limit); the machine's cores {machine_busy:.0%} busy, the Redis cells not saturated (busiest "
                    f"main thread {top:.0%} of a core)")
    return (f"neither: the machine's cores {machine_busy:.0%} busy, the busiest Redis main thread {top:.0%} of a "
            f"core, fake workers {per_process.get('fake_workers', 0):.0%} and producers "
            f"{per_process.get('producers', 0):.0%} of a core each; the closed loop's round trips (producers "
            f"waiting on answers) set the pace")


def run_cells(n: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One fleet of n cells: its figures (module docstring)."""
    import redis as redis_lib

    from stack.harness import RedisServer
    from vela2.wire.cells import Cell, CellMap, save_cells

    here = work / f"cells{n}"
    here.mkdir()
    servers: list[RedisServer] = []
    children: list[Child] = []
    clients: list[Any] = []
    try:
        for i in range(n):
            servers.append(RedisServer(here / f"redis{i}", aof=args.aof).start())
        cell_map = CellMap.even(Cell(f"c{i}", s.url()) for i, s in enumerate(servers))
        cells_file = here / "cells.json"
        save_cells(cell_map, cells_file)
        workers = [Child(f"worker c{i}.{k}", ["_worker", "--url", s.url(), "--model", MODEL],
                         here / f"worker{i}.{k}.log")
                   for i, s in enumerate(servers) for k in range(args.workers_per_cell)]
        children += workers
        run_tag = uuid.uuid4().hex[:6]
        producers = [Child(f"producer {k}", ["_producer", "--cells", str(cells_file), "--model", MODEL,
                                             "--tag", f"n{n}p{k}-{run_tag}-", "--batch", str(args.batch),
                                             "--chunk-size", str(args.chunk_size),
                                             "--final-timeout-s", str(args.final_timeout_s)],
                           here / f"producer{k}.log")
                     for k in range(args.producers_per_cell * n)]
        children += producers
        t_ready = time.monotonic()
        for c in children:
            if (said := c.line(READY_TIMEOUT_S)) != "ready":
                raise RuntimeError(f"{c.name} said {said!r}, not 'ready'")
        log.info("%d cells: %d fake workers and %d producers ready in %.1f s", n, len(workers), len(producers),
                 time.monotonic() - t_ready)
        clients = [redis_lib.Redis.from_url(s.url()) for s in servers]
        t_measure = time.time() + 0.2 + args.warmup_s
        t_end = t_measure + args.seconds
        for p in producers:
            p.send(f"{t_measure} {t_end}")
        groups = {"redis": [s.proc.pid for s in servers if s.proc is not None],
                  "fake_workers": [w.pid for w in workers], "producers": [p.pid for p in producers]}
        _sleep_until(t_measure)
        before = _snapshot(clients, groups)
        _sleep_until(t_end)
        after = _snapshot(clients, groups)
        load = os.getloadavg()
        got = [json.loads(p.line(args.final_timeout_s + 120)) for p in producers]  # the last batch, the final wait
        _reap(workers)
        stored = []
        for w in workers:
            with contextlib.suppress(RuntimeError, ValueError):
                stored.append(json.loads(w.line(5)))
        memory = [_redis_figures(r)["used_memory"] for r in clients]
    finally:
        for r in clients:
            r.close()
        _reap(children, 3.0)  # done by now, unless the run failed or was interrupted: then at once
        for s in servers:
            s.stop()
    wall = after["t"] - before["t"]
    per_cell = []
    for i, (b, a) in enumerate(zip(before["redis"], after["redis"], strict=True)):
        per_cell.append({"cell": cell_map.cells[i].name, "slots_share": round(cell_map.share(i), 4),
                         "redis_main_thread_cpu": round((a["main_cpu_s"] - b["main_cpu_s"]) / wall, 3),
                         "redis_process_cpu": round((a["cpu_s"] - b["cpu_s"]) / wall, 3),
                         "commands_per_s": round((a["commands"] - b["commands"]) / wall),
                         "used_memory_end_bytes": memory[i]})
    in_window = sum(g["answered_in_window"] for g in got)
    rps = in_window / wall
    util = [c["redis_main_thread_cpu"] for c in per_cell]
    busy_jiffies = after["machine"][0] - before["machine"][0]
    total_jiffies = after["machine"][1] - before["machine"][1]
    machine_busy = busy_jiffies / total_jiffies if total_jiffies else 0.0
    cpu_count = os.cpu_count() or 1
    main_cpu_s = sum(a["main_cpu_s"] - b["main_cpu_s"] for b, a in zip(before["redis"], after["redis"], strict=True))
    commands = sum(a["commands"] - b["commands"] for b, a in zip(before["redis"], after["redis"], strict=True))
    submitted = sum(g["submitted"] for g in got)
    cores = {k: round((after["groups"][k] - before["groups"][k]) / wall, 2) for k in groups}
    per_process = {k: round(cores[k] / len(groups[k]), 2) for k in ("fake_workers", "producers")}
    other_cores = round(max(0.0, machine_busy * cpu_count - sum(cores.values())), 2)  # the parent, and the rest
    answered = sum(g["answered"] for g in got)
    out = {
        "cells": n, "fake_workers": len(workers), "producers": len(producers), "window_s": round(wall, 2),
        "answered_in_window": in_window, "requests_per_s": round(rps, 1), "requests_per_s_per_cell": round(rps / n, 1),
        "submitted": submitted, "answered": answered, "lost": sum(g["lost"] for g in got),
        "not_ok": sum(g["not_ok"] for g in got), "answered_late": sum(g["answered_late"] for g in got),
        "stored_by_fake_workers": sum(s["requests"] for s in stored) if len(stored) == len(workers) else None,
        "fake_worker_crashes": [s["crashed"] for s in stored if s.get("crashed")],
        "batch_ms_p50_by_producer": [g["batch_ms"].get("p50") for g in got],
        "batch_ms_p99_by_producer": [g["batch_ms"].get("p99") for g in got],
        "per_cell": per_cell,
        "redis_main_thread_cpu": {"mean": round(sum(util) / n, 3), "max": round(max(util), 3),
                                  "sum_cores": round(sum(util), 3)},
        "redis_cpu_us_per_request": round(main_cpu_s * 1e6 / in_window, 1) if in_window else None,
        "redis_commands_per_request": round(commands / in_window, 2) if in_window else None,
        "cores_used": cores,
        "cores_used_per_process": per_process,
        "machine": {"cpu_count": cpu_count, "busy_share": round(machine_busy, 3),
                    "cores_busy": round(machine_busy * cpu_count, 2), "other_cores": other_cores,
                    "loadavg_1_5_15_at_end": [round(x, 2) for x in load]},
    }
    out["bound_by"] = _bound_by(util, machine_busy, cpu_count, per_process, other_cores)
    log.info("%d cells: %s req/s, Redis main threads %s, machine %.0f%% busy, lost %d", n, out["requests_per_s"],
             util, 100 * machine_busy, out["lost"])
    return out


def summary(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Ratios to one cell beside the goals, and what one cell carries."""
    out: dict[str, Any] = {"ratios": {}, "one_cell_carries": {}}
    base = runs.get(1)
    for n, r in runs.items():
        if base is not None and n != 1 and base["requests_per_s"]:
            ratio = r["requests_per_s"] / base["requests_per_s"]
            row: dict[str, Any] = {"throughput_ratio": round(ratio, 2)}
            if n in GOALS:
                row.update(goal=GOALS[n], met=ratio >= GOALS[n])
            out["ratios"][str(n)] = row
        mean_util = r["redis_main_thread_cpu"]["mean"]
        out["one_cell_carries"][str(n)] = {
            "requests_per_s": r["requests_per_s_per_cell"],
            "redis_main_thread_cpu": mean_util,
            "requests_per_s_per_redis_core": round(r["requests_per_s_per_cell"] / mean_util) if mean_util else None,
        }
    for n in GOALS:
        if str(n) not in out["ratios"]:
            out["ratios"][str(n)] = {"goal": GOALS[n], "met": None, "why": "not run (needs --cells 1 and "
                                     f"{n})" if n not in runs else "no one-cell figure"}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        return _worker_main(argv[1:])
    if argv[:1] == ["_producer"]:
        return _producer_main(argv[1:])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ap = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, nargs="+", default=[1, 2, 4], help="the cell counts to run, in turn")
    ap.add_argument("--workers-per-cell", type=int, default=2, help="fake worker processes per cell")
    ap.add_argument("--producers-per-cell", type=int, default=2, help="producer processes per cell")
    ap.add_argument("--seconds", type=float, default=20.0, help="the measured window of each cell count")
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--batch", type=int, default=64, help="requests per submit_many + results_many")
    ap.add_argument("--chunk-size", type=int, default=1, help="submit_many's chunk_size (requests per message)")
    ap.add_argument("--final-timeout-s", type=float, default=30.0,
                    help="how long a producer waits at the end for answers it still lacks")
    ap.add_argument("--aof", action="store_true", help="AOF on, appendfsync everysec (default: no persistence)")
    ap.add_argument("--out", default="bench/results/fleet.json")
    args = ap.parse_args(argv)
    from bench.report import git_commit, header, write_report
    from stack.harness import find_redis_server

    signal.signal(signal.SIGTERM, _interrupt)  # as Ctrl-C: the finally blocks stop every process group
    found = find_redis_server()
    version = subprocess.run([found[0], "--version"], capture_output=True, text=True, env=found[1]).stdout.strip() \
        if found else None
    report = header("bench.fleet", argv, commit=git_commit(ROOT))
    report.update({
        "redis": {"server": version,
                  "persistence": "AOF, appendfsync everysec" if args.aof else "none (no RDB, no AOF)"},
        "settings": {"workers_per_cell": args.workers_per_cell, "producers_per_cell": args.producers_per_cell,
                     "seconds": args.seconds, "warmup_s": args.warmup_s, "batch": args.batch,
                     "chunk_size": args.chunk_size, "model": MODEL, "answer": "stub (producer.testing.FakeWorker)"},
        "goals": {str(n): f">= {g}x requests/s of one cell" for n, g in GOALS.items()},
    })
    runs: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="vela2-fleet-") as tmp:
        for n in args.cells:
            runs[n] = run_cells(n, args, Path(tmp))
    report["runs"] = {str(n): r for n, r in runs.items()}
    report.update(summary(runs))
    report["bound_by"] = {str(n): r["bound_by"] for n, r in runs.items()}
    report["lost"] = sum(r["lost"] for r in runs.values())
    write_report(report, args.out, ensure_ascii=False)
    return 0 if report["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
