"""Agentic rollouts on a virtual clock: how long N multi-turn trajectories take under each `env.schedule`.

A trajectory is its prompt, its environment's reset time and its turns; a turn is the model's tokens, then the
environment's step (`env_s` of wall time, in the environment's own process: it never uses the engine), then the
observation's tokens, prefilled before the next turn (not after the last one: the trajectory ends when its last
environment step has answered). An engine decodes one token a step for each of at most `num_slots` rows, a row
being one trajectory's running turn; a step's price is the cost model's `decode_s` for its rows and their
contexts, a batch of next turns entering free rows pays `prefill_s` for what they append (the prompt, or the
observation: the conversation's keys and values are assumed kept between turns). Next turns wait for a free row
in arrival order.

What a trajectory waits for between its turns is the schedule's, as `TrajectoryEngine.step` does it
(engines/rollout/trajectory_engine.py):
- `lockstep`: before each engine step, every environment call in flight is answered (the calls issued during the
  step before): the engine idles for the longest of them.
- `turn_sync`: the same wait, and a barrier: the next turns are held until no environment call is in flight and
  no turn is running or queued, then all start.
- `async`: each step takes the answers that have arrived by then; the engine waits only when it has nothing to
  decode (until the first answer).

Deterministic: no randomness inside (trajectories are drawn outside: engines/sim/trace.py). Not modelled:
environments queueing for CPUs (every step runs at once, however many), reward and training, preemption or
eviction of kept keys and values, replica stragglers. `tailflow plan --env-trace` prints the three side by side.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import mean, median
from typing import Sequence

from tailflow.engines.sim.costs import CostModel, Infeasible

SCHEDULES = ("lockstep", "turn_sync", "async")
"""`env.schedule`'s values (`EnvSchedule`), in the order the table prints them."""


@dataclass(frozen=True)
class SimTurn:
    model_tokens: int
    observation_tokens: int
    """Appended after the environment's answer, prefilled before the next turn (unused after the last turn)."""
    env_s: float
    """Seconds of the environment's step after this turn."""


@dataclass(frozen=True)
class SimTrajectory:
    turns: tuple[SimTurn, ...]
    prompt_tokens: int = 0
    reset_s: float = 0.0
    """Seconds of the environment's reset, before the first turn."""

    def __post_init__(self) -> None:
        if not self.turns or min(turn.model_tokens for turn in self.turns) < 1:
            raise ValueError(f"a simulated trajectory needs turns of at least one model token each, got {self.turns}")

    @property
    def context_tokens(self) -> int:
        """Its prompt and every turn's tokens: the most keys and values its row holds."""
        return self.prompt_tokens + sum(turn.model_tokens + turn.observation_tokens for turn in self.turns)


@dataclass(frozen=True)
class AgenticRollout:
    """One simulated rollout of `num_trajectories` trajectories under `schedule`."""

    schedule: str
    num_trajectories: int
    wall_s: float
    """From the resets to the last trajectory's end, on the slowest engine."""
    trajectories_per_s: float
    engine_busy_share: float
    """Engine-seconds prefilling or decoding / (engines x wall_s)."""
    mean_env_wait_s: float
    """Per environment call (resets included): from its issue until its trajectory's next turn is queued for a row
    (or the trajectory ends): its own environment's time plus what the schedule holds it for."""
    max_env_wait_s: float


class _Row:
    """One trajectory on an engine: how far it got and its environment call in flight."""

    def __init__(self, trajectory: SimTrajectory, order: int) -> None:
        self.trajectory, self.order = trajectory, order
        self.done_turns = 0
        self.remaining = 0
        """Model tokens left in the running turn."""
        self.context = 0
        self.issued_at, self.ready_at = 0.0, trajectory.reset_s  # the reset is the first call

    def appended(self) -> int:
        """What its next turn prefills: the prompt, or the last turn's observation."""
        turns = self.trajectory.turns
        return turns[self.done_turns - 1].observation_tokens if self.done_turns else self.trajectory.prompt_tokens


