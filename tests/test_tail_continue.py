"""tail.continue_deferred (issue 39): a deferred prompt keeps its first R0 draws and its long round continues them.

Driven through the product's rollout pipeline over a model-free engine (tests/length_engine.py) whose responses'
lengths and tokens are functions of their seeds, so "continued, not drawn again" is checked token by token:
a trained response of a deferred prompt is the draw its short round began (that round's seed), its carried
tokens a prefix of it, each token with the weight version that produced it. Then the committed form of the
carried responses (JSON, through `RunState`) and a resumed pipeline that continues them exactly; the config
refusal of an on-policy loss; and the reason the setting exists: on one LogNormal length for every prompt,
today's rule trains a sample shorter than the policy's, the continuing one the policy's own.
"""
from __future__ import annotations

import math
import random
from statistics import fmean, median, pstdev
from types import SimpleNamespace

import pytest

from length_engine import LengthEngine, lognormal_length, make_requests, problems, token_at
from tailflow.config import ConfigError, load_config
from tailflow.engines.rollout.protocol import FinishReason
from tailflow.engines.rollout.requests import request_seed
from tailflow.engines.run_state import RunState
from tailflow.engines.tail.pipeline import RolloutPipeline
from tailflow.engines.tail.pipeline_state import PipelineState
from tailflow.engines.tail.planner import RoundKind
from tailflow.engines.tail.state import TailSettings, TailState
from tailflow.engines.track.rollout_trace import trace_of
from tailflow.engines.track.summary import tail_metrics

PROBLEMS = problems(200)
P0, R0 = 2, 3


def short_lengths(seed: int) -> int:
    return 3 + seed % 30


def pipeline(continue_deferred: bool, alpha: float = 0.0) -> RolloutPipeline:
    settings = TailSettings(prompts_per_step=P0, responses_kept=R0, prompt_ratio=2.0, responses_launched=R0,
                            steps_per_poll=1, continue_deferred=continue_deferred)
    pipe = RolloutPipeline(LengthEngine(short_lengths), settings, alpha, True, PROBLEMS, make_requests)
    pipe.start(TailState())
    return pipe


def run(pipe: RolloutPipeline, iterations: range, steps_during_train: int = 0):
    """Take each round, let the rollout run on (asynchronous), then a weight sync: the engine's version + 1."""
    taken = []
    for i in iterations:
        taken.append(pipe.take(i))
        if steps_during_train:
            pipe.roll_while(lambda: True, steps_during_train)
        pipe.pause()
        pipe.rollout.version = i + 1
        pipe.resume(i + 1)
    return taken


def test_a_deferred_prompt_continues_its_first_draws_in_its_long_round():
    short, long_ = run(pipeline(True), range(2))
    deferred = short.result.deferred_problem_ids
    assert short.planned.plan.kind is RoundKind.SHORT and len(deferred) == 2
    assert long_.planned.plan.kind is RoundKind.LONG and [p.problem_id for p in long_.problems] == deferred
    assert short.result.wasted_tokens == 0  # R = R0 and every draw carried on: nothing thrown away
    carried = {(c.problem_id, c.index): c for cs in short.result.carried.values() for c in cs}
    assert len(carried) == 2 * R0 and {c.finish_reason for c in carried.values()} == {FinishReason.EOS,
                                                                                    FinishReason.ABORT}
    for trained in long_.completions:
        began = carried[(trained.problem_id, trained.index)]
        seed = request_seed(0, 0, trained.problem_id, trained.index)  # round 0's seed: its first draw
        assert trained.token_ids == tuple(token_at(seed, i) for i in range(short_lengths(seed)))
        n = len(began.token_ids)
        assert trained.token_ids[:n] == began.token_ids and trained.logprobs[:n] == began.logprobs
        if began.finish_reason is FinishReason.ABORT:  # continued under weights 1: one version per token
            assert trained.token_weight_versions == (0,) * n + (1,) * (len(trained.token_ids) - n)
        else:  # finished in round 0: trained as it was
            assert (trained.weight_version, trained.token_weight_versions) == (0, ())
        assert long_.continued[trained.request_id] == n
    assert long_.staleness == {1: 2 * R0}
    # ids of their own: the short round may still be live, its scorer waiting on the reward pool by request id
    assert not {r.request_id for r in long_.requests} & {r.request_id for r in short.requests}
    traced = {(p.problem_id, r.index): r.continued for p in trace_of(long_, 10_000).prompts for r in p.responses}
    assert traced == {key: len(c.token_ids) for key, c in carried.items()}


def test_without_the_setting_a_deferred_prompt_is_drawn_again():
    short, long_ = run(pipeline(False), range(2))
    assert short.result.carried == {} and short.result.wasted_tokens > 0
    assert short.result.wasted_completed_tokens == 0  # R = R0: all of it is the deferred prompts'
    for trained in long_.completions:
        seed = request_seed(0, 1, trained.problem_id, trained.index)  # round 1's seed: a new draw
        assert trained.token_ids == tuple(token_at(seed, i) for i in range(short_lengths(seed)))
    assert long_.continued == {} and all(r.continued == 0 for p in trace_of(long_, 10_000).prompts
                                         for r in p.responses)
    assert '"continued"' not in trace_of(long_, 10_000).to_line()  # the trace rows of runs without it unchanged


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_the_carried_responses_are_committed_and_a_resumed_pipeline_continues_them(alpha):
    """Synchronous: carried groups wait in the commit for their long round. Asynchronous: the long round may be
    running ahead already, its carried groups in its `SavedRound`. Either way the JSON of `RunState` brings
    them back and the resumed pipeline trains what the uninterrupted one trains."""
    steps = 4 if alpha else 0
    pipe = pipeline(True, alpha)
    run(pipe, range(1), steps)
    snapshot = pipe.snapshot()
    assert snapshot.carried or any(saved.carried for saved in snapshot.rounds)
    state = RunState(run_id="r", iteration=1, weight_version=1, tail=pipe.tail, pipeline=snapshot)
    again = RunState.model_validate_json(state.model_dump_json())
    assert again.pipeline == snapshot
    resumed = pipeline(True, alpha)
    resumed.rollout.version = 1
    resumed.restore(again.pipeline or PipelineState(), again.tail, 1, 1)
    for uninterrupted, continued in zip(run(pipe, range(1, 4), steps), run(resumed, range(1, 4), steps)):
        assert continued.completions == uninterrupted.completions and continued.continued == uninterrupted.continued


