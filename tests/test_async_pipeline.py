"""The asynchronous rollout pipeline (engines/tail/pipeline.py) on a real native engine, without Ray or a trainer.

Each "iteration" here is what the async flow does around the trainer: take
round i, let the rollout run a fixed number of engine steps (the train step),
pause, load the next weights (a deterministic perturbation per version: the
weights really change), resume. What is checked: the staleness bound, the
in-flight cap, tail batching inside overlapping rounds (no prompt lost or
trained twice), partial vs restarted requests, and that a pipeline restored from
a JSON snapshot continues exactly as the uninterrupted one.
"""
from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_contract import one_thread  # noqa: F401 (autouse fixture)
from test_native_engine import tiny_qwen2
from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout import NativeEngine, Request, SamplingParams
from tailflow.engines.rollout.protocol import FinishReason
from tailflow.engines.rollout.requests import request_seed
from tailflow.engines.tail.launch import launch_order
from tailflow.engines.tail.pipeline import RolloutPipeline, Unobserved
from tailflow.engines.track.rollout_trace import trace_of
from tailflow.engines.tail.pipeline_state import PipelineState
from tailflow.engines.tail.state import TailSettings, TailState

P0, R0 = 3, 2


class OneEngine:
    """The `StreamingRollout` calls on one in-process engine (what `RolloutGroup` does over Ray actors)."""

    def __init__(self, engine: NativeEngine) -> None:
        self.engine = engine

    def submit(self, requests):
        self.engine.submit(requests)

    def poll(self, max_steps):
        finished = []
        for _ in range(max_steps):
            if not self.engine.has_unfinished():
                break
            finished += self.engine.step()
        return finished

    def abort(self, request_ids):
        return self.engine.abort(request_ids)

    def generate(self, requests):
        """A batch to completion (a synchronous long round nobody watches), in request order."""
        self.submit(requests)
        by_id = {}
        while self.has_unfinished():
            by_id.update((c.request_id, c) for c in self.poll(64))
        return [by_id[request.request_id] for request in requests]

    def has_unfinished(self):
        return self.engine.has_unfinished()

    def stats(self):
        return [self.engine.stats()]


def weights(version: int) -> dict[str, torch.Tensor]:
    model = tiny_qwen2()
    generator = torch.Generator().manual_seed(1000 + version)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05 * version)
    return model.state_dict()


PROBLEMS = [Problem(f"p{i:02d}", f"prompt {i}", "0") for i in range(40)]


def make_requests(planned):
    return [Request.for_problem(p.problem_id, k, (2 + int(p.problem_id[1:]) % 30, 5, 7),
                                SamplingParams(max_new_tokens=20,
                                               seed=request_seed(0, planned.plan.iteration, p.problem_id, k)))
            for p, k in launch_order(planned.problems, planned.plan.responses_per_prompt)]


def pipeline(alpha: float, partial: bool = True, tail: bool = True, prompt_ratio: float = 1.5,
             steps_per_poll: int = 2, observe=None, continue_deferred: bool = False) -> RolloutPipeline:
    engine = NativeEngine(tiny_qwen2(), num_slots=8, max_seq_len=32, eos_token_ids=(1,))
    tail_settings = TailSettings(prompts_per_step=P0, responses_kept=R0, prompt_ratio=prompt_ratio,
                                 responses_launched=3, enabled=tail, data_seed=0, steps_per_poll=steps_per_poll,
                                 continue_deferred=continue_deferred)
    return RolloutPipeline(OneEngine(engine), tail_settings, alpha, partial, PROBLEMS, make_requests, observe)


def run(pipe: RolloutPipeline, iterations: range, steps_during_train: int = 6):
    """Drive `iterations` as the async flow does; the rounds taken, and the snapshot after each."""
    taken, snapshots = [], []
    for i in iterations:
        round_ = pipe.take(i)
        taken.append(round_)
        pipe.roll_while(lambda: True, steps_during_train)
        assert pipe.prompts_in_flight() <= pipe.max_prompts_in_flight
        pipe.pause()
        pipe.rollout.engine.load_weights(weights(i + 1), i + 1)
        pipe.resume(i + 1)
        snapshots.append(pipe.snapshot())
    return taken, snapshots


class Scoring(Unobserved):
    """A round's observer as streamed scoring sees it: every response as it finishes."""

    watches_each_response = True

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_finished(self, completions):
        self.seen += [c.request_id for c in completions]


def fresh(alpha: float, **kwargs) -> RolloutPipeline:
    """A pipeline at iteration 0, as a new run's first iteration restores it."""
    pipe = pipeline(alpha, **kwargs)
    pipe.restore(PipelineState(), TailState(), 0, 0)
    return pipe


