"""The reward workers of a run: a pool of Ray actors sized by the backlog.

Each scoring call carries one response, sent to the worker with the fewest
calls outstanding (lowest index on ties): a response whose program runs for
seconds then delays only its own worker. When the backlog (responses sent
but not scored) exceeds `backlog_per_worker` per worker, a worker is added,
up to `max_workers`; it gets work only once it has started (building a
reward function takes seconds: a response queued behind a starting worker
would wait for it). When a round has been scored, the pool gives back at
most one worker if that round's peak backlog needed fewer, never going
below `min_workers`: a round of slow code keeps its workers, a run of quick
rounds gives them back one by one without starting and stopping actors
every round.

Several scorers share the pool at once (an asynchronous run scores the round
being trained and the rounds running ahead; evaluation scores in between):
outcomes are kept by request id until the scorer that sent them asks
(`ready` / `wait_for` its own ids), so no scorer ever takes another's.
Why reward actors ask Ray for no CPU: docs/rewards.md, "Streamed scoring".
"""
from __future__ import annotations

import math
from typing import Collection, Sequence

import ray

from tailflow.engines.reward.spec import RewardSpec
from tailflow.engines.reward.worker import RewardWorker, ScoreItem, ScoreOutcome


class RewardPool:
    def __init__(self, spec: RewardSpec, min_workers: int = 1, max_workers: int = 4,
                 backlog_per_worker: int = 8) -> None:
        if not 1 <= min_workers <= max_workers:
            raise ValueError(f"need 1 <= min_workers ({min_workers}) <= max_workers ({max_workers})")
        if backlog_per_worker < 1:
            raise ValueError(f"backlog_per_worker must be >= 1, got {backlog_per_worker}")
        self.spec = spec
        self.min_workers, self.max_workers, self.backlog_per_worker = min_workers, max_workers, backlog_per_worker
        self._actor_class = ray.remote(num_cpus=0, max_restarts=0)(RewardWorker)
        self.workers: list = []
        self._outstanding: dict = {}
        """ObjectRef -> (index of the worker scoring it, the request id it scores)."""
        self._arrived: dict[str, ScoreOutcome] = {}
        """Outcomes back from the workers and not yet asked for, by request id."""
        self._starting: dict[int, object] = {}
        """Index -> its `ping` call, for workers that have not answered yet."""
        self.peak_workers = 0
        self.peak_backlog = 0
        for _ in range(min_workers):
            self._add_worker()  # starting meanwhile: the first submit waits for one, or check_started for all

    # ---- sizing ------------------------------------------------------------------------------

    def _add_worker(self) -> None:
        worker = self._actor_class.remote(self.spec)
        self._starting[len(self.workers)] = worker.ping.remote()
        self.workers.append(worker)
        self.peak_workers = max(self.peak_workers, len(self.workers))

    def check_started(self) -> None:
        """Wait until every worker has built its reward function (a bad judge path fails here, named)."""
        from tailflow.engines.cluster.calls import get_all

        get_all(list(self._starting.values()))
        self._starting.clear()

    def _ready_indices(self) -> list[int]:
        """Workers that have started; waits for the first one if none has."""
        if self._starting:
            refs = list(self._starting.values())
            if len(self._starting) == len(self.workers):
                ray.wait(refs, num_returns=1)
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for index in [i for i, ref in self._starting.items() if ref in done]:
                ray.get(self._starting.pop(index))  # a worker that failed to start raises here, named
        return [i for i in range(len(self.workers)) if i not in self._starting]

    def workers_wanted(self, backlog: int) -> int:
        return min(self.max_workers, max(self.min_workers, math.ceil(backlog / self.backlog_per_worker)))

    def shrink_to_recent_need(self) -> None:
        """After a round: keep what its peak backlog needed; idle workers beyond that are stopped."""
        wanted = self.workers_wanted(self.peak_backlog)
        last = len(self.workers) - 1
        if len(self.workers) > wanted and last not in {index for index, _ in self._outstanding.values()}:
            self._starting.pop(last, None)
            ray.kill(self.workers.pop())
        self.peak_backlog = 0
        self.peak_workers = len(self.workers)

    # ---- scoring -----------------------------------------------------------------------------

    @property
    def backlog(self) -> int:
        return len(self._outstanding)

    def submit(self, items: Sequence[ScoreItem]) -> None:
        for item in items:
            while len(self.workers) < self.workers_wanted(self.backlog + 1):
                self._add_worker()
            load = [0] * len(self.workers)
            for index, _ in self._outstanding.values():
                load[index] += 1
            index = min(self._ready_indices(), key=lambda i: (load[i], i))
            self._outstanding[self.workers[index].score.remote([item])] = (index, item.request_id)
            self.peak_backlog = max(self.peak_backlog, self.backlog)

    def ready(self, request_ids: Collection[str]) -> list[ScoreOutcome]:
        """The outcomes of `request_ids` finished by now (never waiting); a failed call raises."""
        if self._outstanding:
            done, _ = ray.wait(list(self._outstanding), num_returns=len(self._outstanding), timeout=0)
            self._take_in(done)
        return [self._arrived.pop(rid) for rid in request_ids if rid in self._arrived]

    def wait_for(self, request_ids: Collection[str]) -> list[ScoreOutcome]:
        """The outcomes of `request_ids` (each sent by `submit` and not yet returned), waiting for all of them."""
        wanted = set(request_ids)
        pending = {ref for ref, (_, rid) in self._outstanding.items() if rid in wanted}
        unknown = wanted - {self._outstanding[ref][1] for ref in pending} - set(self._arrived)
        if unknown:
            raise KeyError(f"requests {sorted(unknown)[:5]} were never sent to the reward pool (or taken already)")
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            pending -= set(done)
            self._take_in(done)  # a dead worker raises RayActorError: the iteration retries
        return [self._arrived.pop(rid) for rid in request_ids]

    def _take_in(self, refs) -> None:
        for ref in refs:
            del self._outstanding[ref]
            self._arrived.update((outcome.request_id, outcome) for outcome in ray.get(ref))

    def score_all(self, items: Sequence[ScoreItem]) -> list[ScoreOutcome]:
        """Score a batch and wait for it (evaluation, batch-after-rollout); outcomes in `items` order."""
        self.submit(items)
        return self.wait_for([item.request_id for item in items])

    def worker_pid(self, index: int = 0) -> int:
        return ray.get(self.workers[index].pid.remote())

    def shutdown(self) -> None:
        for worker in self.workers:
            try:
                ray.get(worker.close.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - a dead or stuck worker is killed below anyway
                pass
            ray.kill(worker)
        self.workers = []
        self._outstanding.clear()
        self._arrived.clear()
        self._starting.clear()
