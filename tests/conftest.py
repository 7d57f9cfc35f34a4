"""Fixtures of every test: the demo checkpoint and its model.

The demo is trained (about two minutes on one core) once per version of the code that makes it
(`vela2/`, and torch / transformers / tokenizers) and kept under `$XDG_CACHE_HOME/vela2-tests/demo/
<digest>/` (~/.cache by default): later runs, other clones of the same code and every xdist worker
copy it instead of training again, and a change to `vela2/` trains a new one, so the demo's tests
always measure the model the code under test makes.

Process fixtures (redis-server, workers, the HTTP route) live in tests/integration/conftest.py; a
unit test starts no process (tests/unit/conftest.py holds it to that).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repo root first: the checkout under test, not an installed copy
    sys.path.insert(0, str(ROOT))

from vela2.train.reproducible import pin  # noqa: E402

# The CPU kernels pinned before anything imports torch: the demo this suite trains (in this process) is
# the same bits on any x86-64 machine, as `vela2 init-demo`'s (vela2.train.reproducible).
assert "torch" not in sys.modules, "torch was imported before tests/conftest.py could pin its CPU kernels"
pin()

import vela2  # noqa: E402

DEMO_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vela2-tests" / "demo"


def demo_digest() -> str:
    """The identity of the code that makes the demo: every file of vela2/, the versions of the
    libraries it trains with, the machine's architecture."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "vela2").rglob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for dist in ("torch", "transformers", "tokenizers"):
        h.update(f"{dist}=={version(dist)}\0".encode())
    h.update(platform.machine().encode())
    return h.hexdigest()[:16]


DEMO_KEEP_S = 3600.0  # a cached demo unused this long is removed when another is trained


