"""The options of `python -m bench.queue_bench cpu | gpu | multi`, grouped so that a user sees the few
that matter.

`-h` on a subcommand shows its main options (what a run usually sets: where the JSON goes, the
Redis to use, how many rows / workers, the device); `--help-all` shows every option, by group:

- worker settings: what every `vela2 worker` of the run is started with (batch tokens, waits,
  buffers, render threads; on the cpu side OMP threads, processes);
- model shape (gpu, multi): the random-weight model's shape and precision;
- workload: the rows (how many copies, a cut, the seed, the warm-up);
- phases: what each subcommand measures besides the headline (plain Celery's pool on the cpu side,
  the engine-alone and latency phases of gpu, multi's settle pause);
- limits and logs: the wall-clock budget, the logs kept, the profile.

Several options at once: `--preset NAME` (PRESETS: e.g. `gpu --preset tiny`, the tiny shapes on a
CPU) and `--config FILE` (a JSON object of option -> value, option names as the flags are spelled,
without the dashes). A value comes from, last one winning: the subcommand's default, the preset,
the config file, the command line. The JSON a run writes records every value under `options`.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMMANDS = {
    "cpu": "backfill rows/s through Redis + worker vs plain Celery (this machine)",
    "gpu": "engine alone vs the queue path, and online latency (GPU)",
    "multi": "the queue path with 1, 2 (, 4) workers: scaling, none lost",
}
GROUPS = ("main options", "worker settings", "model shape", "workload", "phases", "limits and logs")
ALL = ("cpu", "gpu", "multi")
GPU = ("gpu", "multi")


@dataclass(frozen=True)
class Option:
    """One flag: its group, the subcommands that take it, its default per subcommand, and the
    subcommands whose `-h` shows it (`main`)."""

    flag: str
    group: str
    commands: tuple[str, ...]
    default: dict[str, Any]
    help: str
    main: tuple[str, ...] = ()
    kw: dict[str, Any] = field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _opt(flag: str, group: str, commands: tuple[str, ...], default: Any, help: str, main: tuple[str, ...] = (),
         **kw: Any) -> Option:
    per = default if isinstance(default, dict) else dict.fromkeys(commands, default)
    return Option(flag, group, commands, per, help, main, kw)


W, M, L, P, T = "worker settings", "model shape", "workload", "phases", "limits and logs"
OPTIONS: list[Option] = [
    # where the run goes
    _opt("--out", T, ALL, {"cpu": "bench/results/cpu-queue.json", "gpu": "bench/results/gpu-queue.json",
                           "multi": "bench/results/gpu-multi.json"}, "JSON file to write", main=ALL),
    _opt("--redis-url", T, ALL, None, "use this Redis instead of starting a redis-server", main=ALL),
    _opt("--device", M, GPU, "cuda", "cuda (the engine alone on GPU 0, worker K on GPU K) or cpu", main=GPU),
    _opt("--workers", W, ("gpu",), 1, "worker processes (one per GPU unless --share-gpu)", main=("gpu",), type=int),
    _opt("--workers", W, ("multi",), "1,2,4", "comma list of worker counts (those over the GPUs skip)",
         main=("multi",)),
    _opt("--share-gpu", W, GPU, False, "every worker on the one --device", main=("multi",), action="store_true"),
    # the vela2 workers
    _opt("--chunk-size", W, ALL, {"cpu": 64, "gpu": 4, "multi": 4}, "rows per backfill message (submit_many)",
         type=int),
    _opt("--max-wait-ms", W, ALL, 20.0, "worker: longest wait for a bucket to fill", type=float),
    _opt("--max-buffered", W, ALL, {"cpu": 64, "gpu": 64, "multi": 32}, "worker: messages held at once (prefetch)",
         type=int),
    _opt("--render-threads", W, ALL, {"cpu": 1, "gpu": 2, "multi": 2}, "worker: render / decode threads", type=int),
    _opt("--max-batch-tokens", W, ALL, {"cpu": 16384, "gpu": 65536, "multi": 65536},
         "worker (and engine): padded tokens per batch", type=int),
    _opt("--cpu-processes", W, ("cpu",), None, "the vela2 workers' render / decode processes (worker setting "
         "cpu_processes; default: its auto, none on a CPU: render threads)", main=("cpu",), type=int),
    _opt("--ours-workers", W, ("cpu",), 1, "vela2 worker processes per model (the issue's figure: 1)", type=int),
    _opt("--torch-threads", W, ("cpu",), 1, "OMP_NUM_THREADS of the vela2 workers (0 = torch's default, all cores)",
         type=int),
    _opt("--precision", W, GPU, None, "default bf16 on cuda, fp32 on cpu", choices=("bf16", "fp32")),
    _opt("--row-tokens", W, GPU, 2048, "worker / engine row packing (0 = off)", type=int),
    _opt("--attn", W, GPU, "sdpa", "attention backend: sdpa | flex"),
    # the model (gpu, multi: random weights)
    _opt("--layers", M, GPU, 36, "decoder layers", type=int),
    _opt("--hidden", M, GPU, 4096, "hidden size", type=int),
    _opt("--intermediate", M, GPU, None, "MLP width (default 3.5 x hidden)", type=int),
    _opt("--heads", M, GPU, None, "attention heads (default hidden / 128)", type=int),
    _opt("--kv-heads", M, GPU, None, "KV heads (default heads / 4)", type=int),
    _opt("--window", M, GPU, 2048, "config.max_window_tokens", type=int),
    _opt("--tokenizer", M, GPU, "bench", "bench: bench.gpu_engine's ~1.2 tokens/word tokenizer; demo: faster to "
         "build (tests)", choices=("bench", "demo")),
    _opt("--model-name", M, GPU, "vela2-bench", "the checkpoint's model name"),
    # the rows
    _opt("--rows", L, ("cpu",), 3000, "short rows per round", main=("cpu",), type=int),
    _opt("--repeats", L, ("cpu",), 3, "rounds (ours, then plain); the best of each counts", main=("cpu",), type=int),
    _opt("--models", L, ("cpu",), "null,demo", "comma list of null | demo; the first is the headline `ours`, "
         "others `ours_<kind>`", main=("cpu",)),
    _opt("--groups", L, ("cpu",), None, "bench.workload groups of the short rows (default: CPU_GROUPS)"),
    _opt("--cache-dir", L, ("cpu",), ".cache/queue-bench", "where the checkpoints are written (once)"),
    _opt("--copies", L, GPU, {"gpu": 2, "multi": 4}, "copies of the 240-row workload", main=GPU, type=int),
    _opt("--max-rows", L, GPU, None, "only the first N rows (smoke tests)", type=int),
    _opt("--seed", L, GPU, 0, "workload seed", type=int),
    _opt("--queue-warmup-rows", L, GPU, 24, "rows through the queue before timing", type=int),
    # what else each subcommand measures
    _opt("--celery-pool", P, ("cpu",), "solo", "plain Celery worker pool: solo | prefork | threads"),
    _opt("--celery-concurrency", P, ("cpu",), 1, "plain Celery worker processes / threads", type=int),
    _opt("--celery-prefetch", P, ("cpu",), 4, "plain Celery worker_prefetch_multiplier", type=int),
    _opt("--skip-engine", P, ("gpu",), False, "no engine-alone measurement", action="store_true"),
    _opt("--engine-warmup-rows", P, ("gpu",), 240, "rows of the engine's warm-up predict", type=int),
    _opt("--latency-s", P, ("gpu",), 20.0, "length of the latency phase (0 = none)", main=("gpu",), type=float),
    _opt("--latency-load", P, ("gpu",), 0.5, "latency arrival rate / queue-path rows/s", type=float),
    _opt("--latency-rate", P, ("gpu",), None, "latency arrivals per second (overrides)", type=float),
    _opt("--settle-s", P, ("multi",), 2.0, "pause before re-reading every stored answer", type=float),
    # budget and diagnostics
    _opt("--timeout-s", T, ALL, 480.0, "longest wait for the results of one phase", type=float),
    _opt("--deadline-s", T, ALL, 540.0, "the whole run's budget: phases are cut short or skipped so that the "
         "JSON is written in time", type=float),
    _opt("--keep-logs", T, ALL, None, "copy the worker logs to this directory at the end"),
    _opt("--profile", T, ("cpu",), False, "sample the vela2 worker's thread stacks into the JSON",
         action="store_true"),
]

# --preset NAME: several options at once (the command line and --config still win).
_TINY = {"device": "cpu", "layers": 2, "hidden": 128, "copies": 1, "tokenizer": "demo", "max_batch_tokens": 8192,
         "max_rows": 40}
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "cpu": {
        "smoke": {"rows": 120, "repeats": 1, "models": "null"},  # a minute's check of the path
        "both-cores": {"ours_workers": 2, "celery_pool": "prefork", "celery_concurrency": 2},  # both sides, 2 cores
    },
    "gpu": {"tiny": {**_TINY, "latency_s": 3.0}},  # the gpu subcommand end to end on a CPU
    "multi": {"tiny": {**_TINY, "share_gpu": True, "workers": "1,2"}},  # two workers sharing the CPU
}


def options(cmd: str) -> list[Option]:
    return [o for o in OPTIONS if cmd in o.commands]


class HelpAll(argparse.Action):
    """--help-all: print the subcommand's every option, by group, and exit."""

    def __init__(self, option_strings: list[str], dest: str, cmd: str = "", **kw: Any):
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs=0, **kw)
        self.cmd = cmd

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        build(full=True)[1][self.cmd].print_help()
        parser.exit()


