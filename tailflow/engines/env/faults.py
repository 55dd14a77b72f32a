"""Faults injected into environments, for benches and tests of what slow and dying environments cost (issue 41).

Real environments have heavy-tailed step times, some become very slow (fail-slow), some die (fail-stop). With
`env.faults` set, the environment worker makes its environments do so for real: before a step it has the
environment's process sleep for the step's drawn latency (a sleep past `env.step_timeout_s` is that step's
timeout: the process is killed), and at a fail-stop environment's drawn step it SIGKILLs the process, so the
step finds it dead (`env_error`). Every draw is a function of the trajectory id and the step number, so the
same run meets the same faults.
"""
from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass

from tailflow.config import EnvFaults


@dataclass(frozen=True)
class FaultPlan:
    """One environment's faults (a trajectory's), drawn from its trajectory id."""

    trajectory_id: str
    faults: EnvFaults
    slow_factor: float
    """`fail_slow_factor` for a fail-slow environment, else 1."""
    stop_at_step: int | None
    """The step (0: the first) before which its process is SIGKILLed; None: it never dies."""

    @classmethod
    def of(cls, trajectory_id: str, faults: EnvFaults) -> "FaultPlan":
        draw = random.Random(zlib.crc32(f"faults/{trajectory_id}".encode()))
        is_slow, is_stopped = draw.random() < faults.fail_slow_fraction, draw.random() < faults.fail_stop_fraction
        stop_at = draw.randrange(faults.fail_stop_within_steps)
        return cls(trajectory_id, faults, faults.fail_slow_factor if is_slow else 1.0,
                   stop_at if is_stopped else None)

    def latency_s(self, step: int) -> float:
        """The delay before step `step`: LogNormal with the configured median and sigma, times `slow_factor`."""
        faults = self.faults
        if faults.step_latency_median_s == 0:
            return 0.0
        draw = random.Random(zlib.crc32(f"latency/{self.trajectory_id}/{step}".encode()))
        return faults.step_latency_median_s * math.exp(faults.step_latency_sigma * draw.gauss(0.0, 1.0)) \
            * self.slow_factor
