"""Cold start of a worker (issue 37): from launch to /readyz 200, stage by stage, and the first
request after ready against the steady lone-request latency, for a checkpoint with real shard files.

    python -m bench.coldstart --out bench/results/gpu-coldstart.json            # the GPU machine: 9b, 1.5b
    python -m bench.coldstart --device cpu --shapes tiny --tokenizer demo --lone 5 \
        --out /tmp/coldstart.json                                                # a CPU smoke run

For each shape (bench.hotpath's SHAPES, seeded random weights) the run writes a checkpoint of
--shard-gb shards with `vela2.save` (config, tokenizer, calibration, weights, manifest.json), then:
write          seconds to write it, and to hash it once more (what a start without a manifest pays).
read_rates     GB/s of the disk (page cache dropped first) and of the page cache (read again) reading
               the weight files in --threads threads: the yardsticks of the loader.
loader         vela2.load onto the device, cold (page cache dropped) and warm: GB/s of weights.
starts         `python -m worker.cli` launched as an autoscaler launches it, in this order:
               cold_empty_cache  page cache dropped, a fresh --compile-cache-dir
               cold              page cache dropped, the compile cache the first start filled
               warm              nothing dropped (a restart on the same node)
               each: /livez first 200 and /readyz 200 (seconds from launch, polled every 20 ms),
               the worker's own start-up stages (its "start-up: <stage> (<s> s)" log lines), the
               first request after ready and --lone requests one at a time after it (ms).
before_warm    (--before DIR: a checkout of the code before issue 37) a warm start of it, its torch
               caches (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) those the new code's starts filled.
"Page cache dropped": /proc/sys/vm/drop_caches when writable (everything, as after a reboot), else
posix_fadvise(DONTNEED) on the checkpoint's files (`drop` in the JSON says which).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.hotpath import SHAPES, _free_device, add_serving_arguments, parse_shapes, shape_arguments, shapes_report
from bench.queue_bench import bench_redis, short_rows, write_bench_checkpoint

log = logging.getLogger("bench.coldstart")

GOALS_9B = {"warm_ready_s": 15.0, "cold_ready_s": 25.0, "cold_empty_cache_ready_s": 45.0,
            "first_vs_lone_p50": 2.0, "livez_s": 2.0}
STAGE_LINE = re.compile(r"start-up: (.+?) \((\d+(?:\.\d+)?) s\)")
READ_BLOCK = 16 << 20


def drop_page_cache(files: list[Path]) -> str:
    """Drop the page cache: all of it when allowed (root, a writable /proc/sys), else `files`'."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"


def read_rate(files: list[Path], threads: int) -> float:
    """GB/s reading `files` whole, `threads` files at a time (16 MB reads)."""
    def read(f: Path) -> int:
        buf, n = bytearray(READ_BLOCK), 0
        with open(f, "rb", buffering=0) as fh:
            while got := fh.readinto(buf):
                n += got
        return n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(read, files))
    return total / 1e9 / (time.perf_counter() - t0)