def _more(cmd: str) -> str:
    """The line under `-h`: how many options each group holds beyond the main ones."""
    counts = {g: sum(1 for o in options(cmd) if o.group == g and cmd not in o.main) for g in GROUPS}
    listed = ", ".join(f"{g} ({n})" for g, n in counts.items() if n)
    return f"{sum(counts.values())} more options: {listed}; --help-all lists them."


def build(full: bool = False) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser and its subparsers; `full`: every option shown, by group (else the main ones)."""
    ap = argparse.ArgumentParser(prog="python -m bench.queue_bench", description="Queue-path benchmarks: rows through "
                                 "Redis and `vela2 worker` processes, against the engine alone and plain Celery.",
                                 epilog="`CMD -h` shows a subcommand's main options, `CMD --help-all` every option, "
                                 "by group.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    subs = {}
    for cmd, what in COMMANDS.items():
        p = subs[cmd] = sub.add_parser(cmd, help=what, description=what, epilog=None if full else _more(cmd))
        p.add_argument("--help-all", action=HelpAll, cmd=cmd, help="show every option, by group, and exit")
        p.add_argument("--preset", choices=sorted(PRESETS[cmd]), default=None,
                       help="; ".join(f"{k}: {_spelled(v)}" for k, v in PRESETS[cmd].items()))
        p.add_argument("--config", metavar="FILE", default=None, help="a JSON object of option -> value")
        groups = {g: p.add_argument_group(g) if full and g != GROUPS[0] else p for g in GROUPS}
        for o in options(cmd):
            shown = full or cmd in o.main
            where = groups[GROUPS[0] if cmd in o.main else o.group]
            default = o.default[cmd]
            text = o.help + ("" if default in (None, False) or "action" in o.kw else f" (default {default})")
            where.add_argument(o.flag, dest=o.dest, default=None, help=text if shown else argparse.SUPPRESS, **o.kw)
    return ap, subs


def _spelled(values: dict[str, Any]) -> str:
    return " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in values.items())


def _config(p: argparse.ArgumentParser, path: str, cmd: str) -> dict[str, Any]:
    """--config FILE: option -> value, each converted as its flag converts it."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        p.error(f"--config {path}: {e}")
    if not isinstance(raw, dict):
        p.error(f"--config {path}: a JSON object of option -> value; got {type(raw).__name__}")
    known = {o.dest: o for o in options(cmd)}
    values = {}
    for key, value in raw.items():
        o = known.get(str(key).lstrip("-").replace("-", "_"))
        if o is None:
            p.error(f"--config {path}: {key!r} is no option of {cmd}")
        convert = o.kw.get("type")
        if isinstance(value, list):  # a comma list (--models, --groups, multi's --workers) as a JSON list
            value = ",".join(map(str, value))
        values[o.dest] = convert(value) if convert is not None and value is not None else value
    return values


