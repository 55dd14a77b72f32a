"""A rollout worker: one `NativeEngine` behind plain methods, for `ray.remote`.

The cluster layer wraps this class (`ray.remote(num_cpus=...)(RolloutWorker)`);
nothing here imports Ray, so the same class runs in-process in tests. Requests
and completions are frozen dataclasses, which Ray pickles as they are.
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence

import torch

from tailflow.engines.rollout.native import NativeEngine
from tailflow.engines.rollout.protocol import Completion, EngineStats, Request


class RolloutWorker:
    def __init__(self, model_path: str, num_slots: int, max_seq_len: int, seed: int = 0,
                 num_threads: int = 1) -> None:
        # An actor gets num_cpus cores; more torch threads than that only contend.
        torch.set_num_threads(num_threads)
        self.engine = NativeEngine.from_pretrained(model_path, num_slots, max_seq_len, seed)

    def submit(self, requests: Sequence[Request]) -> None:
        self.engine.submit(requests)

    def step_many(self, max_steps: int) -> list[Completion]:
        """Up to `max_steps` steps (fewer if the engine goes idle); finished completions in order.

        Batching steps per call keeps the actor round-trip off the per-token path.
        """
        completions = []
        for _ in range(max_steps):
            if not self.engine.has_unfinished():
                break
            completions.extend(self.engine.step())
        return completions

    poll = step_many
    """The name `tailflow.engines.tail.driver.StreamingRollout` uses: an in-process worker drives a round too."""

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        return self.engine.generate(requests)

    def abort(self, request_ids: Sequence[str]) -> list[Completion]:
        return self.engine.abort(request_ids)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self.engine.load_weights(state_dict, version)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def pid(self) -> int:
        return os.getpid()

    def weight_version(self) -> int:
        return self.engine.weight_version
