"""Render / decode processes: the same answers as predict(), rows held between render and decode go
when dropped, and a process that dies has its rows answered and is replaced."""

from __future__ import annotations

import os
import queue
import signal
import time

import pytest

from bench.queue_bench import short_rows
from vela2.errors import ModelError
from vela2.scoring.pipeline import run_batch
from vela2.wire.messages import request_digest
from worker.runtime.cpu_procs import CpuProcesses, Rendered


@pytest.fixture
def procs(demo_dir, demo_model):
    p = CpuProcesses(str(demo_dir), demo_model.name, 2, demo_model.digest, "fp32")
    done: queue.SimpleQueue = queue.SimpleQueue()
    p.on_done = lambda op, key, fut, cpu_s: done.put((op, key, fut, cpu_s))
    p.start()
    yield p, done
    p.close()


def _collect(done, n: int, timeout_s: float = 60.0) -> dict:
    out, deadline = {}, time.monotonic() + timeout_s
    while len(out) < n:
        op, key, fut, cpu_s = done.get(timeout=max(0.01, deadline - time.monotonic()))
        out[key] = (op, fut, cpu_s)
    return out


def test_rows_rendered_and_decoded_in_processes_equal_the_same_steps_in_process(procs, demo_model):
    from vela2.scoring.pipeline import finish, prepare

    p, done = procs
    rows = short_rows(12, "cp-")
    for k, row in enumerate(rows, 1):
        p.render(k, row)
    p.render(99, {"id": "bad", "task": "choice:x", "text": "t", "questions": [{"question": "q", "options": ["a"]}]})
    p.flush()
    rendered = _collect(done, len(rows) + 1)
    assert isinstance(rendered[99][1].exception(), Exception)  # the invalid row: its error comes back
    outputs = {}
    timings = {"queue_ms": 1.0, "model_ms": 2.0}
    for k, row in enumerate(rows, 1):
        op, fut, cpu_s = rendered[k]
        prep, parsed, digest = fut.result()
        here = prepare(demo_model, row)
        assert op == "render" and isinstance(prep, Rendered) and parsed is None and cpu_s > 0
        assert digest == request_digest(row)  # hashed in the process, as the engine would
        assert [s.input_ids for s in prep.sequences] == [s.input_ids for s in here.sequences]
        outputs[k] = run_batch(demo_model, prep.sequences, "fp32")
        p.decode(k, outputs[k], timings)
    p.flush()
    decoded = _collect(done, len(rows))
    for k, row in enumerate(rows, 1):
        res, answer = decoded[k][1].result()
        want = finish(demo_model, prepare(demo_model, row), outputs[k], timings, "fp32")
        assert answer is None
        want = want.to_json_dict()
        assert set(res.pop("timings")) == set(want.pop("timings"))  # the times themselves differ
        assert res == want  # exactly, in the stored JSON form


def test_a_process_that_dies_answers_its_rows_and_is_replaced(procs):
    p, done = procs
    rows = short_rows(4, "die-")
    for k, row in enumerate(rows, 1):
        p.render(k, row)
    p.flush()
    _collect(done, 4)
    victim = p._slots[p._slot_of[1]].proc
    os.kill(victim.pid, signal.SIGKILL)
    lost = _collect(done, 2)  # the two rows rendered there (round robin over 2 processes)
    assert all(op == "lost" and isinstance(fut.exception(), ModelError) for op, fut, _ in lost.values())
    assert set(lost) == {k for k in (1, 2, 3, 4) if k not in p._slot_of}
    p.render(10, rows[0])
    p.render(11, rows[1])
    p.flush()
    again = _collect(done, 2)
    assert all(op == "render" and fut.exception() is None for op, fut, _ in again.values())
    assert all(s.proc.is_alive() for s in p._slots)


def test_dropped_rows_leave_the_process(procs):
    p, done = procs
    p.render(1, short_rows(1, "drop-")[0])
    p.flush()
    _collect(done, 1)
    p.drop(1)
    p.flush()
    assert 1 not in p._slot_of




def test_a_batch_invariant_workers_processes_say_so_in_every_answer(demo_dir, demo_model):
    from vela2.scoring.pipeline import finish, prepare

    p = CpuProcesses(str(demo_dir), demo_model.name, 1, demo_model.digest, "fp32", batch_invariant=True)
    done: queue.SimpleQueue = queue.SimpleQueue()
    p.on_done = lambda op, key, fut, cpu_s: done.put((op, key, fut, cpu_s))
    p.start()
    try:
        row = short_rows(1, "inv-")[0]
        p.render(1, row)
        p.flush()
        prep = _collect(done, 1)[1][1].result()[0]
        outputs = run_batch(demo_model, prep.sequences, "fp32", batch_invariant=True)
        p.decode(1, outputs, {"model_ms": 1.0})
        p.flush()
        res, _ = _collect(done, 1)[1][1].result()
    finally:
        p.close()
    assert res["served_by"]["batch_invariant"] is True
    here = finish(demo_model, prepare(demo_model, row), outputs, {"model_ms": 1.0}, "fp32", batch_invariant=True)
    res.pop("timings")
    assert res == {k: v for k, v in here.to_json_dict().items() if k != "timings"}