def resolve(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """Every option's value: the default, then the preset, the config file, the command line."""
    values = {o.dest: o.default[args.cmd] for o in options(args.cmd)}
    values.update(PRESETS[args.cmd].get(args.preset or "", {}))
    if args.config:
        values.update(_config(p, args.config, args.cmd))
    values.update({o.dest: getattr(args, o.dest) for o in options(args.cmd) if getattr(args, o.dest) is not None})
    return values


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The subcommand and its options, every value resolved (see the module docstring)."""
    ap, subs = build()
    args = ap.parse_args(argv)
    p = subs[args.cmd]
    values = resolve(p, args)
    for key, value in values.items():
        setattr(args, key, value)
    args.deadline_at = time.monotonic() + args.deadline_s
    if args.cmd == "cpu":
        _check_cpu(p, args)
    else:
        args.precision = args.precision or ("fp32" if args.device == "cpu" else "bf16")
        args.heads = args.heads or max(1, args.hidden // 128)
        args.kv_heads = args.kv_heads or max(1, args.heads // 4)
        args.intermediate = args.intermediate or int(args.hidden * 3.5)
    if args.cmd == "multi":
        try:
            args.worker_counts = [int(x) for x in str(args.workers).split(",")]
        except ValueError:
            p.error(f"--workers must be a comma list of integers; got {args.workers!r}")
        if any(k < 1 for k in args.worker_counts):
            p.error(f"--workers must be >= 1 each; got {args.workers!r}")
    args.options = {key: getattr(args, key) for key in values}  # what the run used, for its JSON
    return args


def _check_cpu(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from bench.queue_bench import CPU_GROUPS
    from bench.workload import GROUPS as WORKLOAD_GROUPS

    args.groups = tuple(args.groups.split(",")) if args.groups else CPU_GROUPS
    if set(args.groups) - set(WORKLOAD_GROUPS):
        p.error(f"--groups: unknown {sorted(set(args.groups) - set(WORKLOAD_GROUPS))}")
    args.models = args.models.split(",")
    if not args.models or set(args.models) - {"null", "demo"} or len(set(args.models)) != len(args.models):
        p.error(f"--models must be distinct names from null,demo; got {','.join(args.models)!r}")
