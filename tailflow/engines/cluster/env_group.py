"""The environment workers of a run: `env.num_workers` Ray actors, each trajectory on one of them for its life.

A new trajectory goes to the worker hosting the fewest live trajectories (lowest index on ties), so long
episodes do not pile up on one worker; every later call of that trajectory goes to the same worker, the one
whose process holds its environment (sticky placement). A trajectory leaves its worker when it is done, fails
or is closed. Calls come in batches (`reset_many`, `step_many`): the batch's calls run at once across the
workers (each worker caps its own at env.max_concurrent_steps) and the group hands back plain records.

The actors ask Ray for no CPU: they mostly wait on their environment processes, which Ray does not see anyway, and
a worker holding a logical CPU could keep a rollout or trainer actor from being placed on a small machine.
"""
from __future__ import annotations

from typing import Sequence

import ray

from tailflow.config import EnvConfig
from tailflow.engines.env.worker import EnvCounters, EnvironmentWorker, EnvResetOutcome, EnvStepOutcome
from tailflow.engines.track.env_metrics import counters_delta

EXTRA_ACTOR_THREADS = 4
"""Actor threads beyond the step slots, so `counters` and `close` are answered while steps wait for a slot."""


class EnvGroup:
    def __init__(self, config: EnvConfig) -> None:
        actor_class = ray.remote(num_cpus=0, max_restarts=0,
                                 max_concurrency=config.max_concurrent_steps + EXTRA_ACTOR_THREADS)(EnvironmentWorker)
        self.workers = [actor_class.remote(config) for _ in range(config.num_workers)]
        self.placement: dict[str, int] = {}
        """Trajectory id -> index of the worker holding its environment."""
        self.last_read = EnvCounters()
        """The counters as `counters_since_last_read` last saw them."""
        ray.get([worker.ping.remote() for worker in self.workers])

    def worker_of(self, trajectory_id: str) -> int:
        return self.placement[trajectory_id]

    def live_trajectories(self) -> list[int]:
        """Per worker, how many of its trajectories are alive."""
        load = [0] * len(self.workers)
        for index in self.placement.values():
            load[index] += 1
        return load

    def reset_many(self, seeds: Sequence[tuple[str, int]]) -> list[EnvResetOutcome]:
        """Start each (trajectory id, seed): placed one by one, each on the least-loaded worker."""
        refs = []
        for trajectory_id, seed in seeds:
            if trajectory_id in self.placement:
                raise ValueError(f"trajectory {trajectory_id!r} already has an environment")
            load = self.live_trajectories()
            index = min(range(len(self.workers)), key=lambda i: (load[i], i))
            self.placement[trajectory_id] = index
            refs.append(self.workers[index].reset.remote(trajectory_id, seed))
        outcomes = ray.get(refs)
        for outcome in outcomes:
            if outcome.failure is not None:
                del self.placement[outcome.trajectory_id]
        return outcomes

    def step_many(self, actions: Sequence[tuple[str, str]]) -> list[EnvStepOutcome]:
        """Each (trajectory id, action) to its own worker; a trajectory that ended leaves its worker."""
        refs = [self.workers[self.placement[tid]].step.remote(tid, action) for tid, action in actions]
        outcomes = ray.get(refs)
        for outcome in outcomes:
            if outcome.done or outcome.failure is not None:
                self.placement.pop(outcome.trajectory_id, None)
        return outcomes

    def close(self, trajectory_ids: Sequence[str]) -> None:
        """End these trajectories' environments (an abort, a token limit): their workers close them."""
        refs = [self.workers[self.placement.pop(tid)].close.remote(tid) for tid in trajectory_ids
                if tid in self.placement]
        ray.get(refs)

    def close_all(self) -> int:
        """Close every environment on every worker; how many there were."""
        self.placement.clear()
        return sum(ray.get([worker.close_all.remote() for worker in self.workers]))

    def counters(self) -> EnvCounters:
        total = EnvCounters()
        for counters in ray.get([worker.counters.remote() for worker in self.workers]):
            total = total.plus(counters)
        return total

    def counters_since_last_read(self) -> EnvCounters:
        """What the workers counted since the previous call (since they started, the first time): an
        iteration's `env/failures`, `env/invalid_actions` and `env/cut_observations`."""
        now = self.counters()
        delta, self.last_read = counters_delta(now, self.last_read), now
        return delta

    def worker_counters(self) -> list[EnvCounters]:
        return ray.get([worker.counters.remote() for worker in self.workers])

    def shutdown(self) -> None:
        """Close every environment, then stop the actors (their environment processes go with them anyway)."""
        try:
            self.close_all()
        finally:
            for worker in self.workers:
                ray.kill(worker)
            self.workers = []
