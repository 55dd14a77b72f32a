"""The spot cost model against money and tokens counted by hand, and the relations it must keep."""
from __future__ import annotations

import bench_path  # noqa: F401  (bench/research is not part of the package)
import pytest
from research.spot import Interval, SpotTerms, WorkerModel, expected_throughput, schedule_cost
from research.spot_workers import reported_workers, simulated_workers

WORKERS = WorkerModel({1: 100.0, 2: 150.0}, reprefill_s=20.0)
SCHEDULE = [Interval(hours=1.0, num_workers=1), Interval(hours=0.5, num_workers=2)]


def test_two_interval_schedule_counted_by_hand():
    terms = SpotTerms(on_demand_per_hour=10.0, spot_per_hour=4.0, preemptions_per_hour=0.5, replacement_s=360.0,
                      poll_interval_s=10.0)
    cost = schedule_cost(SCHEDULE, WORKERS, terms)
    assert cost.dollars_on_demand == pytest.approx(1 * 1.0 * 10 + 2 * 0.5 * 10)      # $20
    assert cost.dollars_spot == pytest.approx(1 * 1.0 * 4 + 2 * 0.5 * 4)             # $8
    assert cost.tokens_on_demand == pytest.approx(100 * 3600 + 150 * 1800)           # 630,000
    up = 1 / (1 + 0.5 * 0.1)                                                          # replaced after 0.1 h: up 95.24%
    first = up * 100 * 3600 - (1 * 1.0 * 0.5 * up) * 100 * (10 + 20)                  # 342,857 - 1,429
    both_up, one_up = up * up, 2 * up * (1 - up)
    second = (both_up * 150 + one_up * 100) * 1800 - (2 * 0.5 * 0.5 * up) * 75 * (10 + 20)
    assert cost.tokens_spot == pytest.approx(first + second)
    assert cost.tokens_spot == pytest.approx(601_582, abs=1)
    assert cost.preemptions == pytest.approx(2 * 0.5 * up)
    assert cost.tokens_lost == pytest.approx(630_000 - first - second)
    assert cost.tokens_per_dollar_on_demand == pytest.approx(31_500)
    assert cost.tokens_per_s_on_demand == pytest.approx(630_000 / 5400)


def test_spot_pays_without_preemptions_and_not_under_absurd_ones():
    calm = schedule_cost(SCHEDULE, WORKERS, SpotTerms(83.79, 21.28, preemptions_per_hour=0.0))
    assert calm.tokens_spot == calm.tokens_on_demand and calm.preemptions == 0
    assert calm.tokens_per_dollar_spot > calm.tokens_per_dollar_on_demand
    stormy = schedule_cost(SCHEDULE, WORKERS, SpotTerms(83.79, 21.28, preemptions_per_hour=1000.0))
    assert stormy.tokens_per_dollar_spot < stormy.tokens_per_dollar_on_demand
    assert stormy.tokens_spot >= 0


def test_more_preemptions_never_yield_more_tokens():
    tokens = [schedule_cost(SCHEDULE, WORKERS, SpotTerms(10, 4, rate)).tokens_spot for rate in (0, 0.1, 1, 10, 100)]
    assert tokens == sorted(tokens, reverse=True)


def test_expected_throughput_at_the_extremes():
    assert expected_throughput(WORKERS, 2, 1.0) == 150.0
    assert expected_throughput(WORKERS, 2, 0.0) == 0.0
    assert expected_throughput(WORKERS, 2, 0.5) == pytest.approx(0.25 * 150 + 0.5 * 100)


def test_reported_throughput_is_interpolated_between_given_counts():
    fluid = reported_workers({1: 12_000, 4: 18_000}, 4, "FluidRL")
    assert fluid.throughput == {1: 12_000, 2: 14_000, 3: 16_000, 4: 18_000}
    with pytest.raises(ValueError, match="cover 1..4"):
        reported_workers({2: 1.0, 4: 2.0}, 4, "gap")


def test_simulated_workers_come_from_the_rollout_model():
    workers = simulated_workers("qwen2.5-7b", 2, gpus_per_worker=1, max_new_tokens=1024, prompts_per_step=8,
                                min_rounds=2)
    assert set(workers.throughput) == {1, 2}
    assert all(t > 0 for t in workers.throughput.values())
    assert workers.reprefill_s > 0 and "simulated" in workers.source
