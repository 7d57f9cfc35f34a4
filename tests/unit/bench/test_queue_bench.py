"""bench.queue_bench's parts that need no process: the gpu defaults, the short rows, the CPU profiles,
and its options (short help, --help-all, presets, --config)."""

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


def test_help_shows_the_main_options_and_help_all_every_group(capsys):
    for argv in (["gpu", "-h"], ["gpu", "--help-all"]):
        with pytest.raises(SystemExit) as e:
            qb.parse_args(argv)
        assert e.value.code == 0
    short, full = capsys.readouterr().out.split("usage:")[1:]

    def listed(flag: str, text: str) -> bool:  # an option's own line in the help
        return any(line.lstrip().startswith(flag + " ") or line.strip() == flag for line in text.splitlines()
                   if line.startswith("  -"))

    for flag in ("--out", "--redis-url", "--device", "--workers", "--copies", "--latency-s", "--preset", "--config"):
        assert listed(flag, short) and listed(flag, full), flag
    for flag in ("--layers", "--max-batch-tokens", "--skip-engine", "--deadline-s", "--latency-rate"):
        assert not listed(flag, short) and listed(flag, full), flag
    assert "more options: worker settings" in short and "--help-all lists them" in short
    assert "model shape:" in full and "phases:" in full and "limits and logs:" in full


def test_every_documented_flag_still_parses():
    from bench.queue_bench_options import OPTIONS

    # the 54 flags were these 47 of the three subcommands (--workers in gpu and in multi) and the two internal
    # workers' 7 (`_worker`, `_plain_worker`: the bench's own children, not shown)
    assert len(OPTIONS) == 47 and len({o.flag for o in OPTIONS}) == 46
    for cmd in ("cpu", "gpu", "multi"):
        for o in (o for o in OPTIONS if cmd in o.commands):
            argv = [cmd, o.flag] if o.kw.get("action") == "store_true" else [cmd, o.flag, _sample(o.flag)]
            assert getattr(qb.parse_args(argv), o.dest) is not None, argv


def _sample(flag: str) -> str:
    return {"--out": "/tmp/x.json", "--redis-url": "redis://127.0.0.1:6379/0", "--device": "cpu",
            "--precision": "fp32", "--tokenizer": "demo", "--models": "null", "--groups": "choice:snli",
            "--cache-dir": "/tmp/c", "--celery-pool": "solo", "--attn": "sdpa", "--model-name": "m",
            "--keep-logs": "/tmp/logs"}.get(flag, "2")


def test_presets_and_config_set_options_that_the_command_line_overrides(tmp_path):
    tiny = ["--device", "cpu", "--layers", "2", "--hidden", "128", "--copies", "1", "--tokenizer", "demo",
            "--max-batch-tokens", "8192", "--max-rows", "40"]
    by_hand = vars(qb.parse_args(["multi", *tiny, "--share-gpu", "--workers", "1,2"]))
    preset = vars(qb.parse_args(["multi", "--preset", "tiny"]))
    assert {k: v for k, v in preset.items() if by_hand[k] != v} == {"preset": "tiny"} | (
        {"deadline_at": preset["deadline_at"]} if preset["deadline_at"] != by_hand["deadline_at"] else {})
    assert qb.parse_args(["gpu", "--preset", "tiny"]).latency_s == 3.0
    config = tmp_path / "run.json"
    config.write_text('{"layers": 3, "max-batch-tokens": "4096", "workers": [1, 2]}')
    args = qb.parse_args(["multi", "--preset", "tiny", "--config", str(config), "--layers", "4"])
    assert (args.layers, args.max_batch_tokens, args.worker_counts, args.hidden) == (4, 4096, [1, 2], 128)
    assert args.options["layers"] == 4 and args.options["precision"] == "fp32"
    config.write_text('{"nope": 1}')
    with pytest.raises(SystemExit):
        qb.parse_args(["gpu", "--config", str(config)])
    cpu = qb.parse_args(["cpu", "--preset", "both-cores", "--celery-concurrency", "3"])
    assert (cpu.ours_workers, cpu.celery_pool, cpu.celery_concurrency) == (2, "prefork", 3)
    assert cpu.groups == qb.CPU_GROUPS and cpu.models == ["null", "demo"]
