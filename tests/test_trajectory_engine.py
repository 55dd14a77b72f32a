"""`TrajectoryEngine` as a rollout engine: a request in, one trajectory's completion out (mask, outcome, versions),
aborted from outside with its turns so far and continued from them (replayed into a fresh environment) to what
the uninterrupted trajectory is, reported in flight between turns, and refusing what would break a trajectory
(new weights between its turns, a single-turn prefix). A tiny random Qwen2, in process."""
from __future__ import annotations

from dataclasses import replace

import pytest

from engine_contract import one_thread  # noqa: F401 (autouse fixture)
from test_multi_turn import EOS, STOPS, TOKENIZER, Counter, tiny_model
from tailflow.engines.data.chat_turns import PlainTextTurns
from tailflow.engines.env.environment import EnvStep
from tailflow.engines.env.trajectory import LastTurn, StopReason, TrainingRule
from tailflow.engines.rollout import NativeEngine, SamplingParams
from tailflow.engines.rollout.multi_turn import LocalEnvironments
from tailflow.engines.rollout.protocol import FinishReason, Request, ResponsePrefix
from tailflow.engines.rollout.trajectory_engine import EnvSchedule, TrajectoryEngine, TurnLimits

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
    with pytest.raises(ValueError, match="single-turn response's"):
        engine.submit([prefixed])
    done = run_all(engine) if engine.has_unfinished() else {}
    assert done == {}


def test_an_aborted_trajectory_continued_from_its_prefix_ends_as_the_uninterrupted_one():
    """Stopped after every number of steps (inside a turn, while the environment answers, between turns), then
    continued (`as_prefix`, replayed into a fresh environment), stopped again while replaying and continued
    again: the same tokens, mask, log-probs, rewards and stop as the trajectory never stopped. The weights do not change here, so the continued turns must match."""
    limits = TurnLimits(4, 16, 120, 128)

    def fresh_engine() -> TrajectoryEngine:  # one slot for two trajectories: a turn may wait for it (ANSWERED)
        inner = NativeEngine(tiny_model(), num_slots=1, max_seq_len=128, eos_token_ids=(EOS,))
        return TrajectoryEngine(inner, LocalEnvironments(lambda key: Counter()), PlainTextTurns(TOKENIZER), limits)

    engine = fresh_engine()
    engine.submit(requests(2))
    whole, steps = {}, 0
    while engine.has_unfinished():
        whole.update((c.request_id, c) for c in engine.step())
        steps += 1
    stood = set()
    for stop_after in range(1, steps - 1):
        engine = fresh_engine()
        engine.submit(requests(2))
        continued = {}
        for _ in range(stop_after):
            continued.update((c.request_id, c) for c in engine.step())
        aborted = engine.abort(["p#0", "p#1"])
        stood.update(c.outcome.last_turn for c in aborted if c.token_ids)
        by_id = {r.request_id: r for r in requests(2)}
        engine.submit([Request(**{**by_id[c.request_id].__dict__, "prefix": c.as_prefix() if c.token_ids else None})
                       for c in aborted])
        continued.update((c.request_id, c) for c in engine.step())  # the replay under way: stopped again
        aborted = engine.abort(["p#0", "p#1"])
        engine.submit([Request(**{**by_id[c.request_id].__dict__, "prefix": c.as_prefix() if c.token_ids else None})
                       for c in aborted])
        continued.update(run_all(engine))
        for request_id, completion in whole.items():
            again = continued[request_id]
            assert again.token_ids == completion.token_ids, (stop_after, request_id)
            assert again.response_mask == completion.response_mask and again.prompt_token_ids == completion.prompt_token_ids
            assert again.logprobs == pytest.approx(completion.logprobs, abs=1e-5)
            assert (again.outcome.stop_reason, again.outcome.turn_rewards, again.outcome.action_lengths) == (
                completion.outcome.stop_reason, completion.outcome.turn_rewards, completion.outcome.action_lengths)
    assert stood == {LastTurn.SAMPLING, LastTurn.AWAITING_ENV, LastTurn.ANSWERED}


