"""The simulated engine honours the protocol: replaying the trace of a seeded native-engine run.

One in-process worker (a random tiny Qwen2 on CPU, 8 slots so admission and
row packing matter) runs real rounds of the tail-batching policy on the
product's pipeline; its trace then drives the simulated engine on the same
pipeline and rule. Everything the policy decides must come out the same: the
finish order, which requests are kept, finished unkept or aborted (and how far
each aborted one got), the prompts completed and deferred, and the engine step
at which the round ends.
"""
from __future__ import annotations

import dataclasses

import bench_path  # noqa: F401  (bench/research is not part of the package)
import pytest
import torch
from research.replay import TraceLengths

from tailflow.engines.data.arith import default_splits
from tailflow.engines.data.tokenizer import build_char_tokenizer
from one_round import take_one_round
from tailflow.engines.rollout import RolloutWorker, SamplingParams
from tailflow.engines.rollout.requests import sampling_requests
from tailflow.engines.rollout.worker import LocalRollout
from tailflow.engines.sim.engine import SimEngine
from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.roofline import RooflineCost
from tailflow.engines.tail import LongPromptQueue, RoundKind, make_round_plan
from tailflow.engines.track.rollout_trace import trace_of

NUM_SLOTS = 8
MAX_NEW_TOKENS = 40


@pytest.fixture(scope="module")
def native_rounds(random_tiny_model_dir):
    """A short round (P0=4 of 6 prompts, R0=3 of 4 responses) and a long round, on the native engine."""
    torch.set_num_threads(1)
    problems, _ = default_splits(12, 1, seed=3)
    tokenizer = build_char_tokenizer()
    params = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS)
    longest = max(len(tokenizer(p.prompt)["input_ids"]) for p in problems)
    worker = LocalRollout(RolloutWorker(str(random_tiny_model_dir), NUM_SLOTS, longest + MAX_NEW_TOKENS, seed=0))
    queue = LongPromptQueue()
    short = make_round_plan(queue, 0, 4, 3, 1.5, 4, enabled=True)
    queue.defer([p.problem_id for p in problems[6:10]], 0)  # a full queue: the next plan is a long round
    long = make_round_plan(queue, 1, 4, 3, 1.5, 4, enabled=True)
    assert short.kind is RoundKind.SHORT and long.kind is RoundKind.LONG
    rounds = []
    for plan, launched in ((short, problems[:6]), (long, problems[6:10])):
        requests = sampling_requests(launched, plan.responses_per_prompt, params, tokenizer, 0, plan.iteration)
        taken = take_one_round(worker, requests, plan.kind, plan.responses_kept, plan.prompts_to_complete,
                               steps_per_poll=2, iteration=plan.iteration)
        trace = untimed(trace_of(taken, MAX_NEW_TOKENS))
        rounds.append((plan, requests, taken.result, trace, taken.stats.max_engine_steps,
                       [c.request_id for c in taken.finished]))
    return rounds


def replay(plan, requests, traces):
    cost = RooflineCost.from_presets("h100", "qwen2.5-7b", 1, 1)
    lengths = TraceLengths(traces)
    lengths.launch(plan.iteration, requests)
    group = SimGroup(lambda rank: SimEngine(cost, lengths, NUM_SLOTS), 1)
    taken = take_one_round(group, requests, plan.kind, plan.responses_kept, plan.prompts_to_complete,
                           steps_per_poll=2, iteration=plan.iteration)
    return taken.result, untimed(trace_of(taken, MAX_NEW_TOKENS)), group.stats()[0].steps, taken


def untimed(trace):
    """The trace without its wall-clock generate time (the machine's, not the policy's)."""
    return dataclasses.replace(trace, generate_s=None)


def test_short_round_replays_step_for_step(native_rounds):
    plan, requests, native_result, native_trace, native_steps, _ = native_rounds[0]
    result, trace, steps, _ = replay(plan, requests, [r[3] for r in native_rounds])
    assert native_result.aborted_request_ids, "the round must abort something, or it tests little"
    assert trace == native_trace  # every response: length, finish reason, engine step, kept/finished/aborted
    assert [(p, [c.request_id for c in cs]) for p, cs in result.completed] == [
        (p, [c.request_id for c in cs]) for p, cs in native_result.completed]  # kept, in completion order
    assert result.aborted_request_ids == native_result.aborted_request_ids  # same order
    assert result.deferred_problem_ids == native_result.deferred_problem_ids
    assert result.wasted_tokens == native_result.wasted_tokens
    assert steps == native_steps  # the round ends at the same engine step


def test_finish_order_is_the_native_one(native_rounds):
    plan, requests, _, _, _, native_order = native_rounds[0]
    _, _, _, taken = replay(plan, requests, [r[3] for r in native_rounds])
    assert len(native_order) >= 6
    assert [c.request_id for c in taken.finished] == native_order


def test_long_round_replays(native_rounds):
    plan, requests, native_result, native_trace, native_steps, _ = native_rounds[1]
    result, trace, steps, _ = replay(plan, requests, [r[3] for r in native_rounds])
    assert trace == native_trace and steps == native_steps
    assert sorted(p for p, _ in result.completed) == sorted(p for p, _ in native_result.completed)
