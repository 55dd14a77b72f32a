"""The simulator runs tailflow's own policy code, and its engine and group behave as the real ones do."""
from __future__ import annotations

import pytest

from sim_unit_cost import UnitCost

from tailflow.engines.rollout.protocol import FinishReason, Request, SamplingParams
from tailflow.engines.sim import simulate
from tailflow.engines.sim.engine import SimEngine
from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.lengths import ResponseLength
from tailflow.engines.sim.paper_lengths import PaperLikeLengths
from tailflow.engines.sim.roofline import RooflineCost
from tailflow.engines.sim.simulate import PolicySimulation
from tailflow.engines.tail import pipeline
from tailflow.engines.tail import round as tail_round
from tailflow.engines.tail.state import TailSettings
from tailflow.engines.tail.completion import CompletionRule
from tailflow.engines.tail.queue import LongPromptQueue





class FixedLengths:
    max_new_tokens = 1000

    def __init__(self, lengths: dict[str, int]) -> None:
        self.lengths = lengths

    def length_of(self, request):
        return ResponseLength(self.lengths[request.request_id], FinishReason.EOS)


def requests(ids, prompt_tokens=11, max_new_tokens=1000):
    return [Request(rid, tuple(range(prompt_tokens)), SamplingParams(max_new_tokens=max_new_tokens)) for rid in ids]


def test_the_simulator_drives_the_real_tail_functions(monkeypatch):
    """Not a copy of the policy: the simulation goes through engines/tail's own planner, rule, queue and the
    product's rollout pipeline."""
    calls = {"make_round_plan": 0, "observe": 0, "defer": 0, "take": 0}

    def spy(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    assert simulate.RolloutPipeline is pipeline.RolloutPipeline
    assert pipeline.begin_round is tail_round.begin_round and pipeline.settle_round is tail_round.settle_round
    monkeypatch.setattr(tail_round, "make_round_plan", spy("make_round_plan", tail_round.make_round_plan))
    monkeypatch.setattr(CompletionRule, "observe", spy("observe", CompletionRule.observe))
    monkeypatch.setattr(LongPromptQueue, "defer", spy("defer", LongPromptQueue.defer))
    monkeypatch.setattr(pipeline.RolloutPipeline, "take", spy("take", pipeline.RolloutPipeline.take))
    cost = RooflineCost.from_presets("h800", "qwen2.5-7b", 2, 1)
    lengths = PaperLikeLengths(400, 2048, seed=1)
    rounds = PolicySimulation(TailSettings(8, 4, 1.5, 5), lengths, SimGroup.of(cost, lengths, 2, 64)).run_cycles(4)
    assert calls["make_round_plan"] == calls["take"] == calls["defer"] == len(rounds) >= 4
    assert calls["observe"] > len(rounds)  # streamed: the rule saw many polls
    assert [r.kind.value for r in rounds].count("long") >= 1  # 4 deferred a round fill the queue of P0 = 8


def test_tail_batching_shortens_short_rounds_and_pays_in_long_ones():
    cost = RooflineCost.from_presets("h800", "qwen2.5-7b", 4, 1)
    lengths = PaperLikeLengths(2000, 4096, seed=2)
    run = lambda policy: PolicySimulation(policy, lengths, SimGroup.of(cost, lengths, 4, 256)).run_cycles(5)
    sync = run(TailSettings(16, 4, enabled=False))
    tail = run(TailSettings(16, 4, 1.25, 5))
    short = [r.rollout_s for r in tail if r.kind.value == "short"]
    long = [r.rollout_s for r in tail if r.kind.value == "long"]
    assert long and max(short) < min(r.rollout_s for r in sync) < max(long) * 1.5
    assert all(r.num_kept == 16 * 4 for r in sync + tail)  # P0 x R0 trained every round
    assert sum(r.num_aborted for r in tail if r.kind.value == "short") > 0 and all(r.num_aborted == 0 for r in sync)


def test_kv_budget_preempts_the_newest_and_recomputes_it():
    # 3 requests of 11 prompt tokens and 30 new ones, a budget of 60 tokens: all three are admitted (33 tokens),
    # after 9 steps they hold 60 and the next step does not fit: c, the newest, is preempted; after 10 more, b
    # (19 tokens); a finishes; b (30 cached) and c (20) are readmitted, hold 60 after 5 steps: c goes again.
    lengths = FixedLengths({"a#0": 30, "b#0": 30, "c#0": 30})
    engine = SimEngine(UnitCost(), lengths, num_slots=8, kv_budget_tokens=60)
    completions = engine.generate(requests(["a#0", "b#0", "c#0"], max_new_tokens=30))
    assert [c.request_id for c in completions] == ["a#0", "b#0", "c#0"]
    assert [len(c.token_ids) for c in completions] == [30, 30, 30]
    assert engine.num_preemptions == 3
    # every request decodes its 30 tokens once (preemption keeps them), so the tokens are 90...
    assert engine.stats().tokens_generated == 90
    # ...but recomputation prefills the preempted request's prompt and its generated tokens again
    unbounded = SimEngine(UnitCost(), lengths, num_slots=8)
    unbounded.generate(requests(["a#0", "b#0", "c#0"], max_new_tokens=30))
    assert engine.clock_s > unbounded.clock_s


def test_a_request_that_can_never_fit_is_refused():
    engine = SimEngine(UnitCost(), FixedLengths({"a#0": 5}), num_slots=4, kv_budget_tokens=100)
    with pytest.raises(ValueError, match="can never fit the KV budget of 100 tokens"):
        engine.submit(requests(["a#0"], prompt_tokens=50))  # 50 + 1000 new tokens


def test_engine_time_is_prefill_plus_one_cost_per_decode_step():
    engine = SimEngine(UnitCost(), FixedLengths({"a#0": 3, "b#0": 7}), num_slots=1)
    engine.generate(requests(["a#0", "b#0"]))
    # one slot: a (3 steps) then b (7 steps); each prefills 10 of its 11 prompt tokens (decode feeds the 11th)
    assert engine.clock_s == pytest.approx(10 + 2 * 0.1)
    assert engine.stats().steps == 10


def test_group_merges_a_poll_by_engine_step_not_by_replica():
    lengths = FixedLengths({"slow#0": 2, "fast#0": 1, "x#0": 5, "y#0": 5})
    group = SimGroup.of(UnitCost(), lengths, 2, num_slots=4)
    group.submit(requests(["slow#0", "fast#0", "x#0", "y#0"]))  # fewest in flight: slow, x on 0; fast, y on 1
    assert group.worker_of == {"slow#0": 0, "fast#0": 1, "x#0": 0, "y#0": 1}
    finished = group.poll(2)
    assert [c.request_id for c in finished] == ["fast#0", "slow#0"]  # replica 1's step 1 before replica 0's step 2
    assert group.finish_steps == {"fast#0": (1, 1), "slow#0": (0, 2)}
    assert group.clock_s == pytest.approx(2 + 2 * 0.1 * 2 / 2)  # 2 decode steps after 2 x 10 prefilled tokens