def write_checkpoint(shape: str, work: Path, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """A checkpoint of `shape` with its weights in shard files; what writing and hashing took."""
    import vela2
    from vela2.model import manifest
    from vela2.model.checkpoint import serving_dtype

    shape_args = shape_arguments(shape, args, f"vela2-cs-{shape}")
    ckpt = write_bench_checkpoint(work / f"ckpt-{shape}", shape_args)
    model = vela2.load(ckpt, device=args.device, dtype=serving_dtype(args.precision), random_weights=True)
    t0 = time.perf_counter()
    vela2.save(model, ckpt, shard_max_bytes=int(args.shard_gb * 1e9))
    write_s = time.perf_counter() - t0
    model.to("meta")
    del model
    _free_device(args.device)
    t0 = time.perf_counter()
    manifest.full_digest(ckpt)
    files = sorted(ckpt.glob("*.safetensors"))
    return ckpt, {"weights_gb": round(sum(f.stat().st_size for f in files) / 1e9, 2), "files": len(files),
                  "write_and_manifest_s": round(write_s, 1), "hash_every_byte_s": round(time.perf_counter() - t0, 1)}


def loader_rates(ckpt: Path, files: list[Path], args: argparse.Namespace) -> dict[str, Any]:
    """vela2.load onto the device with the page cache dropped, then warm: GB/s of weights."""
    import vela2
    from vela2.model.checkpoint import serving_dtype

    size = sum(f.stat().st_size for f in files) / 1e9
    out: dict[str, Any] = {}
    for kind in ("cold", "warm"):
        if kind == "cold":
            out["drop"] = drop_page_cache(files)
        t0 = time.perf_counter()
        model = vela2.load(ckpt, device=args.device, dtype=serving_dtype(args.precision))
        if args.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        out[f"{kind}_s"], out[f"{kind}_gb_s"] = round(seconds, 2), round(size / seconds, 2)
        if kind == "warm":
            out["same_as_safetensors"] = same_as_safetensors(model, files)
        model.to("meta")
        del model
        _free_device(args.device)
    return out


def same_as_safetensors(model: Any, files: list[Path]) -> bool:
    """Whether the first, middle and last tensor of every file, read by safetensors itself and cast
    as the model holds it, equal the loaded parameters bit for bit (the loader's own check)."""
    import torch
    from safetensors import safe_open

    state = model.state_dict()
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            names = list(sf.keys())
            for name in {names[0], names[len(names) // 2], names[-1]}:
                want = sf.get_tensor(name).to(state[name].dtype)
                if not torch.equal(state[name].cpu(), want):
                    log.error("%s differs from the file's %s", name, f.name)
                    return False
    return True


def _get(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def one_start(tag: str, ckpt: Path, url: str, cache: Path, work: Path, args: argparse.Namespace,
              before: str | None = None) -> dict[str, Any]:
    """Launch `python -m worker.cli` (of the checkout `before`, if given), watch its health from
    launch to ready, then time requests."""
    from producer.client import Client
    from stack.harness import WorkerProcess, free_port
    from vela2.config import Vela2Config

    port = free_port()
    settings = {"device": args.device, "precision": args.precision, "row_tokens": args.row_tokens,
                "attn": args.attn, "max_batch_tokens": args.max_batch_tokens, "max_wait_ms": args.max_wait_ms,
                "metrics_port": port}
    command = [sys.executable, "-m", "worker.cli"]
    env: dict[str, str] = {}
    if before is None:
        settings["compile_cache_dir"] = str(cache)
    else:  # the old code first on the path; torch's caches where the new code's runs left them
        command = [sys.executable, "-c", f"import sys; sys.path.insert(0, {before!r}); from worker.cli import main; "
                   "sys.exit(main(sys.argv[1:]))"]
        env = {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton"),
               "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    launched = time.monotonic()
    w = WorkerProcess.start(url, ckpt, work / f"worker-{tag}.log", name=tag, env=env, command=command, **settings)
    out: dict[str, Any] = {}
    try:
        while time.monotonic() - launched < args.ready_timeout_s and w.alive():
            now = time.monotonic() - launched
            if "livez_s" not in out and _get(port, "/livez") == 200:
                out["livez_s"] = round(now, 2)
            if _get(port, "/readyz") == 200:
                out["ready_s"] = round(now, 2)
                break
            time.sleep(0.02)
        if "ready_s" not in out:
            raise RuntimeError(f"{tag}: not ready in {args.ready_timeout_s} s:\n{w.log()[-3000:]}")
        out["stages"] = [{"stage": m.group(1), "at_s": float(m.group(2))} for m in STAGE_LINE.finditer(w.log())
                         if not m.group(1).startswith("loading weights: ") or m.group(1).endswith(" GB")]
        out["log"] = [line for line in w.log().splitlines() if re.search(r"warm-up|loaded |engine ready", line)]
        client = Client(url, model=Vela2Config.read(ckpt).name)
        client.redis.ping()  # the client's own first connection is not the worker's first request
        rows = short_rows(args.lone + 1, f"{tag}-", seed=args.seed)
        lone = []
        for row in rows:
            t0 = time.perf_counter()
            res = client.result(client.submit(row), timeout_s=120)
            lone.append((time.perf_counter() - t0) * 1e3)
            if res.status.value != "ok":
                raise RuntimeError(f"{tag}: {row['id']} answered {res.status}")
        client.close()
        first, steady = lone[0], statistics.median(lone[1:])
        out["first_request_ms"], out["lone_p50_ms"] = round(first, 1), round(steady, 1)
        out["first_vs_lone_p50"] = round(first / steady, 2)
    finally:
        out["exit"] = w.terminate(120)
        if args.log_dir:
            Path(args.log_dir).mkdir(parents=True, exist_ok=True)
            (Path(args.log_dir) / w.log_path.name).write_text(w.log())
    return out


def run_shape(shape: str, work: Path, args: argparse.Namespace, record: dict[str, Any], emit: Any) -> None:
    """Everything of one shape (see the module docstring) into `record`; `emit` writes the report."""
    ckpt, record["write"] = write_checkpoint(shape, work, args)
    emit()
    files = sorted(ckpt.glob("*.safetensors"))
    drop = drop_page_cache(files)
    record["read_rates"] = {"drop": drop, "threads": args.threads,
                            "disk_gb_s": round(read_rate(files, args.threads), 2),
                            "page_cache_gb_s": round(read_rate(files, args.threads), 2)}
    record["loader"] = loader_rates(ckpt, files, args)
    log.info("%s: %s, %s", shape, record["read_rates"], record["loader"])
    emit()
    record["starts"] = {}
    cache = work / f"compile-cache-{shape}"
    with bench_redis(work / f"redis-{shape}", args.redis_url) as (url, _, _):
        for tag, drop_first in (("cold_empty_cache", True), ("cold", True), ("warm", False)):
            if drop_first:
                record["starts"][f"{tag}_drop"] = drop_page_cache(files)
            record["starts"][tag] = one_start(f"{shape}-{tag}", ckpt, url, cache, work, args)
            log.info("%s %s: %s", shape, tag, {k: v for k, v in record["starts"][tag].items() if k != "log"})
            emit()
        if args.before:
            record["before_warm"] = one_start(f"{shape}-before", ckpt, url, cache, work, args,
                                              before=str(Path(args.before).resolve()))
            emit()
    if shape == "9b":
        s = record["starts"]
        got = {"warm_ready_s": s["warm"]["ready_s"], "cold_ready_s": s["cold"]["ready_s"],
               "cold_empty_cache_ready_s": s["cold_empty_cache"]["ready_s"],
               "first_vs_lone_p50": max(s[t]["first_vs_lone_p50"] for t in ("cold_empty_cache", "cold", "warm")),
               "livez_s": max(s[t]["livez_s"] for t in ("cold_empty_cache", "cold", "warm"))}
        record["goals"] = {k: {"goal": v, "got": got[k], "met": got[k] <= v} for k, v in GOALS_9B.items()}


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.coldstart", description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="9b,1.5b", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--precision", default=None, help="default bf16 on cuda, fp32 on cpu")
    add_serving_arguments(ap)
    ap.add_argument("--shard-gb", type=float, default=2.0, help="weight shard size (the 9b shape: 8 shards)")
    ap.add_argument("--threads", type=int, default=8, help="threads of the raw read-rate yardstick")
    ap.add_argument("--lone", type=int, default=30, help="requests one at a time after the first")
    ap.add_argument("--ready-timeout-s", type=float, default=300.0)
    ap.add_argument("--before", default=None, help="a checkout of the code before issue 37: its warm start too")
    ap.add_argument("--work-dir", default=None, help="where checkpoints go (default a temporary directory)")
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--log-dir", default=None, help="keep each worker's log here")
    ap.add_argument("--out", default="bench/results/gpu-coldstart.json")
    args = ap.parse_args(argv)
    parse_shapes(ap, args)
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    report = shapes_report("bench.coldstart", argv, args.device)
    out = Path(args.out)
    lock = threading.Lock()

    def emit() -> None:
        with lock:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")

    with tempfile.TemporaryDirectory(prefix="vela2-coldstart-", dir=args.work_dir) as tmp:
        for shape in args.shapes:
            report["shapes"][shape] = {}
            run_shape(shape, Path(tmp), args, report["shapes"][shape], emit)
            emit()
    log.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
