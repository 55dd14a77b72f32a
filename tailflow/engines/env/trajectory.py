"""One multi-turn trajectory as the trainer sees it, and how each way of ending is trained.

A trajectory is the prompt, then model turns, each followed by the environment's observation (tokenized once,
chat-template boundary tokens included). For training it is one sample: the prompt, then every token after it,
with a mask that is True on the model's own tokens only. Observation tokens carry no loss, no KL and no entropy
(the model did not sample them), so their log-prob slots hold 0.0 and are never read.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class StopReason(str, Enum):
    """Why a trajectory ended: every trajectory has exactly one."""

    DONE = "done"
    """The environment said the task is over."""
    MAX_TURNS = "max_turns"
    """`env.max_turns` model turns taken."""
    TURN_TOKEN_LIMIT = "turn_token_limit"
    """A model turn reached `env.turn_max_tokens`. One rule in every mode (sync, async, tail-batched): the
    trajectory ends there, the cut turn is kept and trained, the environment never sees it."""
    TRAJECTORY_TOKEN_LIMIT = "trajectory_token_limit"
    """The model's and the environment's tokens together reached `env.trajectory_max_tokens`."""
    CONTEXT_OVERFLOW = "context_overflow"
    """The next observation would not fit the model's context."""
    ENV_ERROR = "env_error"
    """The environment raised (not `InvalidAction`) or its process died."""
    TIMEOUT = "timeout"
    """An environment reset or step outlived its timeout."""
    ABORT = "abort"
    """Stopped from outside: tail batching's abort, a cancelled run."""


class TrainingRule(str, Enum):
    TRAINED = "trained"
    """A sample with its reward, like any finished response."""
    DROPPED = "dropped"
    """Not trained and not counted in its group's baseline: the environment, not the model, decided the outcome."""


TRAINING_RULE: dict[StopReason, TrainingRule] = {
    StopReason.DONE: TrainingRule.TRAINED,
    StopReason.MAX_TURNS: TrainingRule.TRAINED,
    StopReason.TURN_TOKEN_LIMIT: TrainingRule.TRAINED,
    StopReason.TRAJECTORY_TOKEN_LIMIT: TrainingRule.TRAINED,
    StopReason.CONTEXT_OVERFLOW: TrainingRule.TRAINED,
    StopReason.ENV_ERROR: TrainingRule.DROPPED,
    StopReason.TIMEOUT: TrainingRule.DROPPED,
    StopReason.ABORT: TrainingRule.DROPPED,
}
"""The model's own limits are trained (like a single-turn response cut at its length cap, with the reward it
got); the environment's failures and outside stops are dropped."""


@dataclass(frozen=True)
class Turn:
    """One model turn and what the environment answered."""

    action_token_ids: tuple[int, ...]
    """Exactly the tokens the model sampled."""
    action_logprobs: tuple[float, ...]
    """The behaviour policy's log-prob of each of them."""
    action_weight_versions: tuple[int, ...]
    """The weight version that sampled each of them."""
    observation_token_ids: tuple[int, ...]
    """The environment's answer as appended (template boundary tokens included); () after the last turn."""
    reward: float = 0.0
    env_step_s: float = 0.0
    """Seconds the environment took for this step."""

    def __post_init__(self) -> None:
        n = len(self.action_token_ids)
        if len(self.action_logprobs) != n or len(self.action_weight_versions) != n:
            raise ValueError(f"a turn of {n} tokens has {len(self.action_logprobs)} log-probs and "
                             f"{len(self.action_weight_versions)} weight versions")


@dataclass(frozen=True)
class Trajectory:
    """One environment episode from its reset to its stop."""

    problem_id: str
    index: int
    """Its place in its group (the group shares `env_seed`)."""
    env_seed: int
    prompt_token_ids: tuple[int, ...]
    """The task's prompt and the first observation, as the model first saw them."""
    turns: tuple[Turn, ...]
    stop_reason: StopReason

    @property
    def reward(self) -> float:
        return sum(turn.reward for turn in self.turns)

    @property
    def rule(self) -> TrainingRule:
        return TRAINING_RULE[self.stop_reason]

    @property
    def response_token_ids(self) -> tuple[int, ...]:
        """Everything after the prompt: each turn's action, then its observation."""
        return tuple(t for turn in self.turns for t in turn.action_token_ids + turn.observation_token_ids)

    @property
    def response_mask(self) -> tuple[bool, ...]:
        """True on the model's tokens, False on the environment's: what the loss, KL and entropy read."""
        return tuple(m for turn in self.turns for m in (True,) * len(turn.action_token_ids)
                     + (False,) * len(turn.observation_token_ids))

    @property
    def rollout_logprobs(self) -> tuple[float, ...]:
        """The behaviour log-prob of each model token; 0.0 (never read: masked) at observation tokens."""
        return tuple(x for turn in self.turns for x in turn.action_logprobs
                     + (0.0,) * len(turn.observation_token_ids))

    @property
    def model_token_count(self) -> int:
        return sum(len(turn.action_token_ids) for turn in self.turns)


class LastTurn(str, Enum):
    """Where an aborted trajectory's last turn stood: what continuing it (`ResponsePrefix.outcome`) does first."""

    ANSWERED = "answered"
    """Its environment reply was applied (or there is no turn yet): the model starts the next turn."""
    AWAITING_ENV = "awaiting_env"
    """It ended; the environment had not answered it: the environment answers it first."""
    SAMPLING = "sampling"
    """The model was sampling it: the model continues it from its tokens."""


@dataclass(frozen=True)
class TrajectoryOutcome:
    """What a finished trajectory's `Completion` carries beside its tokens: how it ended and what the environment
    paid, turn by turn (the reward, the trace and the metrics read it; the trainer reads the tokens and the mask)."""

    stop_reason: StopReason
    turn_rewards: tuple[float, ...] = ()
    env_step_s: tuple[float, ...] = ()
    """Seconds of each environment step (the reset's first)."""
    action_lengths: tuple[int, ...] = ()
    """The model's tokens in each turn: with the response mask, how the tokens split into turns (an observation
    may be empty, so the mask alone cannot tell two turns apart)."""
    last_turn: LastTurn = LastTurn.ANSWERED
    """ABORT only: where the last turn stood when the trajectory was stopped."""

    @property
    def reward(self) -> float:
        return sum(self.turn_rewards)

    @property
    def num_turns(self) -> int:
        return len(self.turn_rewards)

    @property
    def rule(self) -> TrainingRule:
        return TRAINING_RULE[self.stop_reason]
