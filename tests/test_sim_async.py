"""The simulated asynchronous run is the product's rollout pipeline on simulated replicas: relations that must hold,
on a small 7B setting (seconds, not minutes)."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import bench_path  # noqa: F401  (bench/research is not part of the package)
import pytest
from research.async_predict import predict_async, simulate_async, split_candidates
from research.async_settings import SETTINGS, AsyncSetting, step_cost, sync_rounds

from sim_unit_cost import UnitCost

from tailflow.engines.rollout.protocol import FinishReason, Request, SamplingParams
from tailflow.engines.sim.engine import SimEngine
from tailflow.engines.sim.lengths import ResponseLength
from tailflow.engines.sim.placeholder import VersionRuns
from tailflow.engines.sim.roofline import RooflineCost
from tailflow.engines.sim.step_time import mean_step_time, shares_from_baseline
from tailflow.engines.tail import pipeline
from tailflow.engines.tail.state import in_flight_cap

TINY = AsyncSetting("7B/2k tiny", "qwen2.5-7b", 8, 1, 2048, prompts_per_step=12)
ROUNDS = 6





class HundredTokens:
    def length_of(self, request):
        return ResponseLength(100, FinishReason.EOS)


def test_a_paused_request_continues_from_its_tokens_under_the_new_weights():
    """What the pipeline's pause / resume does to a simulated replica: the partial keeps its 40 tokens, the
    resubmitted request prefills prompt + those tokens again and samples the other 60 under version 1."""
    engine = SimEngine(UnitCost(), HundredTokens(), 4)
    request = Request.for_problem("a", 0, tuple(range(11)), SamplingParams(max_new_tokens=1000))
    engine.submit([request])
    assert engine.run(40) == []
    [partial] = engine.abort([request.request_id])
    assert len(partial.token_ids) == 40 and partial.finish_reason is FinishReason.ABORT
    engine.load_weights({}, 1)
    before = engine.clock_s
    engine.submit([replace(request, prefix=partial.as_prefix())])
    [finished] = engine.run(1000)
    assert len(finished.completion.token_ids) == 100 and finished.completion.finish_reason is FinishReason.EOS
    assert finished.time_s - before == pytest.approx(0.01 * (11 + 40 - 1) + 60)  # re-prefill, then 60 steps
    assert finished.completion.token_weight_versions == VersionRuns([(0, 40), (1, 60)])
    assert finished.completion.oldest_weight_version == 0
    assert engine.stats().tokens_generated == 100  # the prefix is prefilled again, not generated again


def roofline_train(num_gpus: int) -> RooflineCost:
    """Reward 0, so a step is rollout + train + sync and the bound is (gen + train) / max(gen, train)."""
    return RooflineCost.from_presets("h800", "qwen2.5-7b", num_gpus, 1)


@pytest.mark.parametrize("tail", [False, True])
@pytest.mark.parametrize("cost_name", ["shares", "roofline"])
def test_alpha_zero_colocated_is_the_synchronous_prediction(tail, cost_name):
    cost = step_cost(TINY, cost_name, TINY.num_gpus, True, ROUNDS, 0)
    rounds = sync_rounds(TINY, TINY.num_gpus, tail, ROUNDS, 0)
    run = simulate_async(TINY, 0.0, TINY.num_gpus, cost, tail=tail, min_rounds=ROUNDS)
    assert run.step_s == pytest.approx(mean_step_time(rounds, cost).total_s, rel=1e-9)
    timeless = lambda r: replace(r, rollout_s=0, replica_idle_ratio=0)  # the clock runs on: float rounding only
    assert [timeless(r) for r in run.rounds] == [timeless(r) for r in rounds]
    assert [r.rollout_s for r in run.rounds] == pytest.approx([r.rollout_s for r in rounds], rel=1e-9)
    assert run.staleness_histogram == {0: sum(len(s.trained_problem_ids) for s in run.steps) * 8}


def test_alpha_zero_is_the_research_papers_own_prediction():
    """The same number bench/research/paper.py's code gives for the paper's 7B setting (at a small P0)."""
    from research.paper import PAPER, R0, simulate_cell

    sync = simulate_cell(PAPER[0], 1.0, R0, ROUNDS, 0, prompts_per_step=12)
    tail = simulate_cell(PAPER[0], 1.25, 10, ROUNDS, 0, prompts_per_step=12)
    shares = shares_from_baseline(sync)
    setting = replace(SETTINGS["7b"], prompts_per_step=12)
    cost = step_cost(setting, "shares", setting.num_gpus, True, ROUNDS, 0)
    for rounds, tail_on in ((sync, False), (tail, True)):
        run = simulate_async(setting, 0.0, setting.num_gpus, cost, tail=tail_on, min_rounds=ROUNDS)
        assert run.step_s == pytest.approx(mean_step_time(rounds, shares).total_s, rel=1e-9)
    predicted = predict_async("7b", 1.0, min_rounds=ROUNDS, prompts_per_step=12, rollout_gpus=8)
    assert predicted.sync_step_s == pytest.approx(mean_step_time(sync, shares).total_s, rel=1e-9)
    assert predicted.tail_step_s == pytest.approx(mean_step_time(tail, shares).total_s, rel=1e-9)


def test_the_async_run_is_driven_by_the_products_pipeline(monkeypatch):
    """Not a model of asynchrony: the launch rule, the overlap and the weight sync are RolloutPipeline's own."""
    calls = Counter()
    for name in ("take", "roll_while", "pause", "resume", "_launch"):
        original = getattr(pipeline.RolloutPipeline, name)
        monkeypatch.setattr(pipeline.RolloutPipeline, name,
                            lambda self, *a, _name=name, _f=original, **k: calls.update([_name]) or _f(self, *a, **k))
    run = simulate_async(TINY, 1.0, 4, roofline_train(4), tail=True, min_rounds=ROUNDS)
    assert calls["take"] == calls["roll_while"] == calls["pause"] == len(run.steps)
    assert calls["resume"] == len(run.steps) + 1  # and once when the pipeline starts
    assert calls["_launch"] > 2 * len(run.steps)
    assert sum(s.overlap_tokens for s in run.steps) > 0  # rounds did roll out while the trainer trained


