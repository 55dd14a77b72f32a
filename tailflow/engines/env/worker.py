"""An environment worker: many environments, each in its own process, by trajectory id; for `ray.remote`.

Like the reward worker, nothing here imports Ray, so tests drive it in-process with the same class. A
trajectory's environment lives here from its reset to its end (done, failure or `close`): the group sends every
call of one trajectory to the same worker. At most `max_concurrent_steps` resets and steps run at once (the
actor runs calls on threads; the rest wait at a semaphore), because environment processes share the worker's
CPUs. The worker applies the config's per-turn rules, so every caller gets them alike: the invalid-action
penalty and text, the observation cut, the reset retries; and it counts what happened.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace

from tailflow.config import EnvConfig, EnvFaults
from tailflow.engines.env.environment import EnvStep
from tailflow.engines.env.faults import FaultPlan
from tailflow.engines.env.host import EnvFailure, EnvHost, EnvLauncher, StepResult, start_and_reset
from tailflow.engines.env.trajectory import StopReason


@dataclass(frozen=True)
class EnvResetOutcome:
    trajectory_id: str
    observation: str
    """The first observation, whole (it is part of the prompt: the context check bounds it, not the cut)."""
    seconds: float
    failure: EnvFailure | None = None
    attempts: int = 1
    env_pid: int = 0
    """The environment process (its last attempt's)."""
    worker_pid: int = 0


@dataclass(frozen=True)
class EnvStepOutcome:
    trajectory_id: str
    observation: str
    """What follows the model's turn: the environment's (cut) answer, or the invalid-action text."""
    reward: float
    done: bool
    """The environment said the task is over (never set with a failure: that ends the trajectory by itself)."""
    seconds: float
    invalid_action: bool = False
    """The environment rejected the action: `reward` is env.invalid_action_reward, the trajectory goes on."""
    observation_cut: bool = False
    """The observation was longer than env.observation_max_tokens bytes and was cut."""
    failure: EnvFailure | None = None
    """Set: the trajectory ends with failure.reason (dropped) and its environment is gone."""
    info: dict[str, float | int | str] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvCounters:
    """What a worker (or, summed, a group) has done since it started."""

    resets: int = 0
    reset_retries: int = 0
    steps: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    """By stop reason (`timeout`, `env_error`), resets and steps together."""
    invalid_actions: int = 0
    cut_observations: int = 0
    step_seconds: float = 0.0
    """Wall seconds of every step, summed."""
    peak_concurrent_calls: int = 0
    """The most resets and steps that ran at once (a group: the largest of its workers')."""
    active_environments: int = 0

    def plus(self, other: "EnvCounters") -> "EnvCounters":
        failures = dict(self.failures)
        for reason, count in other.failures.items():
            failures[reason] = failures.get(reason, 0) + count
        return EnvCounters(self.resets + other.resets, self.reset_retries + other.reset_retries,
                           self.steps + other.steps, failures, self.invalid_actions + other.invalid_actions,
                           self.cut_observations + other.cut_observations, self.step_seconds + other.step_seconds,
                           max(self.peak_concurrent_calls, other.peak_concurrent_calls),
                           self.active_environments + other.active_environments)


def cut_to_bytes(text: str, max_bytes: int) -> tuple[str, bool]:
    """`text` cut to at most `max_bytes` UTF-8 bytes at a character boundary, and whether it was cut."""
    encoded = text.encode()
    if len(encoded) <= max_bytes:
        return text, False
    return encoded[:max_bytes].decode(errors="ignore"), True


class EnvironmentWorker:
    def __init__(self, config: EnvConfig) -> None:
        self.config = config
        self.injects_faults = config.faults != EnvFaults()
        """`env.faults` set (benches, tests): steps go through `faulty_step`'s fault plan."""
        self.launcher = EnvLauncher()
        """Forks this worker's environment processes; they all end when this process does."""
        self.hosts: dict[str, EnvHost] = {}
        self.call_slots = threading.BoundedSemaphore(config.max_concurrent_steps)
        self.lock = threading.Lock()
        """Guards `hosts` and the counters (calls run on several threads)."""
        self.running_calls = 0
        self.counters_so_far = EnvCounters()
        self.steps_taken: dict[str, int] = {}
        """Steps each live trajectory's environment has taken (the injected faults are drawn per step)."""
        self.resetting: set[str] = set()
        """Trajectories whose reset is running."""
        self.closed_while_resetting: set[str] = set()
        """Of those, the ones closed meanwhile: their environment is closed as soon as its reset returns."""

    # ---- calls ---------------------------------------------------------------------------------

    def reset(self, trajectory_id: str, seed: int) -> EnvResetOutcome:
        """Start the trajectory's environment (retried in fresh processes, see env.reset_retries)."""
        config = self.config
        with self.lock:
            if trajectory_id in self.hosts:
                raise ValueError(f"trajectory {trajectory_id!r} already has an environment on this worker")
            if not self.launcher.is_alive:  # killed from outside (the OOM killer): its environments went with it
                self.launcher = EnvLauncher()
            launcher = self.launcher
            self.resetting.add(trajectory_id)
        with self.call_slot():
            host, result = start_and_reset(launcher, config.class_path, dict(config.settings), seed, config.reset_timeout_s,
                                           config.reset_retries, config.reset_backoff_s)
        with self.lock:
            self.resetting.discard(trajectory_id)
            closed = trajectory_id in self.closed_while_resetting
            self.closed_while_resetting.discard(trajectory_id)
            if host is not None and not closed:
                self.hosts[trajectory_id] = host
            self.count(resets=1, reset_retries=result.attempts - 1)
            if result.failure is not None:
                self.count_failure(result.failure)
        if host is not None and closed:
            host.close()
        return EnvResetOutcome(trajectory_id, result.observation, result.seconds, result.failure, result.attempts,
                               result.pid, os.getpid())

    def step(self, trajectory_id: str, action: str) -> EnvStepOutcome:
        """The model's turn to the trajectory's environment; a failure or `done` ends (closes) the environment.

        A trajectory closed before or while its step runs (aborted: its caller does not wait for the step) gets
        an `env_error` outcome that is not counted: the environment did not fail, its trajectory was stopped, and
        whether the close came before, during or after the step is timing, which the counters must not show."""
        with self.lock:
            host = self.hosts.get(trajectory_id)
            step_number = self.steps_taken.get(trajectory_id, 0)
            self.steps_taken[trajectory_id] = step_number + 1
        if host is None:
            return EnvStepOutcome(trajectory_id, "", 0.0, False, 0.0, failure=EnvFailure(
                StopReason.ENV_ERROR, f"no environment for trajectory {trajectory_id!r} here (closed, or never reset)"))
        with self.call_slot():
            result = self.faulty_step(host, trajectory_id, step_number, action)
        with self.lock:
            closed_under_it = self.hosts.get(trajectory_id) is not host
        if closed_under_it:
            return EnvStepOutcome(trajectory_id, "", 0.0, False, result.seconds,
                                  failure=result.failure or EnvFailure(StopReason.ENV_ERROR, "closed during the step"))
        outcome = self.step_outcome(trajectory_id, result.step, result.invalid_action, result.failure,
                                    result.seconds)
        if outcome.done or outcome.failure is not None:
            self.close(trajectory_id)
        return outcome

    def faulty_step(self, host: EnvHost, trajectory_id: str, step_number: int, action: str) -> StepResult:
        """The step, with the faults `env.faults` injects (engines/env/faults.py): none by default."""
        timeout_s, faults = self.config.step_timeout_s, self.config.faults
        if not self.injects_faults:
            return host.step(action, timeout_s)
        plan = FaultPlan.of(trajectory_id, faults)
        if plan.stop_at_step == step_number:
            host.kill()  # fail-stop: the step finds its process dead
        started = time.monotonic()
        delay_s = plan.latency_s(step_number)
        if delay_s > 0:
            failure = host.stall(delay_s, timeout_s)
            if failure is not None:
                return StepResult(None, time.monotonic() - started, failure=failure)
        result = host.step(action, max(timeout_s - (time.monotonic() - started), 1e-3))
        return replace(result, seconds=time.monotonic() - started)

    def step_outcome(self, trajectory_id: str, step: EnvStep | None, invalid_action: str, failure: EnvFailure | None,
                     seconds: float) -> EnvStepOutcome:
        config = self.config
        if failure is not None:
            outcome = EnvStepOutcome(trajectory_id, "", 0.0, False, seconds, failure=failure)
        elif invalid_action:
            outcome = EnvStepOutcome(trajectory_id, config.invalid_action_observation, config.invalid_action_reward,
                                     False, seconds, invalid_action=True, info={"invalid_action": invalid_action})
        else:
            assert step is not None  # the host gives a step whenever there is neither failure nor invalid action
            observation, is_cut = cut_to_bytes(step.observation, config.observation_max_tokens)
            outcome = EnvStepOutcome(trajectory_id, observation, step.reward, step.done, seconds,
                                     observation_cut=is_cut, info=dict(step.info))
        with self.lock:
            self.count(steps=1, step_seconds=seconds, invalid_actions=int(outcome.invalid_action),
                       cut_observations=int(outcome.observation_cut))
            if failure is not None:
                self.count_failure(failure)
        return outcome

    def close(self, trajectory_id: str) -> None:
        """End the trajectory's environment (its own close, then the process is gone); unknown ids are ignored."""
        with self.lock:
            host = self.hosts.pop(trajectory_id, None)
            self.steps_taken.pop(trajectory_id, None)
            if trajectory_id in self.resetting:
                self.closed_while_resetting.add(trajectory_id)
        if host is not None:
            host.close()

    def close_all(self) -> int:
        """Close every environment (end of a round, an abort, shutdown); how many there were."""
        with self.lock:
            hosts, self.hosts = list(self.hosts.values()), {}
            self.steps_taken.clear()
        for host in hosts:
            host.close()
        return len(hosts)

    # ---- bookkeeping ---------------------------------------------------------------------------

    def call_slot(self) -> "CallSlot":
        return CallSlot(self)

    def count(self, **increments: float) -> None:
        """Add to the counters (the caller holds `lock`)."""
        so_far = self.counters_so_far
        self.counters_so_far = replace(so_far, **{name: getattr(so_far, name) + by for name, by in increments.items()})

    def count_failure(self, failure: EnvFailure) -> None:
        failures = dict(self.counters_so_far.failures)
        failures[failure.reason.value] = failures.get(failure.reason.value, 0) + 1
        self.counters_so_far = replace(self.counters_so_far, failures=failures)

    def counters(self) -> EnvCounters:
        with self.lock:
            return replace(self.counters_so_far, active_environments=len(self.hosts))

    def ping(self) -> bool:
        return True

    def pid(self) -> int:
        return os.getpid()


class CallSlot:
    """One of the worker's max_concurrent_steps slots, held for one reset or step; tracks the peak in use."""

    def __init__(self, worker: EnvironmentWorker) -> None:
        self.worker = worker

    def __enter__(self) -> None:
        worker = self.worker
        worker.call_slots.acquire()
        with worker.lock:
            worker.running_calls += 1
            peak = max(worker.counters_so_far.peak_concurrent_calls, worker.running_calls)
            worker.counters_so_far = replace(worker.counters_so_far, peak_concurrent_calls=peak)

    def __exit__(self, *exc: object) -> None:
        with self.worker.lock:
            self.worker.running_calls -= 1
        self.worker.call_slots.release()
