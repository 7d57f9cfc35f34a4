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


def _drain_flows(b: Buckets[str], now: float) -> list[str]:
    """Every batch's flows, in the order the batches go (the values name their flow first)."""
    order = []
    while (batch := b.pop_batch(now, online_now=True)) is not None:
        order.append("".join(sorted({v[0] for v in batch})))
    return order


def test_a_tenant_arriving_behind_anothers_backlog_rides_the_next_batch():
    for row_tokens in (None, 64):
        b: Buckets[str] = Buckets(400, max_wait_s=0.01, row_tokens=row_tokens)
        for i in range(200):  # tenant A's backlog: 50 batches of 4
            b.add(f"a{i}", 100 if row_tokens is None else 60, since=float(i), flow="A")
        b.pop_batch(1000.0, online_now=True)  # one of A's goes
        b.add("b0", 100 if row_tokens is None else 60, since=500.0, flow="B")
        nxt = b.pop_batch(1000.0, online_now=True)
        assert nxt is not None and "b0" in nxt, (row_tokens, nxt)


def test_batches_share_the_device_by_weight_while_both_tenants_wait():
    b: Buckets[str] = Buckets(400, max_wait_s=0.01)
    b.weights = {"A": 2.0}
    for i in range(120):
        b.add(f"a{i}", 100, since=float(i), flow="A")
        b.add(f"b{i}", 100, since=float(i), flow="B")
    handed = "".join(v[0] for _ in range(15) for v in (b.pop_batch(1000.0, online_now=True) or []))
    assert abs(handed.count("a") - 2 * handed.count("b")) <= 4, handed  # 60 sequences: ~40 of A's, ~20 of B's


def test_one_tenant_alone_is_batched_as_without_tenants():
    plain: Buckets[int] = Buckets(1000, max_wait_s=0.01)
    flowed: Buckets[int] = Buckets(1000, max_wait_s=0.01)
    for i, n in enumerate([30, 700, 45, 90, 310, 64, 20, 128, 900, 33] * 3):
        plain.add(i, n, since=float(i % 7))
        flowed.add(i, n, since=float(i % 7), flow="A")
    while (got := plain.pop_batch(100.0)) is not None:
        assert flowed.pop_batch(100.0) == got
    assert len(flowed) == 0


def test_online_still_goes_before_backfill_within_and_across_tenants():
    b: Buckets[str] = Buckets(150, max_wait_s=0.01)
    b.add("A-backfill", 100, since=0.0, priority=1, flow="A")
    b.add("B-backfill", 100, since=0.0, priority=1, flow="B")
    b.add("A-online", 100, since=9.0, priority=0, flow="A")
    assert b.pop_batch(10.0) == ["A-online"]
    assert sorted([b.pop_batch(10.0)[0], b.pop_batch(10.0)[0]]) == ["A-backfill", "B-backfill"]
    assert b.pop_batch(10.0) is None and len(b) == 0