@pytest.mark.parametrize("alpha", [1, 2])
def test_rounds_run_ahead_within_the_staleness_bound_and_lose_no_prompt(alpha):
    pipe = fresh(alpha)
    taken, snapshots = run(pipe, range(6))
    assert max(t.rounds_ahead for t in taken) == alpha  # it really runs ahead, as far as allowed
    trained: list[str] = []
    for i, round_ in enumerate(taken):
        assert len(round_.problems) == P0
        assert all(len(c.token_ids) > 0 for c in round_.completions)
        assert max(round_.staleness) <= alpha  # versions between the trained weights (i) and the oldest token
        for completion in round_.completions:
            assert i - completion.oldest_weight_version <= alpha and completion.weight_version <= i
        trained += [p.problem_id for p in round_.problems]
    assert any(lag > 0 for t in taken for lag in t.staleness)  # some responses really were stale
    assert any(t.mixed_version_responses for t in taken)  # and some were continued across a sync
    assert len(trained) == len(set(trained))  # nothing trained twice
    live = {p for saved in snapshots[-1].rounds for p in saved.problem_ids}
    queued = {q.problem_id for q in pipe.tail.queue}
    drawn = pipe.tail.cursor.num_drawn
    assert len(set(trained) | live | queued) == drawn  # every prompt drawn is trained, queued or in a live round
    assert not (set(trained) & live) and not (live & queued)


def test_alpha_bounds_the_prompts_in_flight():
    pipe = fresh(1)
    run(pipe, range(2))
    cap = pipe.max_prompts_in_flight
    assert cap == 2 * P0
    for _ in range(30):
        pipe.poll(1)
        assert pipe.prompts_in_flight() <= cap


def test_without_partial_rollout_a_stopped_request_starts_over_under_the_new_weights():
    pipe = fresh(1, partial=False)
    taken, _ = run(pipe, range(4))
    for i, round_ in enumerate(taken):
        for completion in round_.completions:
            assert completion.token_weight_versions == ()  # one version sampled every token
            assert i - completion.weight_version <= 1


@pytest.mark.parametrize("partial", [True, False])
def test_a_pipeline_restored_from_its_snapshot_continues_exactly(partial):
    uninterrupted = fresh(1, partial=partial)
    whole, _ = run(uninterrupted, range(5))

    first = fresh(1, partial=partial)
    before, snapshots = run(first, range(2))
    saved = PipelineState.model_validate_json(snapshots[-1].model_dump_json())  # through JSON, as committed
    tail = TailState.model_validate_json(first.tail.model_dump_json())
    second = pipeline(1, partial=partial)
    second.rollout.engine.load_weights(weights(2), 2)
    second.restore(saved, tail, 2, 2)
    after, _ = run(second, range(2, 5))

    for expected, got in zip(whole, before + after):
        assert [c.request_id for c in got.completions] == [c.request_id for c in expected.completions]
        assert [c.token_ids for c in got.completions] == [c.token_ids for c in expected.completions]
        assert [c.logprobs for c in got.completions] == [c.logprobs for c in expected.completions]
        assert got.staleness == expected.staleness
        assert got.stats.tokens_generated == expected.stats.tokens_generated
        assert got.stats.bubble_ratio == expected.stats.bubble_ratio
        assert got.result.deferred_problem_ids == expected.result.deferred_problem_ids
    assert second.tail == uninterrupted.tail
    assert second.snapshot() == uninterrupted.snapshot()


@pytest.mark.parametrize("alpha", [0, 1])
def test_continued_deferred_responses_keep_their_tokens_and_resume_exactly(alpha):
    """tail.continue_deferred on the native engine: a long round's response of a deferred prompt starts with the
    tokens and log-probs its short round left (each token with the version that sampled it), and a pipeline
    restored from a snapshot holding carried responses continues exactly as the uninterrupted one."""
    whole, _ = run(fresh(alpha, continue_deferred=True), range(6))
    carried = {(c.problem_id, c.index): c for t in whole for cs in t.result.carried.values() for c in cs}
    continued = [c for t in whole for c in t.completions if c.request_id in t.continued]
    assert continued
    for completion in continued:
        began = carried[(completion.problem_id, completion.index)]
        n = len(began.token_ids)
        assert completion.token_ids[:n] == began.token_ids and completion.logprobs[:n] == began.logprobs
        assert completion.as_prefix().weight_versions[:n] == began.as_prefix().weight_versions
        if began.finish_reason is not FinishReason.ABORT:  # finished in its short round: trained as it was
            assert completion.token_ids == began.token_ids

    first = fresh(alpha, continue_deferred=True)
    before, snapshots = run(first, range(2))
    saved = PipelineState.model_validate_json(snapshots[-1].model_dump_json())
    assert saved.carried or any(r.carried for r in saved.rounds)
    second = pipeline(alpha, continue_deferred=True)
    second.rollout.engine.load_weights(weights(2), 2)
    second.restore(saved, TailState.model_validate_json(first.tail.model_dump_json()), 2, 2)
    after, _ = run(second, range(2, 6))
    for expected, got in zip(whole, before + after):
        assert [c.token_ids for c in got.completions] == [c.token_ids for c in expected.completions]
        assert got.continued == expected.continued


