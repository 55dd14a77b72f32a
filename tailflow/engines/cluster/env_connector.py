"""A rollout worker's line to the environment workers: `TrajectoryEngine`'s `EnvConnector` over Ray.

The rollout group gives each rollout worker one of these (it pickles as the environment workers' actor handles),
so a rollout actor calls the environment actors directly: a reset or step is issued as an actor call and answered
when `wait` collects it, while the engine decodes the other trajectories. Placement is the connector's own: a new
trajectory goes to the environment worker holding the fewest of this connector's live trajectories (lowest index
on ties) and stays there for its life (the worker's process holds its environment). Failures come back as plain
records (`EnvFailure`): an environment that raised, hung or died costs its trajectory, never the round.
"""
from __future__ import annotations

from typing import Collection, Sequence

import ray

from tailflow.engines.env.worker import EnvResetOutcome, EnvStepOutcome
from tailflow.engines.rollout.trajectory_engine import EnvReply


class RemoteEnvironments:
    def __init__(self, workers: Sequence, wait_on_close: bool = True) -> None:
        """`workers`: the environment workers' actor handles (`EnvGroup.workers`). `wait_on_close`: see
        `close`."""
        if not workers:
            raise ValueError("RemoteEnvironments needs at least one environment worker")
        self.workers = list(workers)
        self.wait_on_close = wait_on_close
        self.placement: dict[str, int] = {}
        self.pending: dict[str, ray.ObjectRef] = {}

    def __reduce__(self):
        return RemoteEnvironments, (self.workers, self.wait_on_close)

    def reset(self, key: str, seed: int) -> None:
        load = [0] * len(self.workers)
        for index in self.placement.values():
            load[index] += 1
        index = min(range(len(self.workers)), key=lambda i: (load[i], i))
        self.placement[key] = index
        self.pending[key] = self.workers[index].reset.remote(key, seed)

    def step(self, key: str, action: str) -> None:
        self.pending[key] = self.workers[self.placement[key]].step.remote(key, action)

    def wait(self, keys: Collection[str]) -> list[EnvReply]:
        keys = list(keys)
        outcomes = ray.get([self.pending.pop(key) for key in keys])
        return [reply_of(outcome) for outcome in outcomes]

    def ready(self, keys: Collection[str], wait_for_one: bool) -> list[EnvReply]:
        by_ref = {self.pending[key]: key for key in keys}
        refs = list(by_ref)
        if wait_for_one:
            ray.wait(refs, num_returns=1)
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return [reply_of(outcome) for outcome in ray.get([self.pending.pop(by_ref[ref]) for ref in done])]

    def close(self, key: str) -> None:
        """End `key`'s environment. With `wait_on_close` (the lockstep and turn-synchronous schedules) a call
        still running is waited for first (at most its timeout): closing under it would kill it mid-step, and
        whether the step had finished, and so what the worker counted, would depend on timing, which a resumed
        run would not repeat. Without (the async schedule, itself timing-dependent) the environment is closed at
        once, a running call killed and its reply never read: an aborted trajectory (redundant rollout stops
        the slow ones) must not hold its caller for a slow environment's step."""
        pending = self.pending.pop(key, None)
        if pending is not None and self.wait_on_close:
            ray.wait([pending])
        index = self.placement.pop(key, None)
        if index is not None:
            self.workers[index].close.remote(key)  # unknown (already ended there) ids are ignored by the worker


def reply_of(outcome: EnvResetOutcome | EnvStepOutcome) -> EnvReply:
    failure = outcome.failure.reason if outcome.failure is not None else None
    if isinstance(outcome, EnvResetOutcome):
        return EnvReply(outcome.trajectory_id, outcome.observation, failure=failure, seconds=outcome.seconds)
    return EnvReply(outcome.trajectory_id, outcome.observation, outcome.reward, outcome.done, failure,
                    outcome.invalid_action, outcome.seconds)
