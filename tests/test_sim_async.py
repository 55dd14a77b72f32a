"""The simulator's async mode against relations that must hold, on a small 7B setting (seconds, not minutes)."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from tailflow.engines.rollout.protocol import FinishReason, Request, SamplingParams
from tailflow.engines.sim.async_engine import AsyncSimEngine, WeightUpdate
from tailflow.engines.sim.async_pipeline import AsyncPipeline, max_prompts_in_flight
from tailflow.engines.sim.async_predict import predict_async, simulate_async, split_candidates
from tailflow.engines.sim.async_settings import (
    SETTINGS, AsyncSetting, lengths_of, policy, rollout_cost, step_cost, sync_rounds)
from tailflow.engines.sim.costs import CostModel
from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.lengths import ResponseLength
from tailflow.engines.sim.roofline import RooflineCost
from tailflow.engines.sim.simulate import PolicySimulation
from tailflow.engines.sim.step_time import mean_step_time, shares_from_baseline

TINY = AsyncSetting("7B/2k tiny", "qwen2.5-7b", 8, 1, 2048, prompts_per_step=12)
ROUNDS = 6


class UnitCost(CostModel):
    """1 s a decode step, 0.01 s a prefilled token."""

    def decode_s(self, num_rows, context_tokens, max_context):
        return 1.0 if num_rows else 0.0

    def prefill_s(self, num_tokens, num_seqs):
        return 0.01 * num_tokens

    def train_s(self, num_tokens):
        return 0.0

    def reward_s(self, num_responses, num_tokens):
        return 0.0

    def weight_sync_s(self):
        return 0.0


class HundredTokens:
    max_new_tokens = 1000

    def length_of(self, request):
        return ResponseLength(100, FinishReason.EOS)


@pytest.mark.parametrize("partial", [True, False])
def test_a_version_landing_mid_request_pauses_and_continues_or_restarts(partial):
    engine = AsyncSimEngine(UnitCost(), HundredTokens(), 4, sync_s=5.0, partial=partial, chunk_steps=10)
    engine.begin_round(0, [WeightUpdate(time_s=39.5, version=1)])
    engine.submit([Request("a#0", tuple(range(11)), SamplingParams(max_new_tokens=1000))])
    [finished] = engine.run(10_000)
    # prefill 10 tokens (0.1 s), chunks of 10 steps end at 10.1 .. 40.1 s: the version lands at 40.1, then 5 s to load
    assert len(finished.completion.token_ids) == 100 and engine.weight_version == 1
    if partial:
        assert finished.time_s == pytest.approx(40.1 + 5 + 60)
        assert engine.first_version["a#0"] == 0 and engine.num_tokens_restarted == 0
    else:  # the 40 tokens are thrown away; prefill again and 100 steps
        assert finished.time_s == pytest.approx(40.1 + 5 + 0.1 + 100)
        assert engine.first_version["a#0"] == 1 and engine.num_tokens_restarted == 40


def roofline_train(num_gpus: int) -> RooflineCost:
    """Reward 0, so a step is rollout + train + sync and the bound is (gen + train) / max(gen, train)."""
    return RooflineCost.from_presets("h800", "qwen2.5-7b", num_gpus, 1)


@pytest.mark.parametrize("tail", [False, True])
@pytest.mark.parametrize("cost_name", ["shares", "roofline"])
def test_alpha_zero_colocated_is_the_synchronous_prediction(tail, cost_name):
    cost = step_cost(TINY, cost_name, TINY.num_gpus, True, ROUNDS, 0)
    expected = mean_step_time(sync_rounds(TINY, TINY.num_gpus, tail, ROUNDS, 0), cost).total_s
    run = simulate_async(TINY, 0.0, TINY.num_gpus, cost, tail=tail, min_rounds=ROUNDS)
    assert run.step_s == pytest.approx(expected, rel=1e-9)
    assert [r.sim for r in run.rounds] == list(sync_rounds(TINY, TINY.num_gpus, tail, ROUNDS, 0))
    assert run.staleness_histogram == {0: sum(len(r.trained_problem_ids) for r in run.rounds)}


def test_alpha_zero_is_bench_sim_papers_own_prediction(monkeypatch):
    """The same number bench/sim_paper.py's code gives for the paper's 7B setting (at a small P0)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    from sim_paper import PAPER, R0, simulate_cell

    sync = simulate_cell(PAPER[0], 1.0, R0, ROUNDS, 0, prompts_per_step=12)
    tail = simulate_cell(PAPER[0], 1.25, 10, ROUNDS, 0, prompts_per_step=12)
    shares = shares_from_baseline(sync)
    setting = replace(SETTINGS["7b"], prompts_per_step=12)
    cost = step_cost(setting, "shares", setting.num_gpus, True, ROUNDS, 0)
    for rounds, tail_on in ((sync, False), (tail, True)):
        run = simulate_async(setting, 0.0, setting.num_gpus, cost, tail=tail_on, min_rounds=ROUNDS)
        assert [r.sim for r in run.rounds] == rounds
        assert run.step_s == pytest.approx(mean_step_time(rounds, shares).total_s, rel=1e-9)
    predicted = predict_async("7b", 1.0, min_rounds=ROUNDS, prompts_per_step=12, rollout_gpus=8)
    assert predicted.sync_step_s == mean_step_time(sync, shares).total_s
    assert predicted.tail_step_s == mean_step_time(tail, shares).total_s