class EngineClock:
    """One engine and its trajectories' environments on a virtual clock (module docstring)."""

    def __init__(self, trajectories: Sequence[SimTrajectory], schedule: str, cost: CostModel, num_slots: int) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.schedule, self.cost, self.num_slots = schedule, cost, num_slots
        self.clock_s = self.busy_s = 0.0
        self.awaiting = [_Row(t, i) for i, t in enumerate(trajectories)]
        """Environment calls in flight (at first every trajectory's reset)."""
        self.held: list[_Row] = []
        """turn_sync: next turns at the barrier."""
        self.queue: deque[_Row] = deque()
        """Next turns waiting for a free row."""
        self.running: list[_Row] = []
        self.waits: list[float] = []

    def run(self) -> "EngineClock":
        """Until every trajectory has ended: each pass is one `TrajectoryEngine.step` (a span of steps where
        nothing happens between them)."""
        while self.awaiting or self.held or self.queue or self.running:
            self._take_answers()
            if self.held and not (self.awaiting or self.queue or self.running):
                self._queue(self.held)
                self.held = []
            if self.queue or self.running:
                self._step()
        return self

    def _take_answers(self) -> None:
        if not self.awaiting:
            return
        if self.schedule != "async":  # lockstep, turn_sync: every call in flight is answered first
            self.clock_s = max(self.clock_s, max(row.ready_at for row in self.awaiting))
        elif not (self.queue or self.running):  # async with nothing to decode: until the first answer
            self.clock_s = max(self.clock_s, min(row.ready_at for row in self.awaiting))
        answered = sorted((r for r in self.awaiting if r.ready_at <= self.clock_s), key=lambda r: r.order)
        self.awaiting = [row for row in self.awaiting if row.ready_at > self.clock_s]
        for row in answered:
            if row.done_turns == len(row.trajectory.turns):  # its last turn's answer: it ends
                self.waits.append(self.clock_s - row.issued_at)
            elif self.schedule == "turn_sync":
                self.held.append(row)
            else:
                self._queue([row])

    def _queue(self, rows: list[_Row]) -> None:
        for row in rows:
            self.waits.append(self.clock_s - row.issued_at)
            self.queue.append(row)

    def _step(self) -> None:
        """Next turns enter free rows (one prefill), then the rows decode until a turn ends (async: or until an
        environment may have answered); the turns that ended call their environments."""
        admitted = [self.queue.popleft() for _ in range(min(len(self.queue), self.num_slots - len(self.running)))]
        if admitted:
            self._charge(self.cost.prefill_s(sum(row.appended() for row in admitted), len(admitted)))
            for row in admitted:
                row.context += row.appended()
                row.remaining = row.trajectory.turns[row.done_turns].model_tokens
            self.running += admitted
        steps = self._decode(min(row.remaining for row in self.running))
        for row in self.running:
            row.context += steps
            row.remaining -= steps
            if not row.remaining:
                row.done_turns += 1
                row.issued_at = self.clock_s
                row.ready_at = self.clock_s + row.trajectory.turns[row.done_turns - 1].env_s
                self.awaiting.append(row)
        self.running = [row for row in self.running if row.remaining]

    def _decode(self, max_steps: int) -> int:
        """Up to `max_steps` steps of the running rows: in one cost-model call, or (async, an environment call in
        flight) one step at a time until its answer is due, to be taken at the next step. Steps run."""
        rows = len(self.running)
        context = sum(row.context for row in self.running)
        longest = max(row.context for row in self.running)
        if self.schedule != "async" or not self.awaiting:
            self._charge(self.cost.decode_span_s(rows, context, longest, max_steps))
            return max_steps
        first_answer = min(row.ready_at for row in self.awaiting)
        steps = 0
        while steps == 0 or (steps < max_steps and self.clock_s < first_answer):
            self._charge(self.cost.decode_s(rows, context + rows * steps, longest + steps))
            steps += 1
        return steps

    def _charge(self, seconds: float) -> None:
        self.clock_s += seconds
        self.busy_s += seconds