def copy_of_cached_demo(dest: Path) -> Path:
    """A copy at `dest` of the demo checkpoint of this code, trained now if no earlier run (or xdist
    worker) did; copied under the lock, so that no other session removes it meanwhile."""
    DEMO_CACHE.mkdir(parents=True, exist_ok=True)
    digest = demo_digest()
    done = DEMO_CACHE / digest / "ckpt"
    with FileLock(str(DEMO_CACHE / "train.lock")):
        if not (done / "config.json").exists():
            for old in DEMO_CACHE.iterdir():  # demos of older code, unused for a while: never used again
                # (one used within the hour may be another checkout's, running now: removing it made
                # two sessions on one machine retrain in turn behind the lock, and time out)
                if old.is_dir() and time.time() - old.stat().st_mtime > DEMO_KEEP_S:
                    shutil.rmtree(old, ignore_errors=True)
            partial = DEMO_CACHE / digest / "partial"
            shutil.rmtree(partial, ignore_errors=True)
            vela2.init_demo(partial)
            partial.rename(done)
        os.utime(done.parent)  # used now: kept while its code is in use
        return Path(shutil.copytree(done, dest))


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo checkpoint directory: a copy of the cached demo of this code (tests may write in it).

    VELA2_TEST_DEMO_DIR=DIR copies a checkpoint `vela2 init-demo` already wrote instead (an inner loop
    while the demo's code changes in ways that cannot change the model; CI never sets it)."""
    dest = tmp_path_factory.mktemp("demo") / "ckpt"
    if given := os.environ.get("VELA2_TEST_DEMO_DIR"):
        return Path(shutil.copytree(given, dest))
    return copy_of_cached_demo(dest)


@pytest.fixture(scope="session")
def untrained_demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model before training (seeded random weights) as a checkpoint: what the tests of
    `vela2 train` start from."""
    from vela2.model.checkpoint import save
    from vela2.train.demo_model import untrained_demo_model

    path = tmp_path_factory.mktemp("demo-untrained") / "ckpt"
    save(untrained_demo_model(), path)
    return path


@pytest.fixture(scope="session")
def demo_model(demo_dir: Path):
    """The demo model held in float32 (runs precision fp32 and bf16). Tests must not mutate it (a test
    that swaps its calibration restores it)."""
    import torch

    return vela2.load(demo_dir, dtype=torch.float32)


# Seconds of the longest tests (calls) of a `make test` run (--durations; 2 cores, -n 4). make test
# runs xdist's worksteal: each of the n workers starts with a contiguous 1/n of the list, and an idle
# worker steals from the tail of the busiest. So the long tests are dealt out, longest first, each
# to the head of the section with the least seconds so far, and the others fill the sections in
# their order: every worker starts on its share of long tests and the short ones balance the end
# (in collection order all of them landed in one worker's section: 18 minutes in a row).
LONGEST_S = {
    ("integration/worker/runtime/test_startup.py::"
     "test_compiled_kernels_land_in_the_compile_cache_dir"): 40,
    ("integration/worker/runtime/test_startup.py::"
     "test_health_answers_from_the_first_second_and_names_the_stage[celery with faults]"): 25,
    ("integration/worker/runtime/test_startup.py::"
     "test_health_answers_from_the_first_second_and_names_the_stage[vela2 worker]"): 20,
    "integration/producer/http/test_contract.py::test_schemathesis_finds_no_failure_against_the_route_and_a_worker": 92,
    "integration/test_dist.py::test_the_worker_extra_runs_the_model_on_the_pinned_torch": 100,
    "integration/stack/test_parity.py::test_parity_command_on_the_demo_checkpoint": 240,
    "integration/bench/test_reliability.py::test_queue_items_and_bad_id_scenarios_pass_at_a_tiny_scale": 70,
    "integration/vela2/model/test_attention.py::test_flex_equals_sdpa_on_random_packed_rows": 69,
    ("integration/worker/transport/test_sentinel.py::"
     "test_failovers_mid_run_are_measured_and_every_row_is_answered_or_reported"): 67,
    "integration/vela2/train/test_using_a_real_model.py::test_the_worked_example_runs": 57,
    "integration/worker/transport/test_sentinel.py::test_sentinels_with_a_password_of_their_own": 52,
    "integration/worker/transport/test_amqp.py::test_a_request_that_kills_every_worker_is_dead_lettered": 44,
    ("integration/worker/engine/test_dead_letter.py::"
     "test_a_request_that_kills_every_worker_ends_in_the_dead_letter_list"): 40,
    ("integration/worker/test_worker.py::"
     "test_sigkill_with_requests_buffered_and_mid_batch_then_another_worker_answers_all"): 40,
    "integration/bench/test_reliability.py::test_malformed_and_oom_scenarios_lose_nothing_and_write_the_report": 38,
    "integration/worker/test_worker.py::test_worker_answers_equal_predict[device-process]": 32,
    "integration/worker/test_worker.py::test_warm_shutdown_finishes_or_returns_everything_it_holds[device-process]": 31,
    "integration/bench/test_workload.py::test_gpu_engine_runs_end_to_end_on_cpu": 29,
    ("integration/worker/transport/test_amqp.py::"
     "test_quorum_queues_ack_after_store_prefetch_bound_and_warm_shutdown"): 28,
    "integration/worker/test_worker.py::test_warm_shutdown_finishes_or_returns_everything_it_holds[device-thread]": 27,
    "integration/worker/transport/test_amqp.py::test_online_requests_overtake_a_backfill_backlog": 25,
    "integration/worker/test_worker.py::test_worker_answers_equal_predict[render-processes]": 25,
    "integration/worker/runtime/test_startup.py::test_a_worker_that_cannot_start_exits_2_with_one_line": 25,
    "integration/worker/test_priority.py::test_online_requests_overtake_a_backfill_backlog": 21,
    "unit/vela2/text/test_rendering.py::test_two_million_characters_of_long_words_stay_bounded": 21,
    "integration/worker/test_worker.py::test_bad_input_never_harms_a_batch_or_the_worker": 21,
    ("integration/worker/transport/test_amqp.py::"
     "test_deliveries_that_are_no_messages_of_ours_are_answered_or_dead_lettered"): 21,
    "integration/worker/transport/test_amqp.py::test_a_killed_workers_messages_are_redelivered_at_once": 21,
    "integration/worker/test_worker.py::test_worker_answers_equal_predict[render-threads]": 19,
    ("integration/worker/transport/test_sentinel.py::"
     "test_bad_and_unreachable_sentinel_urls_end_the_worker_with_one_line"): 18,
    ("integration/worker/runtime/test_device.py::"
     "test_a_device_process_that_dies_takes_the_worker_with_its_exit_code"): 18,
    "integration/worker/test_worker.py::test_a_live_worker_keeps_what_it_holds_past_the_visibility_timeout": 18,
    ("integration/worker/transport/test_brokers.py::"
     "test_bad_and_unreachable_broker_urls_end_the_worker_with_one_line"): 18,
    ("integration/worker/test_jobs.py::"
     "test_a_job_outlives_its_submitter_is_cancelled_halfway_and_reads_back_in_order"): 17,
    ("integration/worker/transport/test_amqp.py::"
     "test_unreachable_and_refusing_rabbitmq_end_the_worker_with_one_line"): 17,
    "integration/producer/testing/test_fake_worker.py::test_the_fake_worker_stores_what_the_real_worker_stores": 16,
    "integration/stack/test_demo.py::test_demo_runs_on_fakeredis_when_redis_server_is_missing": 16,
    "integration/worker/test_worker.py::test_worker_refuses_a_visibility_timeout_shorter_than_its_worst_case": 15,
    "integration/worker/test_priority.py::test_expired_requests_are_answered_expired_not_scored": 15,
    "integration/worker/obs/test_fleet.py::test_a_worker_refuses_a_model_name_served_from_another_checkpoint": 15,
    "integration/vela2/train/test_importing.py::test_streamed_import_peak_memory": 15,
    ("integration/worker/transport/test_sentinel.py::"
     "test_with_wait_replicas_the_worker_acks_only_what_a_replica_holds"): 14,
    "unit/vela2/train/test_training.py::test_heads_only_training_lowers_loss_and_beats_untrained": 14,
    "integration/producer/http/test_routes.py::test_readyz_follows_the_workers_heartbeats": 14,
    "integration/worker/transport/test_sentinel.py::test_a_worker_and_a_client_meet_through_sentinel": 13,
    "integration/worker/runtime/test_cpu_procs.py::test_a_process_that_dies_answers_its_rows_and_is_replaced": 13,
    "integration/worker/test_jobs.py::test_an_openai_batch_file_gives_openai_shaped_lines_in_input_order": 12,
    "integration/worker/runtime/test_startup.py::test_a_worker_started_while_redis_is_full_waits_and_then_answers": 12,
    "integration/worker/transport/test_brokers.py::test_a_worker_takes_from_one_redis_and_stores_in_another": 12,
    "integration/worker/obs/test_fleet.py::test_a_worker_describes_itself_and_vela2_status_shows_it": 12,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if workers < 2 or not items:
        return
    long_items = sorted((it for it in items if it.nodeid.removeprefix("tests/") in LONGEST_S),
                        key=lambda it: -LONGEST_S[it.nodeid.removeprefix("tests/")])
    rest = [it for it in items if it.nodeid.removeprefix("tests/") not in LONGEST_S]
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for it in long_items:
        k = load.index(min(load))
        heads[k].append(it)
        load[k] += LONGEST_S[it.nodeid.removeprefix("tests/")]
    # section k: its long tests, then short ones up to len(items) / workers (worksteal's first split)
    size, ordered = len(items) // workers, []
    for k in range(workers):
        take = max(0, (size if k < workers - 1 else len(items)) - len(heads[k]))
        ordered += heads[k] + rest[:take]
        rest = rest[take:]
    items[:] = ordered + rest
