"""What a user implements to train a model that acts: an environment, in text.

The model's turn reaches the environment as text (decoded once, for the environment to read); the environment's
observation comes back as text and is tokenized once, then appended. The tokens trained are always the tokens
the model sampled: nothing the model wrote is encoded again (tokenization is not a bijection).

    class Guess(Environment):
        def __init__(self, high: int = 99):
            self.high = high

        def reset(self, seed: int) -> str:
            self.secret = random.Random(seed).randint(0, self.high)
            return f"guess 0-{self.high}"

        def step(self, action: str) -> EnvStep:
            guess = int(action.strip())  # raising here is an invalid action (see Environment.step)
            if guess == self.secret:
                return EnvStep("=", reward=1.0, done=True)
            return EnvStep("+" if guess < self.secret else "-")
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EnvStep:
    """What one environment step gives back."""

    observation: str
    """Text appended after the model's turn (empty when `done`, usually)."""
    reward: float = 0.0
    """This turn's reward; a trajectory's reward is the sum over its turns."""
    done: bool = False
    """The task is over: no further model turn."""
    info: dict[str, float | int | str] = field(default_factory=dict)
    """Plain values for the record (the rollout trace); never read by training."""


class Environment(ABC):
    """One task instance, alive for one trajectory: `reset` once, `step` once per model turn, `close` at the end.

    A trajectory's environment lives in one process for the trajectory's life. An environment that raises, hangs
    past its step timeout or dies fails that trajectory only (counted, logged, not trained); `step` raising
    `InvalidAction` is the model's fault instead: the trajectory goes on with the penalty the config sets.

    Deterministic given its seed and the actions: the same `reset(seed)` and the same `step`s give the same
    observations, rewards and `done`. A trajectory stopped at a weight sync (partial async rollouts), deferred
    to a long round (tail.continue_deferred) or in flight at a crash is continued by replaying its turns into a
    fresh instance; one that answers a replayed turn differently ends that trajectory as `env_error`.
    """

    @abstractmethod
    def reset(self, seed: int) -> str:
        """Start the task from `seed` (a group's trajectories share it: one task per GRPO group); the first
        observation, which follows the prompt."""

    @abstractmethod
    def step(self, action: str) -> EnvStep:
        """The model's turn, decoded; what the environment answers."""

    def close(self) -> None:
        """Release what the environment holds (a subprocess, a sandbox). Called once, also after a failure."""


class InvalidAction(Exception):
    """Raised by `Environment.step` for an action it cannot parse: the model's fault, penalised, not an error."""


def environment_class(class_path: str) -> type[Environment]:
    """`package.module:Class` (or `package.module.Class`) to the class; a clear error naming `env.class_path`."""
    module_name, _, name = class_path.replace(":", ".").rpartition(".")
    if not module_name or not name:
        raise ValueError(f"env.class_path: {class_path!r} is not 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"env.class_path: cannot import {module_name!r} ({error})") from error
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"env.class_path: {class_path!r} is not a subclass of tailflow's Environment")
    return cls
