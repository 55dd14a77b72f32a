"""What a multi-turn trajectory is paid (`env.reward`): its environment's rewards, the verifier's score of its
last model turn against the problem's answer (the real math reward, in process), or both added; and the config
refusing a verifier without answers to verify against. The calculator as a tool only (`task=False`)."""
from __future__ import annotations

import pytest

from tailflow.config import ConfigError, load_config
from tailflow.engines.data.problem import Problem
from tailflow.engines.data.tokenizer import build_char_tokenizer
from tailflow.engines.env.builtin.calculator import Calculator
from tailflow.engines.env.trajectory import StopReason, TrajectoryOutcome
from tailflow.engines.reward.spec import RewardSpec
from tailflow.engines.reward.streaming import StreamingScorer, last_turn_tokens
from tailflow.engines.reward.worker import RewardWorker
from tailflow.engines.rollout.protocol import Completion, FinishReason

TOKENIZER = build_char_tokenizer()


class InProcessPool:
    """The reward pool's calls, answered at once by one real reward worker in this process."""

    peak_workers = 1

    def __init__(self, worker: RewardWorker) -> None:
        self.worker, self.outcomes, self.submitted = worker, {}, []

    def submit(self, items):
        self.submitted += [item.text for item in items]
        self.outcomes.update((o.request_id, o) for o in self.worker.score(items))

    def ready(self, request_ids):
        return [self.outcomes.pop(r) for r in list(request_ids) if r in self.outcomes]

    def wait_for(self, request_ids):
        return self.ready(request_ids)

    def shrink_to_recent_need(self):
        pass


def trajectory(request_id: str, turns: list[tuple[str, str]], turn_rewards: tuple[float, ...]) -> Completion:
    """(model turn, observation) texts, tokenized with the embedded tokenizer; ended DONE."""
    tokens, mask, lengths = [], [], []
    for action, observation in turns:
        action_ids = TOKENIZER.encode(action, add_special_tokens=False)
        observation_ids = TOKENIZER.encode(observation, add_special_tokens=False) if observation else []
        tokens += action_ids + observation_ids
        mask += [True] * len(action_ids) + [False] * len(observation_ids)
        lengths.append(len(action_ids))
    outcome = TrajectoryOutcome(StopReason.DONE, turn_rewards, (0.0,) * (len(turns) + 1), tuple(lengths))
    return Completion(request_id, (5,), tuple(tokens), (0.0,) * len(tokens), FinishReason.STOP, 0, problem_id="p",
                      response_mask=tuple(mask), outcome=outcome)


@pytest.mark.parametrize("mode, right, wrong", [("environment", 0.25, 0.25), ("verifier", 1.0, 0.0),
                                                ("sum", 1.25, 0.25)])
def test_a_trajectory_is_paid_by_its_environment_the_verifier_or_both(mode, right, wrong):
    problems = [Problem("p", "23+45\n", "68")]
    pool = InProcessPool(RewardWorker(RewardSpec("math", {})))
    scorer = StreamingScorer(pool, TOKENIZER, problems, lambda problem: None, streaming=True, trajectory_reward=mode)
    answered = [trajectory("p#0", [("23+45=", "68\n"), ("#### 68", "")], (0.0, 0.25)),
                trajectory("p#1", [("23+45=", "68\n"), ("#### 67", "")], (0.0, 0.25))]
    scorer.on_finished(answered)
    outcomes, _ = scorer.finish(answered)
    assert (outcomes["p#0"].result.reward, outcomes["p#1"].result.reward) == (right, wrong)
    if mode != "environment":
        assert pool.submitted == ["#### 68", "#### 67"]  # the last model turn only, never the observations
        assert outcomes["p#0"].result.correct and not outcomes["p#1"].result.correct
    else:
        assert pool.submitted == []  # paid by the environment, nothing for the pool


def test_the_last_turn_is_found_by_its_length_when_an_observation_is_empty():
    completion = trajectory("p#0", [("12=", ""), ("#### 3", "")], (0.0, 0.0))
    assert TOKENIZER.decode(last_turn_tokens(completion)) == "#### 3"


def test_a_verifier_without_a_dataset_is_refused_by_name():
    calculator = "env.class_path=tailflow.engines.env.builtin.calculator:Calculator"
    with pytest.raises(ConfigError, match=r"env\.reward 'verifier' .*needs a dataset with answers"):
        load_config(None, [calculator, "rollout.elastic=false", "env.reward=verifier"])
    assert load_config(None, [calculator, "rollout.elastic=false"]).env.reward == "environment"


def test_the_calculator_as_a_tool_only_shows_no_task_and_leaves_the_pay_to_the_verifier():
    tool = Calculator(task=False)
    assert tool.reset(3) == ""
    assert tool.step("23+45=").observation == "68\n"
    final = tool.step("#### 68")
    assert final.done and final.reward == 0.0
