"""Scored groups -> training samples: advantages per response, and only completions of the trained weights."""
from types import SimpleNamespace

import pytest

from tailflow.config import TailConfig
from tailflow.engines.data.problem import Problem
from tailflow.engines.reward.scoring import ScoredGroup, ScoredResponse
from tailflow.engines.rollout.protocol import Completion, FinishReason, Request
from tailflow.engines.tail.taken import OverlapStats
from tailflow.engines.train.samples import num_zero_signal_groups, samples_from_groups, samples_with_signal
from tailflow.engines.reward.scoring import ScoredRound
from tailflow.tasks.train import train_policy


def group(problem_id: str, rewards: list[float], versions: list[int]) -> ScoredGroup:
    responses = tuple(
        ScoredResponse(Request.for_problem(problem_id, k, (1, 2)).completion((3, 4, 5), (-0.5,) * 3, FinishReason.EOS,
                                                                             version),
                       text="#### 1", reward=reward, correct=reward > 0)
        for k, (reward, version) in enumerate(zip(rewards, versions))
    )
    return ScoredGroup(Problem(problem_id, "1+0", "1"), responses)


def test_samples_carry_dr_grpo_advantages_of_their_group():
    samples = samples_from_groups([group("a", [1.0, 0.0], [3, 3]), group("b", [1.0, 1.0], [3, 3])], "dr_grpo",
                                  weight_version=3)
    # group a: mean .5 -> +.5, -.5; group b: all equal -> 0, 0
    assert [sample.advantage for sample in samples] == [0.5, -0.5, 0.0, 0.0]
    assert samples[0].response_token_ids == (3, 4, 5) and samples[0].rollout_logprobs == (-0.5,) * 3


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_equal_reward_groups_are_skipped_and_counted_alike(estimator):
    """Groups of equal non-dyadic rewards (a format reward, a share of tests, tied judge scores) get advantage
    0.0, so the zero-advantage skip leaves them out, and num_zero_signal_groups counts exactly those."""
    groups = [group("tied", [0.1] * 8, [0] * 8), group("thirds", [2 / 3] * 8, [0] * 8),
              group("mixed", [0.7, 0.7, 0.1, 0.7, 0.7, 0.7, 0.7, 0.7], [0] * 8), group("judge", [0.8] * 8, [0] * 8)]
    samples = samples_from_groups(groups, estimator, weight_version=0)
    trained = samples_with_signal(samples, skip_zero_advantage=True)
    assert {sample.reward for sample in trained} == {0.7, 0.1} and len(trained) == 8  # the mixed group only
    groups_without_signal = sum(1 for start in range(0, len(samples), 8)
                                if all(sample.advantage == 0.0 for sample in samples[start:start + 8]))
    assert num_zero_signal_groups(groups) == groups_without_signal == 3


def test_completions_of_other_weights_are_refused_naming_requests_and_versions():
    groups = [group("a", [1.0, 0.0], [3, 3]), group("b", [1.0, 0.0], [2, 3])]
    with pytest.raises(ValueError) as error:
        samples_from_groups(groups, "grpo", weight_version=3)
    message = str(error.value)
    assert "1 completions" in message and "trained version 3" in message
    assert "b#0 (version 2)" in message
    assert "a#0" not in message and "b#1" not in message


def test_the_train_task_refuses_before_the_trainer_is_called():
    """Also before the engines are put to sleep (colocated on GPUs the phases take turns): a refused step leaves
    the engines serving; an accepted one puts them to sleep first, then trains."""
    calls = []
    train = SimpleNamespace(advantage="grpo", has_critic=False, skips_zero_advantage=True, ppo_epochs=1,
                            mini_batches=1, seed=0,
                            stream=False)
    config = SimpleNamespace(train=train, cluster=SimpleNamespace(device="gpu", placement="colocated"),
                             rollout=SimpleNamespace(async_ratio=0, async_steps_per_train=0, temperature=1.0),
                             tail=TailConfig(), storage=SimpleNamespace(dump_rounds=False))
    ctx = SimpleNamespace(config=config, sampling=SimpleNamespace(temperature=1.0), critic=None,
                          rollout=SimpleNamespace(sleep=lambda: calls.append("sleep")),
                          trainer=SimpleNamespace(start_train_step=lambda samples, **options: (
                              calls.append((samples, options)) or SimpleNamespace(result=lambda: "stats", ready=lambda: True))),
                          fault_point=lambda phase, iteration: None,
                          pipeline=SimpleNamespace(max_staleness=0, roll_while=lambda busy, steps: OverlapStats()))
    observer = SimpleNamespace(stream=None)  # the round's observer (a RoundWork): no stream trainer

    def scored(versions):
        return ScoredRound([group("a", [1.0, 0.0], versions)], stats=None, seconds=0.0)

    with pytest.raises(ValueError, match="a#1 \\(version 4\\)"):
        train_policy.fn(ctx, scored([5, 4]), observer, iteration=5, weight_version=5)
    assert calls == []
    assert train_policy.fn(ctx, scored([5, 5]), observer, iteration=5, weight_version=5).stats == "stats"
    assert calls[0] == "sleep" and len(calls) == 2 and len(calls[1][0]) == 2
    assert calls[1][1] == dict(skip_zero_advantage=True, ppo_epochs=1, mini_batches=1, seed=0, value_step=None)


def spanning(request_id: str, versions: tuple[int, ...], reward: float) -> ScoredResponse:
    """A response continued across weight updates: each token names the version that sampled it."""
    completion = Completion(request_id, (1, 2), (3, 4, 5), (-0.5,) * 3, FinishReason.EOS, max(versions), versions)
    return ScoredResponse(completion, text="#### 1", reward=reward, correct=reward > 0)


def test_max_staleness_admits_responses_up_to_k_versions_old_and_none_from_the_future():
    fresh = group("a", [1.0, 0.0], [5, 5])
    old = ScoredGroup(Problem("b", "1+0", "1"), (spanning("b#0", (3, 4, 5), 1.0), spanning("b#1", (4, 4, 4), 0.0)))
    assert len(samples_from_groups([fresh, old], "grpo", weight_version=5, max_staleness=2)) == 4
    with pytest.raises(ValueError) as error:  # b#0's first token is 3 versions old
        samples_from_groups([fresh, old], "grpo", weight_version=6, max_staleness=2)
    assert "b#0 (versions 3..5)" in str(error.value) and "versions 4..6" in str(error.value)
    assert "a#" not in str(error.value) and "b#1" not in str(error.value)
    with pytest.raises(ValueError, match="a#0 \\(version 5\\), a#1 \\(version 5\\)"):  # newer than trained
        samples_from_groups([fresh], "grpo", weight_version=4, max_staleness=3)
    with pytest.raises(ValueError, match="b#0 \\(versions 3..5\\)"):  # staleness 0: one version only
        samples_from_groups([old], "grpo", weight_version=5)


def test_no_staleness_bound_admits_any_older_version_and_still_none_from_the_future():
    """tail.continue_deferred: a continued response is as old as its prompt's wait in the queue (max_staleness
    None), but a version newer than the trained weights is still a disagreement between trainer and rollout."""
    assert len(samples_from_groups([group("a", [1.0, 0.0], [0, 9])], "grpo", weight_version=9,
                                   max_staleness=None)) == 2
    with pytest.raises(ValueError, match=r"a#1 \(version 10\)"):
        samples_from_groups([group("a", [1.0, 0.0], [0, 10])], "grpo", weight_version=9, max_staleness=None)
