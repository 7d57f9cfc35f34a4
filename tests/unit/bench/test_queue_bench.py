"""bench.queue_bench end to end on this CPU: the cpu subcommand (ours vs plain Celery), and the gpu and
multi subcommands with tiny shapes, so that the GPU run works the first time. The three runs start
together (each its own redis-server and workers) and the tests read their JSON."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # bench/ is not an installed package; run from the repository
    sys.path.insert(0, str(ROOT))

from bench import queue_bench as qb  # noqa: E402


def test_gpu_defaults_are_the_issue_settings():
    args = qb.parse_args(["gpu"])
    assert (args.hidden, args.layers, args.intermediate, args.heads, args.kv_heads, args.window) == (
        4096, 36, 14336, 32, 8, 2048)
    assert (args.precision, args.row_tokens, args.attn, args.max_batch_tokens, args.max_wait_ms) == (
        "bf16", 2048, "sdpa", 65536, 20.0)
    assert args.copies == 2 and args.latency_s == 20.0 and args.latency_load == 0.5
    multi = qb.parse_args(["multi", "--device", "cpu"])
    assert multi.worker_counts == [1, 2, 4] and multi.precision == "fp32" and multi.copies == 4
    with pytest.raises(SystemExit):
        qb.parse_args(["multi", "--workers", "0,2"])
    with pytest.raises(SystemExit):
        qb.parse_args(["cpu", "--models", "demo,nope"])


def test_short_rows_are_deterministic_unique_and_short():
    a = qb.short_rows(30, "p-")
    assert a == qb.short_rows(30, "p-")
    assert len({r["id"] for r in a}) == 30 and all(r["id"].startswith("p-") for r in a)
    from bench.workload import count_words

    assert max(count_words(r["text"]) for r in a) <= 80
    assert {r["task"] for r in qb.short_rows(8, "x", groups=qb.CPU_GROUPS)} == set(qb.CPU_GROUPS)


def test_thread_profiles_charge_cpu_to_the_busy_thread():
    profiles = qb.ThreadProfiles()
    orig = threading.Thread.run
    try:
        profiles.install()

        def spin() -> None:
            t0 = time.thread_time()
            while time.thread_time() - t0 < 0.05:
                sum(range(1000))

        t = threading.Thread(target=spin, name="spinner")
        t.start()
        t.join()
        threads = profiles.summary()["threads"]  # also stops the main thread's profiler
    finally:
        threading.Thread.run = orig  # type: ignore[method-assign]
    assert threads["spinner"]["cpu_seconds"] >= 0.03
    assert any(k.endswith(":spin") for k in threads["spinner"]["cumulative"])
