"""Render / decode processes' bookkeeping without a process: a long work list answers in chunks."""

from __future__ import annotations

from bench.queue_bench import short_rows


class _Pipe:
    """The child's end of a pipe, in this process: what it will receive, and what it sent."""

    def __init__(self, work: list):
        self.incoming, self.sent = [work, None], []

    def recv(self):
        return self.incoming.pop(0)

    def send(self, obj) -> None:
        self.sent.append(obj)


def test_a_long_work_list_answers_in_chunks(demo_dir, demo_model):
    """(the child's loop, run here) 100 renders sent at once come back in chunks of at most
    REPLY_CHUNK answers, in order: the engine gets the first rows after ~32 renders, not 100."""
    from worker.runtime.cpu_procs import REPLY_CHUNK, _serve

    rows = short_rows(100, "chunk-")
    pipe = _Pipe([("render", k, row) for k, row in enumerate(rows)])
    _serve(pipe, str(demo_dir), demo_model.name, demo_model.digest, "fp32", False)
    assert [len(m) for m in pipe.sent] == [REPLY_CHUNK] * (100 // REPLY_CHUNK) + [100 % REPLY_CHUNK]
    assert [key for m in pipe.sent for _, _, key, _, _ in m] == list(range(100))
    assert all(status == "ok" and op == "render" for m in pipe.sent for status, op, *_ in m)
