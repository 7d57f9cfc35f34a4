"""Row packing in the engine (`EngineSettings.row_tokens`): every length shares one bucket, batches
are packed by `vela2.text.packing.pack(..., row_tokens=R)` and run_batch receives R. Pure Buckets
and the engine with a fake pipeline and fakeredis; no model, no broker."""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import fakeredis
from hypothesis import given, settings
from hypothesis import strategies as st

from vela2.api.schemas import Answer, RowResult, Status, parse_row
from vela2.model.calibration import Calibration
from vela2.text.packing import plan_rows
from vela2.wire.messages import build_message
from vela2.wire.results import ResultStore, read_results
from worker.engine.batching import Buckets
from worker.engine.loop import Engine
from worker.engine.work import Delivery
from worker.settings import EngineSettings

QUEUE = "vela2.fake"
ROW_TOKENS = 64
BUDGET = 256  # 4 rows of 64 tokens per batch


def padded_cost(lengths: list[int], row_tokens: int) -> int:
    """What run_batch lays out for a batch: rows (first-fit) x the row capacity."""
    return len(plan_rows(lengths, row_tokens)) * max(row_tokens, *lengths)


def drain(b: Buckets, now: float) -> list[list]:
    out = []
    for flush in (False, True):
        while (batch := b.pop_batch(now, flush=flush)) is not None:
            out.append(batch)
    return out


@settings(max_examples=200, deadline=None)
@given(
    row_tokens=st.sampled_from([16, 64, 256]),
    data=st.data(),
    budget_rows=st.integers(1, 16),
)
def test_packed_batches_hold_every_sequence_once_within_budget(row_tokens, data, budget_rows):
    lengths = data.draw(st.lists(st.integers(1, row_tokens), max_size=120))
    arrivals = data.draw(st.lists(st.floats(0, 1), min_size=len(lengths), max_size=len(lengths)))
    budget = budget_rows * row_tokens + data.draw(st.integers(0, row_tokens - 1))
    b: Buckets[int] = Buckets(budget, 0.5, row_tokens=row_tokens)
    for i, n in enumerate(lengths):
        b.add(i, n, since=arrivals[i])
    batches = drain(b, now=0.0)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert padded_cost([lengths[i] for i in batch], row_tokens) <= budget
    assert len(b) == 0 and b.next_deadline() is None


def test_all_lengths_share_one_bucket_and_a_full_batch_goes_without_waiting():
    b: Buckets[int] = Buckets(BUDGET, 60.0, row_tokens=ROW_TOKENS)
    lengths = [60, 4, 30, 34, 50, 14, 62, 2]  # 256 tokens: exactly four rows of 64
    for i, n in enumerate(lengths):
        b.add(i, n, since=0.0)
    batch = b.pop_batch(now=0.0)  # nobody waited: only a full batch may go
    assert batch is not None and sorted(batch) == list(range(8))  # 2 .. 62 tokens side by side
    assert padded_cost(lengths, ROW_TOKENS) == BUDGET

    b.add(8, 10, since=0.0)
    assert b.pop_batch(now=1.0) is None  # one short sequence: waits for company...
    assert b.pop_batch(now=60.0) == [8]  # ...until max_wait


def test_without_row_tokens_lengths_keep_their_buckets():
    b: Buckets[int] = Buckets(BUDGET, 0.0)
    b.add(0, 60, since=0.0)
    b.add(1, 4, since=0.0)
    assert sorted(map(sorted, drain(b, now=1.0))) == [[0], [1]]


@dataclass
class RowPipeline:
    """prepare / run_batch(model, seqs, precision, row_tokens) / finish; one sequence per 10 words."""

    calls: list[tuple[list[tuple[str, int]], list[int], int | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def prepare(self, model, obj):
        row = parse_row(obj)
        words = len(row.text.split())
        n = max(1, -(-words // 10))
        seqs = [SimpleNamespace(row_id=row.id, window=w, num_tokens=min(10, words - 10 * w) * 5) for w in range(n)]
        return SimpleNamespace(row=row, task=row.task, sequences=seqs, render_ms=0.1)

    def run_batch(self, model, sequences, precision, row_tokens=None):
        with self.lock:
            self.calls.append(
                ([(s.row_id, s.window) for s in sequences], [s.num_tokens for s in sequences], row_tokens)
            )
        return [("out", s.row_id, s.window) for s in sequences]

    def finish(self, model, prep, outputs, timings, precision):
        assert [o[2] for o in outputs] == list(range(len(prep.sequences)))  # every window, in order
        row = prep.row
        answers = [Answer(question=0, task=row.task, probs={"windows": float(len(outputs))})]
        return RowResult(id=row.id, task=row.task, status=Status.ok, answers=answers, timings=timings)


def delivery(req: dict[str, Any], acked: list[str]) -> Delivery:
    msg = build_message([req], QUEUE)
    env = json.loads(msg.payload)
    return Delivery(
        headers=env["headers"], body=base64.b64decode(env["body"]), ack=lambda: acked.append(msg.id), reject=None
    )


def test_engine_packs_rows_and_passes_row_tokens_to_run_batch():
    redis = fakeredis.FakeRedis()
    pipe = RowPipeline()
    settings_ = EngineSettings(max_batch_tokens=BUDGET, max_wait_ms=5.0, row_tokens=ROW_TOKENS, render_threads=1)
    engine = Engine(
        SimpleNamespace(name="fake", calibration=Calibration()), ResultStore(redis), settings_, pipeline=pipe
    )
    engine.start()
    # 1 .. 40 words: 1 .. 4 sequences of 5 .. 50 tokens each
    rows = [
        {
            "id": f"r{i}",
            "task": "choice:boolq",
            "text": " ".join(["w"] * (1 + (i * 7) % 40)),
            "questions": [{"options": ["yes", "no"]}],
        }
        for i in range(40)
    ]
    acked: list[str] = []
    for r in rows:
        engine.submit(delivery(r, acked))
    deadline = time.monotonic() + 20
    while len(acked) < len(rows):
        assert time.monotonic() < deadline, f"{len(acked)} of {len(rows)} acked"
        time.sleep(0.01)
    engine.stop(5.0)

    got = read_results(redis, [r["id"] for r in rows])
    assert all(v is not None and v.status == Status.ok for v in got.values())
    want = {(r["id"], w) for r in rows for w in range(-(-len(r["text"].split()) // 10))}
    seen = [s for ids, _, _ in pipe.calls for s in ids]
    assert sorted(seen) == sorted(want)  # every sequence in exactly one batch
    for _, lengths, row_tokens in pipe.calls:
        assert row_tokens == ROW_TOKENS
        assert padded_cost(lengths, ROW_TOKENS) <= BUDGET
    # mixed lengths shared batches (one bucket), and batches were packed, not one row per sequence
    assert any(len({n for n in lengths}) > 1 for _, lengths, _ in pipe.calls)
    assert max(len(lengths) for _, lengths, _ in pipe.calls) > BUDGET // ROW_TOKENS