@pytest.mark.parametrize("tail", [False, True])
@pytest.mark.parametrize("alpha", [pytest.param(1.0, marks=pytest.mark.slow), 2.0])
def test_running_ahead_beats_alpha_zero_on_the_same_pools_and_never_the_trainer(tail, alpha):
    """Faster than alpha 0 on the same two pools (training overlaps rollout, and a round's stragglers share
    decode steps with the next round's requests), never faster than the trainer's own work per step, and no
    replica busier than the clock.

    Alpha 1.0 costs ~8-17 s a case here (alpha 2.0 ~4 s: fewer, longer steps cover the same rounds), so its cases
    are marked slow: the fast subset keeps alpha 2.0, the whole suite runs both."""
    rollout_gpus = 4
    cost = roofline_train(TINY.num_gpus - rollout_gpus)
    split = simulate_async(TINY, 0.0, rollout_gpus, cost, tail=tail, min_rounds=ROUNDS)
    assert split.step_s == pytest.approx(mean_step_time(sync_rounds(TINY, rollout_gpus, tail, ROUNDS, 0), cost).total_s)
    run = simulate_async(TINY, alpha, rollout_gpus, cost, tail=tail, min_rounds=ROUNDS)
    assert split.step_s / run.step_s > 1.05
    assert run.step_s >= min(s.train_s + s.sync_s for s in run.steps)
    assert 0 < run.rollout_utilisation <= 1 and 0 < run.trainer_utilisation <= 1