def test_a_replayed_turn_answered_differently_ends_the_trajectory_as_env_error():
    """An environment that is not deterministic given its seed and actions cannot be replayed: the continued
    trajectory ends ENV_ERROR (dropped) instead of training on an observation the environment never gave."""
    opened = []

    class Drifting(Counter):
        def step(self, action):
            return EnvStep(f"{len(opened)}:", reward=1.0)

    def opening(key):
        opened.append(key)
        return Drifting()

    inner = NativeEngine(tiny_model(), num_slots=4, max_seq_len=128, eos_token_ids=(EOS,))
    engine = TrajectoryEngine(inner, LocalEnvironments(opening), PlainTextTurns(TOKENIZER), TurnLimits(4, 16, 120, 128))
    engine.submit(requests(1))
    while not any(len(e.turns) >= 2 for e in engine.episodes.values()):
        engine.step()
    (aborted,) = engine.abort(["p#0"])
    engine.submit([Request(**{**requests(1)[0].__dict__, "prefix": aborted.as_prefix()})])
    (ended,) = run_all(engine).values()
    assert ended.outcome.stop_reason is StopReason.ENV_ERROR and ended.outcome.rule is TrainingRule.DROPPED
    assert len(opened) == 2


def test_a_trajectory_prefix_is_refused_by_a_single_turn_engine_and_checked_against_its_mask():
    engine = engine_with({})
    engine.submit(requests(1))
    while not any(len(e.turns) >= 2 for e in engine.episodes.values()):
        engine.step()
    (aborted,) = engine.abort(["p#0"])
    prefix = aborted.as_prefix()
    with pytest.raises(ValueError, match="only a TrajectoryEngine continues"):
        engine.engine.submit([Request("x", PROMPT, SamplingParams(max_new_tokens=100), prefix)])
    broken = ResponsePrefix(prefix.token_ids, prefix.logprobs, prefix.weight_versions, prefix.response_mask,
                            replace(prefix.outcome, action_lengths=(prefix.outcome.action_lengths[0] + 1,
                                                                    *prefix.outcome.action_lengths[1:])))
    with pytest.raises(ValueError, match="does not match its response mask"):
        engine.submit([Request(**{**requests(1)[0].__dict__, "prefix": broken})])
    with pytest.raises(ValueError, match="nothing to continue"):
        engine.submit(requests(1, "q"))
        next(iter(run_all(engine).values())).as_prefix()


def test_an_aborted_trajectory_survives_the_committed_forms_and_continues_from_them():
    """A resumed async run continues the trajectories in flight from `PipelineState.in_flight`, and a long round
    the deferred ones from `CarriedGroup`: both keep the prompt with its first observation, the mask and the
    outcome through JSON, and the continuation from the saved form ends as the uninterrupted trajectory."""
    from tailflow.engines.tail.carry import carried_groups
    from tailflow.engines.tail.pipeline_state import PipelineState, SavedCompletion

    def fresh_engine() -> TrajectoryEngine:
        inner = NativeEngine(tiny_model(), num_slots=4, max_seq_len=128, eos_token_ids=(EOS,))
        return TrajectoryEngine(inner, LocalEnvironments(lambda key: Counter()), PlainTextTurns(TOKENIZER),
                                TurnLimits(4, 16, 120, 128))

    engine = fresh_engine()
    engine.submit(requests(1))
    (whole,) = run_all(engine).values()
    engine = fresh_engine()
    engine.submit(requests(1))
    for _ in range(5):
        engine.step()
    (aborted,) = engine.abort(["p#0"])
    request = requests(1)[0]
    saved = PipelineState.model_validate_json(PipelineState(in_flight=[SavedCompletion.of(aborted)]).model_dump_json())
    assert saved.in_flight[0].completion(request) == aborted
    (group,) = carried_groups({"p": [aborted]}, [request], responses_kept=1, iteration=3)
    (carried,) = PipelineState.model_validate_json(PipelineState(carried=[group]).model_dump_json()).carried
    assert carried.responses[0].completion(request) == aborted
    continuing = carried.responses[0].request(request, carried.deferred_iteration)
    engine.submit([continuing])
    (again,) = run_all(engine).values()
    assert (again.token_ids, again.response_mask, again.outcome.turn_rewards) == (
        whole.token_ids, whole.response_mask, whole.outcome.turn_rewards)