def test_a_snapshot_whose_rules_and_requests_disagree_is_refused():
    pipe = fresh(1)
    _, snapshots = run(pipe, range(1))
    broken = copy.deepcopy(snapshots[-1].model_dump())
    broken["in_flight"] = broken["in_flight"][1:]
    with pytest.raises(ValueError, match="inconsistent"):
        pipeline(1).restore(PipelineState.model_validate(broken), pipe.tail, 1, 1)


@settings(max_examples=6, deadline=None)
@given(alpha=st.sampled_from([1, 2, 3]), partial=st.booleans(), tail=st.booleans(),
       prompt_ratio=st.sampled_from([1.0, 1.5, 2.0]), steps_during_train=st.integers(0, 12),
       steps_per_poll=st.integers(1, 3), stop_after=st.integers(1, 4))
def test_any_async_run_loses_nothing_trains_nothing_twice_and_resumes_exactly(
        alpha, partial, tail, prompt_ratio, steps_during_train, steps_per_poll, stop_after):
    options = dict(partial=partial, tail=tail, prompt_ratio=prompt_ratio, steps_per_poll=steps_per_poll)
    uninterrupted = fresh(alpha, **options)
    whole, _ = run(uninterrupted, range(5), steps_during_train)

    first = fresh(alpha, **options)
    _, snapshots = run(first, range(stop_after), steps_during_train)
    second = pipeline(alpha, **options)
    second.rollout.engine.load_weights(weights(stop_after), stop_after)
    second.restore(PipelineState.model_validate_json(snapshots[-1].model_dump_json()), first.tail, stop_after,
                   stop_after)
    resumed, _ = run(second, range(stop_after, 5), steps_during_train)
    assert [[c.token_ids for c in t.completions] for t in resumed] == \
        [[c.token_ids for c in t.completions] for t in whole[stop_after:]]
    assert second.snapshot() == uninterrupted.snapshot() and second.tail == uninterrupted.tail

    trained = [p.problem_id for t in whole for p in t.problems]
    assert len(trained) == len(set(trained)) == 5 * P0
    assert all(max(t.staleness) <= alpha for t in whole)
    live = {p for saved in uninterrupted.snapshot().rounds for p in saved.problem_ids}
    queued = {q.problem_id for q in uninterrupted.tail.queue}
    assert len(set(trained) | live | queued) == uninterrupted.tail.cursor.num_drawn


def test_rounds_running_ahead_are_scored_as_they_finish_and_every_round_is_traced():
    """Streamed scoring in an asynchronous run: each round's observer (its scorer) is built at launch and sees
    its responses as they finish, many before the trainer takes the round; every taken round has a trace row."""
    observers = {}

    def observe(planned, version):
        return observers.setdefault(planned.plan.iteration, Scoring())

    pipe = fresh(1, observe=observe)
    seen_before_take = {}
    for i in range(4):
        seen_before_take[i] = len(observers[i].seen) if i in observers else 0
        round_ = pipe.take(i)
        pipe.roll_while(lambda: True, 24)  # a long train step: the next round's short responses finish in it
        pipe.pause()
        pipe.rollout.engine.load_weights(weights(i + 1), i + 1)
        pipe.resume(i + 1)
        kept = {c.request_id for c in round_.completions}
        assert kept <= set(observers[i].seen)  # every kept response was streamed to its round's scorer
        trace = trace_of(round_, 20)
        assert trace.iteration == i and sum(len(p.responses) for p in trace.prompts) == len(round_.requests)
        assert sum(r.outcome == "kept" for p in trace.prompts for r in p.responses) == len(round_.completions)
    assert all(seen_before_take[i] > 0 for i in range(1, 4))  # scored while the round before it trained


def test_a_synchronous_pipeline_takes_each_round_only_after_the_weights_that_train_it():
    """alpha 0: nothing is launched ahead, nothing is in flight at the weight sync, nothing is stale."""
    pipe = fresh(0)
    taken, snapshots = run(pipe, range(4))
    assert all(t.rounds_ahead == 0 and t.prompts_in_flight == 0 and set(t.staleness) == {0} for t in taken)
    assert all(s.is_empty for s in snapshots)
    trained = [p.problem_id for t in taken for p in t.problems]
    assert len(trained) == len(set(trained)) == 4 * P0
