"""Length buckets and token-budget packing (pure: no Redis, no model)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.engine.batching import Buckets, bucket_of


def test_bucket_edges_are_four_per_power_of_two():
    assert [bucket_of(n) for n in (1, 16, 17, 20, 21, 32, 33, 40, 64, 65, 100)] == [
        16,
        16,
        20,
        20,
        24,
        32,
        40,
        40,
        64,
        80,
        112,
    ]


@given(st.integers(1, 100_000))
def test_bucket_wastes_under_a_quarter(n):
    edge = bucket_of(n)
    assert edge >= n
    assert n <= 16 or edge < n * 1.25


def _drain(b: Buckets, now: float, flush: bool) -> list[list]:
    out = []
    while (batch := b.pop_batch(now, flush=flush)) is not None:
        out.append(batch)
    return out


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=0, max_size=80),
    budget=st.integers(64, 8192),
    arrivals=st.lists(st.floats(0, 1), min_size=80, max_size=80),
)
def test_every_sequence_lands_in_exactly_one_batch_within_budget(lengths, budget, arrivals):
    b: Buckets[int] = Buckets(budget, max_wait_s=0.5)
    for i, n in enumerate(lengths):
        b.add(i, n, since=arrivals[i])
    batches = _drain(b, now=0.0, flush=False) + _drain(b, now=0.0, flush=True)
    seen = [i for batch in batches for i in batch]
    assert sorted(seen) == list(range(len(lengths)))  # each exactly once
    for batch in batches:
        longest = max(lengths[i] for i in batch)
        assert longest * len(batch) <= budget or len(batch) == 1  # over-budget sequences run alone
        assert len({bucket_of(lengths[i]) for i in batch}) == 1  # one length bucket per batch
    assert len(b) == 0 and b.next_deadline() is None


def test_a_bucket_waits_for_company_until_max_wait():
    b: Buckets[str] = Buckets(1000, max_wait_s=0.02)
    b.add("a", 100, since=10.0)
    b.add("b", 100, since=10.005)
    assert b.pop_batch(10.019) is None  # neither full nor old
    assert b.next_deadline() == 10.02
    assert sorted(b.pop_batch(10.02)) == ["a", "b"]
    assert b.pop_batch(11.0) is None


def test_a_full_bucket_flushes_at_once_and_keeps_the_rest_waiting():
    b: Buckets[int] = Buckets(1000, max_wait_s=10.0)
    for i in range(13):  # 100 tokens each: 10 fill the budget
        b.add(i, 100, since=float(i))
    first = b.pop_batch(0.0)
    assert first is not None and len(first) == 10
    assert b.pop_batch(0.0) is None  # 3 left: not full, not old
    assert len(b) == 3
    assert len(b.pop_batch(0.0, flush=True)) == 3


def test_the_oldest_bucket_goes_first():
    b: Buckets[str] = Buckets(4096, max_wait_s=0.01)
    b.add("long-new", 1000, since=5.0)
    b.add("short-old", 10, since=1.0)
    assert b.pop_batch(10.0) == ["short-old"]
    assert b.pop_batch(10.0) == ["long-new"]


def test_an_over_budget_sequence_runs_alone_immediately():
    b: Buckets[str] = Buckets(512, max_wait_s=60.0)
    b.add("small", 100, since=0.0)
    b.add("huge", 900, since=0.0)
    assert b.pop_batch(0.0) == ["huge"]
    assert b.pop_batch(0.0) is None


def test_remove_drops_matching_values():
    b: Buckets[int] = Buckets(1000, max_wait_s=1.0)
    for i in range(6):
        b.add(i, 50 * (i + 1), since=0.0)
    assert sorted(b.remove(lambda v: v % 2 == 0)) == [1, 3, 5]
    assert sorted(b.drain()) == [0, 2, 4]


def test_online_batches_go_before_backfill_batches():
    b: Buckets[str] = Buckets(4096, max_wait_s=0.01)
    b.add("backfill-old", 100, since=0.0, priority=1)
    b.add("online-new", 1000, since=5.0, priority=0)
    assert b.pop_batch(10.0) == ["online-new"]  # other bucket, younger, but online
    assert b.pop_batch(10.0) == ["backfill-old"]
    one = Buckets(150, max_wait_s=0.01)  # one bucket, room for one row per batch
    one.add("backfill-old", 100, since=0.0, priority=1)
    one.add("online-new", 100, since=6.0, priority=0)
    assert one.pop_batch(10.0) == ["online-new"]
    assert one.pop_batch(10.0) == ["backfill-old"]