@pytest.mark.parametrize("partial", [True, False])
@pytest.mark.parametrize("alpha", [pytest.param(1.0, marks=pytest.mark.slow), 1.5, 2.0])
def test_staleness_bound_and_prompt_cap_hold_by_construction(alpha, partial):
    """Alpha 1.0 costs ~11-21 s a case here (1.5 and 2.0 ~3-5 s), so its cases are marked slow: the fast subset
    keeps 1.5 and 2.0, the whole suite runs all three."""
    run = simulate_async(TINY, alpha, 4, roofline_train(4), tail=True, partial=partial, min_rounds=ROUNDS)
    cap = in_flight_cap(alpha, TINY.prompts_per_step)
    assert all(0 <= lag <= int(alpha) for s in run.steps for lag in s.staleness)
    assert all(s.prompts_in_flight <= cap for s in run.steps)
    assert max(run.staleness_histogram) == int(alpha)  # the pipeline does run ahead
    assert max(s.rounds_ahead for s in run.steps) >= 1
    assert all(a.end_s <= b.start_s for a, b in zip(run.steps, run.steps[1:]))
    assert all(s.start_s <= s.taken_s <= s.trained_s <= s.end_s for s in run.steps)
    assert (run.tokens_restarted > 0) == (not partial)


@pytest.mark.parametrize("tail", [False, True])
def test_every_prompt_is_trained_once_or_queued(tail):
    run = simulate_async(TINY, 2.0, 4, roofline_train(4), tail=tail, min_rounds=ROUNDS)
    trained = Counter(pid for s in run.steps for pid in s.trained_problem_ids)
    queued = set(run.queued_problem_ids)
    assert max(trained.values()) == 1 and not queued & set(trained)
    assert all(len(s.trained_problem_ids) == TINY.prompts_per_step for s in run.steps)
    # launched by a taken round: trained, queued, or still running in a later round the run never took
    launched = {pid for s in run.steps for pid in s.launched_problem_ids}
    assert set(trained) | queued <= launched | queued


def test_predict_async_reports_against_both_synchronous_baselines():
    p = predict_async("7b", 2.0, tail=True, min_rounds=ROUNDS, prompts_per_step=12, rollout_gpus=4)
    assert (p.rollout_gpus, p.train_gpus) == (4, 12)
    assert p.speedup == pytest.approx(p.sync_step_s / p.async_step_s)
    assert p.speedup_vs_tail == pytest.approx(p.tail_step_s / p.async_step_s)
    assert p.pipeline_speedup > 1.0
    assert sum(p.staleness_histogram.values()) == p.num_rounds * 12 * 8
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


def test_split_pools_pay_the_weight_sync_to_every_rollout_node():
    """7B on 16 GPUs (TP 1) split 10 rollout / 6 trainer: the trainer pool gathers the 15.22 GB of bf16 weights
    (6 GPUs on one node, NCCL Simple: 8.4 + 5 x 3.4 us + 15.22e9 x 5/6 / 200 GB/s), both rollout nodes pull a
    copy through the source's 50 GB/s, and each GPU loads its copy over 64 GB/s PCIe."""
    weights = 2 * 7.61e9
    by_hand = 25.4e-6 + weights * 5 / 6 / 200e9 + 2 * weights / 50e9 + weights / 64e9
    assert step_cost(SETTINGS["7b"], "roofline", 6, False, ROUNDS, 0).weight_sync_s() == pytest.approx(by_hand, rel=1e-9)
    # colocated on all 16 (2 nodes): the trainer's own node holds the copy, the other one pulls it
    colocated = step_cost(SETTINGS["7b"], "roofline", 16, True, ROUNDS, 0).weight_sync_s()
    gather_16 = 8.4e-6 + 14 * 3.4e-6 + 9.6e-6 + weights * 15 / 16 / 50e9
    assert colocated == pytest.approx(gather_16 + weights / 50e9 + weights / 64e9, rel=1e-9)
