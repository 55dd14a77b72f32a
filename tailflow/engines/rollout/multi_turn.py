"""Multi-turn trajectories on ONE engine, in process: `run_trajectories` for tests and benches, with each
trajectory's environment an in-process object (`LocalEnvironments`).

It is `TrajectoryEngine` (the one implementation of the turn rules, `trajectory_engine.py`) driven to the end: the
same code a rollout worker runs with its environments on environment workers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Collection, Protocol, Sequence

from tailflow.engines.env.environment import EnvStep, InvalidAction
from tailflow.engines.env.trajectory import StopReason, Trajectory
from tailflow.engines.rollout.protocol import Request, SamplingParams
from tailflow.engines.rollout.trajectory_engine import (EnvReply, TrajectoryEngine, TurnCodec, TurnLimits,
                                                        turn_seed)

__all__ = ["TurnEnvironment", "TrajectoryStart", "LocalEnvironments", "run_trajectories", "TurnLimits", "turn_seed"]


class TurnEnvironment(Protocol):
    """The environment calls made (an in-process `Environment` has them)."""

    def reset(self, seed: int) -> str: ...

    def step(self, action: str) -> EnvStep: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class TrajectoryStart:
    problem_id: str
    index: int
    """Its place in its group (the group shares `env_seed`)."""
    prompt_token_ids: tuple[int, ...]
    """The task's prompt; the environment's first observation follows it."""
    env_seed: int

    @property
    def request_id(self) -> str:
        return f"{self.problem_id}#{self.index}"


class LocalEnvironments:
    """Each trajectory's environment in this process, called when the call is issued (an exception other than
    `InvalidAction` is the environment's failure: ENV_ERROR; no timeout can be enforced in process: the
    environment host's processes do that)."""

    def __init__(self, open_environment: Callable[[str], TurnEnvironment]) -> None:
        self.open_environment = open_environment
        self.open: dict[str, TurnEnvironment] = {}
        self.replies: dict[str, EnvReply] = {}

    def reset(self, key: str, seed: int) -> None:
        environment = self.open[key] = self.open_environment(key)
        self._call(key, lambda: EnvReply(key, environment.reset(seed)))

    def step(self, key: str, action: str) -> None:
        environment = self.open[key]

        def answer() -> EnvReply:
            try:
                result = environment.step(action)
            except InvalidAction as refusal:
                return EnvReply(key, str(refusal), invalid=True)
            return EnvReply(key, result.observation, result.reward, result.done)
        self._call(key, answer)

    def _call(self, key: str, call: Callable[[], EnvReply]) -> None:
        began = time.perf_counter()
        try:
            reply = call()
        except Exception:  # noqa: BLE001 - an environment's failure fails its trajectory only
            reply = EnvReply(key, failure=StopReason.ENV_ERROR)
        self.replies[key] = EnvReply(reply.key, reply.observation, reply.reward, reply.done, reply.failure,
                                     reply.invalid, time.perf_counter() - began)

    def wait(self, keys: Collection[str]) -> list[EnvReply]:
        return [self.replies.pop(key) for key in keys]

    def ready(self, keys: Collection[str], wait_for_one: bool) -> list[EnvReply]:
        """Every call here was answered when it was issued."""
        return self.wait(keys)

    def close(self, key: str) -> None:
        self.replies.pop(key, None)
        environment = self.open.pop(key, None)
        if environment is not None:
            environment.close()


def run_trajectories(engine, starts: Sequence[TrajectoryStart],
                     open_environment: Callable[[TrajectoryStart], TurnEnvironment], codec: TurnCodec,
                     limits: TurnLimits, params: SamplingParams) -> list[Trajectory]:
    """Run every trajectory to its stop, interleaved on `engine`; the trajectories in the order of `starts`.

    `params` is every turn's sampling (its max_new_tokens is replaced by what the limits leave, its seed by
    `turn_seed`)."""
    by_id = {start.request_id: start for start in starts}
    environments = LocalEnvironments(lambda key: open_environment(by_id[key]))
    trajectories = TrajectoryEngine(engine, environments, codec, limits,
                                    env_seed_of=lambda request: by_id[request.request_id].env_seed,
                                    keep_trajectories=True)
    trajectories.submit([Request(start.request_id, start.prompt_token_ids, params, problem_id=start.problem_id,
                                 index=start.index) for start in starts])
    while trajectories.has_unfinished():
        trajectories.step()
    return trajectories.take_trajectories([start.request_id for start in starts])