@pytest.mark.parametrize("tail", [False, True])
@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_overlap_pays_at_most_what_the_longer_pool_allows(tail, alpha):
    rollout_gpus = 4
    cost = roofline_train(TINY.num_gpus - rollout_gpus)
    split = mean_step_time(sync_rounds(TINY, rollout_gpus, tail, ROUNDS, 0), cost)
    gen, train = split.rollout_s, split.train_s + split.sync_s
    assert split.reward_s == 0
    run = simulate_async(TINY, alpha, rollout_gpus, cost, tail=tail, min_rounds=ROUNDS)
    speedup = split.total_s / run.step_s
    assert 1.0 <= speedup <= (gen + train) / max(gen, train) + 1e-9
    assert speedup > 1.05  # it does overlap


@pytest.mark.parametrize("partial", [True, False])
@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0])
def test_launch_rule_staleness_and_prompt_cap(alpha, partial):
    cost = roofline_train(4)
    run = simulate_async(TINY, alpha, 4, cost, tail=True, partial=partial, min_rounds=ROUNDS)
    cap = max_prompts_in_flight(alpha, TINY.prompts_per_step)
    for j, r in enumerate(run.rounds):
        assert j - r.launch_version <= alpha
        assert all(0 <= s <= alpha for s in r.staleness)
        in_flight = sum(o.prompts_to_train for o in run.rounds[: j + 1] if o.published_s > r.launch_s)
        assert in_flight <= cap
        assert r.launch_s >= (run.rounds[j - 1].rollout_end_s if j else 0.0)
        assert r.train_start_s >= r.rollout_end_s and r.train_start_s >= (run.rounds[j - 1].published_s if j else 0)
    assert max(run.staleness_histogram) == int(alpha)  # the pipeline does run ahead
    assert (run.tokens_restarted > 0) == (not partial)


class IgnoresVersions(AsyncPipeline):
    """Launches every round as soon as the rollout pool is free, so groups do go stale."""

    def launch_time(self, iteration: int, prompts_to_train: int) -> float:
        return self.rounds[-1].rollout_end_s if self.rounds else 0.0


def trained_once_or_queued(rounds, queued_ids) -> None:
    trained = Counter(pid for r in rounds for pid in r.trained_problem_ids)
    queued = set(queued_ids)
    assert max(trained.values()) == 1
    assert not queued & set(trained)
    assert {pid for r in rounds for pid in r.launched_problem_ids} == set(trained) | queued


@pytest.mark.parametrize("tail", [False, True])
def test_every_prompt_is_trained_once_or_queued(tail):
    run = simulate_async(TINY, 2.0, 4, roofline_train(4), tail=tail, min_rounds=ROUNDS)
    trained_once_or_queued(run.rounds, run.queued_problem_ids)


def test_stale_groups_are_requeued_never_dropped():
    cost = roofline_train(4)
    rollout = rollout_cost(TINY, 4)
    lengths = lengths_of(TINY, 0)
    make = lambda rank: AsyncSimEngine(rollout, lengths, 2048, rollout.kv_budget_tokens, sync_s=cost.weight_sync_s())
    sim = PolicySimulation(policy(TINY, True, 0), lengths, SimGroup(make, rollout.cluster.num_replicas))
    pipeline = IgnoresVersions(sim, cost, 1.0)
    for _ in range(ROUNDS):
        pipeline.run_round()
    requeued = [pid for r in pipeline.rounds for pid in r.requeued_problem_ids]
    assert requeued  # the rule was needed
    assert all(s <= 1 for r in pipeline.rounds for s in r.staleness)
    trained_once_or_queued(pipeline.rounds, [q.problem_id for q in sim.tail.queue])


def test_predict_async_reports_against_both_synchronous_baselines():
    p = predict_async("7b", 2.0, tail=True, min_rounds=ROUNDS, prompts_per_step=12, rollout_gpus=4)
    assert (p.rollout_gpus, p.train_gpus) == (4, 12)
    assert p.speedup == pytest.approx(p.sync_step_s / p.async_step_s)
    assert p.speedup_vs_tail == pytest.approx(p.tail_step_s / p.async_step_s)
    assert 1.0 <= p.pipeline_speedup <= p.pipeline_bound + 1e-9
    assert sum(p.staleness_histogram.values()) == p.num_rounds * 12
    assert 0 < p.rollout_utilisation <= 1 and 0 < p.trainer_utilisation <= 1
    with pytest.raises(ValueError, match="unknown async preset"):
        predict_async("70b", 1.0)
    with pytest.raises(ValueError, match="both pools"):
        predict_async("7b", 1.0, rollout_gpus=16)


def test_split_candidates_leave_the_trainer_its_memory():
    assert split_candidates(SETTINGS["7b"]) == [2, 4, 6, 8, 10, 12, 14]
    # 32B: 16 B/param x 32.5e9 over 68 GB usable per GPU needs 8 trainer GPUs
    assert split_candidates(SETTINGS["32b"]) == [8, 16, 24, 32, 40, 48, 56]
    assert split_candidates(replace(SETTINGS["32b"], num_gpus=16)) == [2, 4, 6, 8]