def test_no_prompt_is_lost_or_trained_twice_when_rounds_run_ahead():
    pipe = pipeline(True, 1.0)
    trained = [p.problem_id for taken in run(pipe, range(12), 4) for p in taken.problems]
    assert len(trained) == len(set(trained)) == 12 * P0
    queued = {q.problem_id for q in pipe.tail.queue}
    assert set(pipe.carried) == queued and not queued & set(trained)  # every queued prompt keeps its draws


@pytest.mark.parametrize("continue_deferred", [False, True])
def test_the_waste_of_kept_prompts_beyond_r0_is_counted_apart_from_the_deferred_prompts(continue_deferred):
    """R = 3 launched for R0 = 2 kept: a kept prompt's third response is waste either way; a deferred prompt's
    responses are all waste today, only its third with the setting (its first two are continued)."""
    settings = TailSettings(prompts_per_step=P0, responses_kept=2, prompt_ratio=2.0, responses_launched=3,
                            steps_per_poll=1, continue_deferred=continue_deferred)
    pipe = RolloutPipeline(LengthEngine(short_lengths), settings, 0.0, True, PROBLEMS, make_requests)
    pipe.start(TailState())
    taken = run(pipe, range(1))[0]
    result, traced = taken.result, trace_of(taken, 10_000).prompts
    lengths = {(p.problem_id, r.index): r.length for p in traced for r in p.responses}
    kept = {c.problem_id for _, cs in result.completed for c in cs}
    assert result.wasted_completed_tokens == sum(n for (p, k), n in lengths.items() if p in kept and
                                                 (p, k) not in {(c.problem_id, c.index) for _, cs in result.completed
                                                                for c in cs}) > 0
    deferred_waste = sum(n for (p, k), n in lengths.items() if p not in kept and (k >= 2 or not continue_deferred))
    assert result.wasted_tokens - result.wasted_completed_tokens == deferred_waste
    row = tail_metrics(SimpleNamespace(taken=taken, tail=pipe.tail,
                                       scored=SimpleNamespace(stats=SimpleNamespace(unused_reward_sum=0.0,
                                                                                    num_unused=0))))
    assert (row["tail/wasted_tokens_completed"], row["tail/wasted_tokens_deferred"]) == (
        result.wasted_completed_tokens, deferred_waste)
    assert row["tail/deferred_length_mean"] == pytest.approx(fmean(
        n for (p, _), n in lengths.items() if p not in kept))
    assert row["tail/deferred_length_mean"] > row["tail/kept_length_mean"]  # the round kept the short prompts


def test_an_on_policy_loss_is_refused_with_the_setting_and_the_fix_named():
    with pytest.raises(ConfigError, match=r"tail.continue_deferred.*'ppo_clip'.*decoupled_ppo"):
        load_config(overrides=["tail.continue_deferred=true"])
    assert load_config(overrides=["tail.continue_deferred=true", "train.loss=decoupled_ppo"]).tail.continue_deferred
    assert not load_config().tail.continue_deferred  # off by default


def trained_lengths(continue_deferred: bool, rounds: int) -> list[int]:
    """The default round shape (P0 32, R = R0 = 8, 1.25 x prompts, 128 slots), lengths LogNormal (mean ~75)."""
    settings = TailSettings(prompts_per_step=32, responses_kept=8, responses_launched=8,
                            continue_deferred=continue_deferred)
    pipe = RolloutPipeline(LengthEngine(POLICY, num_slots=128), settings, 0.0, True, problems(rounds * 40),
                           make_requests)
    pipe.start(TailState())
    return [len(c.token_ids) for taken in run(pipe, range(rounds)) for c in taken.completions]


POLICY = lognormal_length(3.997, 0.8, 720)
"""The policy's length for every prompt: LogNormal(3.997, 0.8), mean 75.3 (capped at 720)."""


def test_on_one_length_distribution_the_continuing_rule_trains_the_policys_own_and_todays_a_shorter_one():
    """Every prompt has the same length distribution, so which prompts a round keeps says nothing about them:
    a rule that trains the policy's sample trains its mean. Today's rule (R = R0, deferred draws discarded
    and drawn again) keeps the prompts whose draws happened to be short: trained mean ~70.5 against 75.3."""
    draws = random.Random(0)
    policy = [POLICY(draws.getrandbits(63)) for _ in range(100_000)]
    policy_mean, policy_median = fmean(policy), median(policy)
    continued, today = trained_lengths(True, 50), trained_lengths(False, 50)
    for lengths in (continued, today):
        assert len(lengths) == 50 * 32 * 8
    standard_error = pstdev(policy) / math.sqrt(len(continued))  # ~0.6 tokens
    assert abs(fmean(continued) - policy_mean) < 3 * standard_error
    assert abs(median(continued) - policy_median) <= 2
    assert policy_mean - fmean(today) > 6 * standard_error