class HeldBack(LocalEnvironments):
    """In-process environments whose replies to `slow` keys are not in yet (`ready` leaves them out) until
    `release()`: the timing of a slow environment, without sleeping. `wait` on one of them would block forever."""

    def __init__(self, slow: set[str]) -> None:
        super().__init__(lambda key: Counter())
        self.slow = slow

    def release(self) -> None:
        self.slow = set()

    def ready(self, keys, wait_for_one):
        answered = [key for key in keys if key not in self.slow or key not in self.replies]
        assert answered or not wait_for_one, "nothing else to decode: the engine would wait here"
        return self.wait(answered)

    def wait(self, keys):
        assert not set(keys) & self.slow or all(key not in self.replies for key in set(keys) & self.slow), \
            "a lockstep engine waits for the slow environment here"
        return super().wait(keys)


def test_async_schedule_lets_a_trajectory_run_on_while_anothers_environment_is_slow():
    """ASYNC: p#1 takes all its turns while p#0's first step is still unanswered (lockstep would wait for it at
    its next step); once answered, p#0 ends normally."""
    environments = HeldBack(slow=set())
    inner = NativeEngine(tiny_model(), num_slots=4, max_seq_len=128, eos_token_ids=(EOS,))
    engine = TrajectoryEngine(inner, environments, PlainTextTurns(TOKENIZER), TurnLimits(3, 16, 100, 128),
                              schedule=EnvSchedule.ASYNC)
    engine.submit(requests(2))
    done = {}
    while not engine.episodes["p#0"].turns and engine.episodes["p#0"].pending_action is None:
        done.update((c.request_id, c) for c in engine.step())
    environments.slow = {"p#0"}  # its first step's reply is held back from here
    while "p#1" not in done:
        done.update((c.request_id, c) for c in engine.step())
    assert engine.episodes["p#0"].pending_action is not None and not engine.episodes["p#0"].turns
    environments.release()
    done.update(run_all(engine))
    assert done["p#0"].outcome.stop_reason is StopReason.MAX_TURNS and done["p#0"].outcome.num_turns == 3

    lockstep = engine_with({}, TurnLimits(3, 16, 100, 128))
    lockstep.environments = HeldBack(slow=set())
    lockstep.submit(requests(2))
    while not lockstep.episodes["p#0"].turns and lockstep.episodes["p#0"].pending_action is None:
        lockstep.step()
    lockstep.environments.slow = {"p#0"}
    with pytest.raises(AssertionError, match="lockstep engine waits"):
        lockstep.step()


def test_turn_sync_schedule_starts_no_turn_before_every_trajectory_is_answered():
    """TURN_SYNC: every inner submission finds the inner engine idle (all turns done, all answers in); the
    trajectories end as under lockstep, by the same stop rules."""
    inner = NativeEngine(tiny_model(), num_slots=4, max_seq_len=128, eos_token_ids=(EOS,))
    submissions = []  # (inner steps so far, was the inner engine busy, ids), per submit call
    submit = inner.submit

    def recording(requests_):
        submissions.append((inner.num_steps, inner.has_unfinished(), [r.request_id for r in requests_]))
        submit(requests_)

    inner.submit = recording
    engine = TrajectoryEngine(inner, LocalEnvironments(lambda key: Counter()), PlainTextTurns(TOKENIZER),
                              TurnLimits(3, 16, 100, 128), schedule=EnvSchedule.TURN_SYNC)
    engine.submit(requests(3))
    done = run_all(engine)
    assert sorted(done) == ["p#0", "p#1", "p#2"]
    assert all(c.outcome.stop_reason is StopReason.MAX_TURNS for c in done.values())
    first_of_each_release = {}
    for steps, busy, _ in submissions:
        first_of_each_release.setdefault(steps, busy)
    assert list(first_of_each_release.values()) == [False] * 3 and len(submissions) == 9  # 3 releases, 3 turns each
    turn_of = [int(rid.split("/turn")[1]) for _, _, ids in submissions for rid in ids]
    assert turn_of == sorted(turn_of)  # turn k of every trajectory before any turn k + 1
