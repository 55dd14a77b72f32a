"""`TrajectoryEngine` as a rollout engine: a request in, one trajectory's completion out (mask, outcome, versions),
aborted from outside with its turns so far, reported in flight between turns, and refusing what would break a
trajectory (new weights between its turns, a continuation from a prefix). A tiny random Qwen2, in process."""
from __future__ import annotations

import pytest

from engine_contract import one_thread  # noqa: F401 (autouse fixture)
from test_multi_turn import EOS, STOPS, TOKENIZER, Counter, tiny_model
from tailflow.engines.data.chat_turns import PlainTextTurns
from tailflow.engines.env.trajectory import StopReason, TrainingRule
from tailflow.engines.rollout import NativeEngine, SamplingParams
from tailflow.engines.rollout.multi_turn import LocalEnvironments
from tailflow.engines.rollout.protocol import FinishReason, Request, ResponsePrefix
from tailflow.engines.rollout.trajectory_engine import TrajectoryEngine, TurnLimits

PROMPT = tuple(TOKENIZER.encode("12ab "))


def engine_with(environments: dict, limits: TurnLimits | None = None) -> TrajectoryEngine:
    inner = NativeEngine(tiny_model(), num_slots=4, max_seq_len=128, eos_token_ids=(EOS,))
    return TrajectoryEngine(inner, LocalEnvironments(lambda key: environments.setdefault(key, Counter())),
                            PlainTextTurns(TOKENIZER), limits or TurnLimits(3, 16, 100, 128), keep_trajectories=True)


def requests(n: int, problem_id: str = "p") -> list[Request]:
    params = SamplingParams(temperature=1.0, seed=7, stop_token_ids=STOPS)
    return [Request.for_problem(problem_id, i, PROMPT, params) for i in range(n)]


def run_all(engine: TrajectoryEngine) -> dict:
    done = {}
    while engine.has_unfinished():
        done.update((c.request_id, c) for c in engine.step())
    return done


def test_a_trajectory_comes_back_as_its_requests_completion_with_mask_and_outcome():
    environments = {}
    engine = engine_with(environments)
    engine.submit(requests(3))
    done = run_all(engine)
    assert sorted(done) == ["p#0", "p#1", "p#2"]
    trajectories = dict(zip(sorted(done), engine.take_trajectories(sorted(done))))
    for request_id, completion in done.items():
        trajectory = trajectories[request_id]
        assert completion.token_ids == trajectory.response_token_ids
        assert completion.response_mask == trajectory.response_mask and False in completion.response_mask
        assert completion.logprobs == trajectory.rollout_logprobs
        assert completion.prompt_token_ids == trajectory.prompt_token_ids  # the prompt and the first observation
        assert completion.prompt_token_ids[:len(PROMPT)] == PROMPT and len(completion.prompt_token_ids) > len(PROMPT)
        assert completion.outcome.stop_reason is StopReason.MAX_TURNS and completion.outcome.num_turns == 3
        assert completion.outcome.reward == trajectory.reward == 3.0  # Counter pays 1 a step
        assert completion.finish_reason is FinishReason.STOP and completion.outcome.rule is TrainingRule.TRAINED
        assert len(completion.token_weight_versions) == len(completion.token_ids)
        assert environments[request_id].closed
    assert engine.stats().num_kept == 0 and not engine.episodes


def test_the_group_shares_one_environment_seed_and_other_prompts_get_others():
    seeds = {}

    class Seeing(Counter):
        def __init__(self, key):
            super().__init__()
            self.key = key

        def reset(self, seed):
            seeds[self.key] = seed
            return super().reset(seed)

    inner = NativeEngine(tiny_model(), num_slots=4, max_seq_len=128, eos_token_ids=(EOS,))
    engine = TrajectoryEngine(inner, LocalEnvironments(Seeing), PlainTextTurns(TOKENIZER), TurnLimits(1, 8, 50, 128))
    engine.submit(requests(2, "p") + requests(2, "q"))
    run_all(engine)
    assert seeds["p#0"] == seeds["p#1"] != seeds["q#0"] == seeds["q#1"]


def test_an_abort_between_or_within_turns_ends_the_trajectory_with_its_turns_so_far():
    engine = engine_with({}, TurnLimits(6, 16, 120, 128))
    engine.submit(requests(2))
    while not any(len(e.turns) >= 1 for e in engine.episodes.values()):
        engine.step()
    in_flight = {t.request_id: t for t in engine.in_flight()}
    assert set(in_flight) == {"p#0", "p#1"}
    for reported in in_flight.values():  # one log-prob and one version per token, a turn awaiting its answer too
        assert len(reported.token_ids) == len(reported.logprobs) == len(reported.weight_versions) > 0
    episode = engine.episodes["p#0"]
    assert in_flight["p#0"].token_ids[:episode.num_response_tokens] == list(
        episode.conversation[len(episode.prompt_token_ids):])
    aborted = engine.abort(["p#0", "unknown"])
    assert [c.request_id for c in aborted] == ["p#0"]
    assert aborted[0].finish_reason is FinishReason.ABORT and aborted[0].outcome.stop_reason is StopReason.ABORT
    assert aborted[0].outcome.rule is TrainingRule.DROPPED and aborted[0].outcome.num_turns >= 1
    rest = run_all(engine)
    assert list(rest) == ["p#1"] and rest["p#1"].finish_reason is not FinishReason.ABORT
    assert engine.stats().num_kept == 0


def test_new_weights_between_turns_and_a_continuation_from_a_prefix_are_refused():
    engine = engine_with({})
    engine.submit(requests(1))
    engine.step()
    with pytest.raises(RuntimeError, match="trajectories in flight"):
        engine.load_weights(engine.engine.runner.model.state_dict(), 1)
    run_all(engine)
    engine.load_weights(engine.engine.runner.model.state_dict(), 1)  # between trajectories: fine
    prefixed = Request("p#9", PROMPT, SamplingParams(), problem_id="p", index=9,
                       prefix=ResponsePrefix((3,), (-0.5,), (0,)))
    with pytest.raises(ValueError, match="cannot be continued from a ResponsePrefix"):
        engine.submit([prefixed])
    done = run_all(engine) if engine.has_unfinished() else {}
    assert done == {}