def simulate_rollout(trajectories: Sequence[SimTrajectory], schedule: str, cost: CostModel, num_slots: int,
                     num_replicas: int = 1) -> AgenticRollout:
    """The trajectories dealt round-robin to `num_replicas` engines of `num_slots` rows each, every engine on its
    own clock with its own environments; the rollout ends when the last engine's trajectories have."""
    if not trajectories or num_replicas < 1:
        raise ValueError(f"need trajectories and >= 1 replica, got {len(trajectories)} and {num_replicas}")
    engines = [EngineClock(trajectories[i::num_replicas], schedule, cost, num_slots).run()
               for i in range(min(num_replicas, len(trajectories)))]
    wall = max(engine.clock_s for engine in engines)
    waits = [wait for engine in engines for wait in engine.waits]
    busy = sum(engine.busy_s for engine in engines)
    return AgenticRollout(schedule, len(trajectories), wall, len(trajectories) / wall if wall else math.inf,
                          busy / (num_replicas * wall) if wall else 0.0, mean(waits), max(waits))


def rows_per_replica(trajectories: Sequence[SimTrajectory], kv_budget_tokens: int, max_rows: int) -> int:
    """Rows an engine runs at once: `max_rows`, or fewer where the KV budget holds fewer of the longest
    trajectory's whole conversation."""
    longest = max(t.context_tokens for t in trajectories)
    if longest > kv_budget_tokens:
        raise Infeasible(f"a trajectory of {longest:,} tokens can never fit the KV budget of {kv_budget_tokens:,} "
                         "tokens (raise TP)")
    return min(max_rows, kv_budget_tokens // longest)


def compare_schedules(trajectories: Sequence[SimTrajectory], cost: CostModel, num_slots: int,
                      num_replicas: int = 1) -> list[AgenticRollout]:
    """The same trajectories under each schedule, in `SCHEDULES` order."""
    return [simulate_rollout(trajectories, schedule, cost, num_slots, num_replicas) for schedule in SCHEDULES]


def describe_trajectories(trajectories: Sequence[SimTrajectory]) -> str:
    """Turns and environment step times of a set of trajectories, in one line."""
    steps = sorted(turn.env_s for t in trajectories for turn in t.turns)
    p99 = steps[min(len(steps) - 1, math.ceil(0.99 * len(steps)) - 1)]
    return (f"{mean(len(t.turns) for t in trajectories):.1f} turns a trajectory (max "
            f"{max(len(t.turns) for t in trajectories)}), environment step median {median(steps):.3f} s, "
            f"p99 {p99:.3f} s, max {steps[-1]:.3f} s")


def schedule_table(results: Sequence[AgenticRollout], header: Sequence[str] = ()) -> str:
    """The rollouts side by side, labelled SIMULATED, with async's speedups over the others."""
    by = {r.schedule: r for r in results}
    lines = [f"SIMULATED agentic rollout: {results[0].num_trajectories} trajectories", *header,
             f"{'schedule':10} {'rollout s':>10} {'traj/s':>9} {'engine busy':>12} {'env wait mean / max s':>22}"]
    for r in results:
        lines.append(f"{r.schedule:10} {r.wall_s:10.2f} {r.trajectories_per_s:9.2f} {r.engine_busy_share:12.0%} "
                     f"{r.mean_env_wait_s:11.3f} / {r.max_env_wait_s:.3f}")
    if {"async", "lockstep", "turn_sync"} <= by.keys():
        lines.append(f"async / lockstep: {by['lockstep'].wall_s / by['async'].wall_s:.2f}x the trajectories per "
                     f"second; async / turn_sync: {by['turn_sync'].wall_s / by['async'].wall_s:.2f}x (SIMULATED)")
    return "\n".join(lines)
