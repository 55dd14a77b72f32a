"""The rollout workers of a run: Ray actors that each host one engine.

Requests are spread so every worker gets an equal share, in request order:
with one worker the engine sees exactly the submission order, which is what
makes a seeded run reproducible bit for bit.
"""
from __future__ import annotations

from typing import Sequence

from tailflow.engines.rollout.protocol import Completion, EngineStats, Request


class RolloutGroup:
    def __init__(self, model_path: str, num_workers: int, num_slots: int, max_seq_len: int, seed: int, num_threads: int):
        import ray

        from tailflow.engines.rollout.worker import RolloutWorker

        actor_class = ray.remote(num_cpus=1, max_restarts=0)(RolloutWorker)
        self.workers = [
            actor_class.remote(model_path, num_slots, max_seq_len, seed + rank * 1_000_003, num_threads)
            for rank in range(num_workers)
        ]

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """Run all requests to completion; completions come back in request order."""
        import ray

        shares = [list(requests[rank :: len(self.workers)]) for rank in range(len(self.workers))]
        results = ray.get([worker.generate.remote(share) for worker, share in zip(self.workers, shares) if share])
        by_id = {completion.request_id: completion for result in results for completion in result}
        return [by_id[request.request_id] for request in requests]

    def load_weights(self, state_dict_ref, version: int) -> None:
        """Every worker loads the same weights (one object-store copy) before any new request."""
        import ray

        ray.get([worker.load_weights.remote(state_dict_ref, version) for worker in self.workers])

    def stats(self) -> list[EngineStats]:
        import ray

        return ray.get([worker.stats.remote() for worker in self.workers])

    def shutdown(self) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker)
