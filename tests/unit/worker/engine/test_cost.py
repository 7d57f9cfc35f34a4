"""What a batch costs the device (worker.engine.cost): a + b x tokens fitted from the batches that
ran, recent batches weighing more; the tokens that fit a time; the runner's launch lead."""

from __future__ import annotations

import pytest

from worker.engine.cost import HALF_LIFE, MIN_LEAD_S, BatchCost


def test_nothing_known_costs_nothing_and_fits_no_budget():
    cost = BatchCost()
    assert cost.seconds(1000) == 0.0 and cost.tokens_within(0.1) is None and cost.lead_s == MIN_LEAD_S


def test_one_size_alone_is_all_per_token():
    cost = BatchCost([(2048, 0.5)])
    assert cost.a == 0.0 and cost.seconds(1024) == pytest.approx(0.25)
    assert cost.tokens_within(0.25) == 1024


def test_a_line_is_recovered_from_batches_of_several_sizes():
    cost = BatchCost()
    for tokens in (100, 400, 1000, 2000, 3000) * 3:
        cost.observe(tokens, 0.004 + 2e-5 * tokens)
    assert cost.a == pytest.approx(0.004, abs=1e-9) and cost.b == pytest.approx(2e-5)
    assert cost.tokens_within(0.024) == pytest.approx(1000, abs=1)


def test_recent_batches_weigh_more():
    """After a slowdown (another tenant of the GPU, a power cap), the model follows within a few
    half-lives."""
    cost = BatchCost()
    for _ in range(HALF_LIFE):
        cost.observe(1000, 0.010)
    for _ in range(4 * HALF_LIFE):
        cost.observe(1000, 0.020)
    assert cost.seconds(1000) == pytest.approx(0.020, rel=0.08)


def test_nonsense_is_ignored_and_the_lead_follows_launches():
    cost = BatchCost([(1000, 0.01)])
    for bad in ((0, 1.0), (100, float("nan")), (100, -1.0), (100, float("inf"))):
        cost.observe(*bad)
    assert cost.observed == 1 and cost.seconds(1000) == pytest.approx(0.01)
    for _ in range(30):
        cost.observe(1000, 0.01, launch_s=0.02)
    assert cost.lead_s == pytest.approx(0.02, rel=0.01)
    for _ in range(30):
        cost.observe(1000, 0.01, launch_s=0.0)
    assert cost.lead_s == pytest.approx(MIN_LEAD_S, rel=0.01)  # never below the trip to the runner


def test_the_error_of_its_predictions_is_tracked():
    """How far off the predictions were (the scheduler stages the next batch that much earlier)."""
    cost = BatchCost([(1000, 0.010)])  # 10 us per token
    assert cost.error_s == 0
    cost.observe(1000, 0.010)  # as predicted
    assert cost.error_s == pytest.approx(0.0)
    cost.observe(1000, 0.060)  # 50 ms late: a fifth of it counts
    assert cost.error_s == pytest.approx(0.010)
    for _ in range(40):
        cost.observe(1000, cost.seconds(1000))  # predictions right again: the error fades
    assert cost.error_s < 1e-4
