"""What a simulated step costs: the one small interface every cost model implements.

The simulated engine asks only two questions per engine step (how long does
prefilling these tokens take, how long does one decode step of these rows
take); the round simulator asks a `NonRolloutCost` three more per training step
(train, reward, weight sync). A decode step is described by its number of active rows, the sum of their
context lengths and the longest one: the GPU roofline reads weights + every
cached key (the sum), the native CPU engine pads attention to the longest row
(rows x the longest). The engine keeps these as running totals, so a step
stays O(1).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol


class CostModelError(ValueError):
    """A cost model that cannot be built: unknown preset, bad calibration file (named in the message)."""


class Infeasible(CostModelError):
    """A setting that cannot run: the weights do not fit a replica, or a request can never fit its KV budget."""


class NonRolloutCost(Protocol):
    """What a training step costs besides rollout: scoring, training, the weight sync (`trainer_cost.py`'s
    `TrainerCost`, a `RooflineCost`'s own, or the linear prices of `step_time.py`)."""

    def train_s(self, num_tokens: int) -> float:
        """One optimizer step (forward, backward, update) over `num_tokens` trained tokens (prompt + response)."""

    def reward_s(self, num_responses: int, num_tokens: int) -> float:
        """Scoring a round's `num_responses` kept responses of `num_tokens` tokens, after rollout (not overlapped)."""

    def weight_sync_s(self) -> float:
        """Sending the new weights from the trainer to every rollout replica."""


class CostModel(ABC):
    @abstractmethod
    def decode_s(self, num_rows: int, context_tokens: int, max_context: int) -> float:
        """One decode step of `num_rows` rows whose contexts (prompt + generated so far) sum to `context_tokens`,
        the longest being `max_context` (engines that pad attention to the longest row pay for rows x that)."""

    @abstractmethod
    def prefill_s(self, num_tokens: int, num_seqs: int) -> float:
        """Prefilling `num_seqs` admitted sequences holding `num_tokens` tokens in all (0 tokens: free)."""

    def decode_span_s(self, num_rows: int, context_tokens: int, max_context: int, num_steps: int) -> float:
        """`num_steps` decode steps with the same rows, each step adding `num_rows` tokens of context (and one to
        the longest).

        The engine jumps over steps in which nothing finishes, is admitted or preempted; models with a
        closed form override this (the roofline does), the rest sum step by step.
        """
        return sum(self.decode_s(num_rows, context_tokens + num_rows * j, max_context + j) for j in range(num_steps))

    def replica_slowdowns(self, num_replicas: int, seed: int = 0) -> list[float]:
        """Each replica's time multiplier (stragglers); 1 where the model was measured on the device itself."""
        return [1.0] * num_replicas
