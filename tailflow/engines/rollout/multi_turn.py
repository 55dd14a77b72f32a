"""The turn loop of multi-turn rollouts on ONE engine, in process: model turn, environment step, next turn.

Every trajectory is a chain of requests, one per model turn, each continuing the previous one (`Request.continues`)
with the environment's observation appended, so the native engine prefills only the observation (vLLM's prefix
cache finds the rest). All trajectories share the engine's continuous batch and nothing waits for a round: when a
turn finishes, its environment steps and the next turn is submitted in the same engine step.

Tokens in, tokens out: the model's turn is decoded once, for the environment to read; the observation is encoded
once (`TurnCodec`); the tokens recorded and trained are the ones the engine sampled, never re-encoded.

Stop rules (`trajectory.StopReason`), checked in this order:
- a model turn cut by its length: TURN_TOKEN_LIMIT when it reached `turn_max_tokens` (kept, never shown to the
  environment), else TRAJECTORY_TOKEN_LIMIT when the trajectory's tokens reached `trajectory_max_tokens`, else
  CONTEXT_OVERFLOW (it filled the context);
- after the environment's step: DONE; MAX_TURNS after `max_turns` turns; then, for the next observation,
  TRAJECTORY_TOKEN_LIMIT when it and one more model token would exceed `trajectory_max_tokens`, CONTEXT_OVERFLOW
  when they would not fit `context_length`; the observation is then not appended.
- the environment raising (not `InvalidAction`) ends it as ENV_ERROR; `InvalidAction` is answered with its
  message as the observation and `invalid_action_reward`, and the trajectory goes on.
Timeouts and outside aborts belong to the environment host and the round driver, not to this loop.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence

from tailflow.engines.env.environment import EnvStep, InvalidAction
from tailflow.engines.env.trajectory import StopReason, Trajectory, Turn
from tailflow.engines.rollout.protocol import Completion, FinishReason, Request, SamplingParams


class TurnEnvironment(Protocol):
    """The environment calls the loop makes (an in-process `Environment` has them; so can a remote proxy)."""

    def reset(self, seed: int) -> str: ...

    def step(self, action: str) -> EnvStep: ...

    def close(self) -> None: ...


class TurnCodec(Protocol):
    """Text <-> tokens at the turn boundaries (`tailflow/engines/data/chat_turns.py`: plain text, chat templates)."""

    def first_observation_tokens(self, text: str) -> list[int]:
        """What follows the task's prompt for the environment's first observation."""

    def observation_tokens(self, action_token_ids: Sequence[int], text: str) -> list[int]:
        """What follows a model turn for the observation `text` (a chat template's boundary tokens included)."""

    def action_text(self, action_token_ids: Sequence[int]) -> str:
        """The model's turn as the environment reads it."""


class TurnEngine(Protocol):
    """The part of a `RolloutEngine` the loop uses."""

    def submit(self, requests: Sequence[Request]) -> None: ...

    def step(self) -> list[Completion]: ...

    def has_unfinished(self) -> bool: ...

    def release_kept(self, request_ids: Sequence[str]) -> None: ...


@dataclass(frozen=True)
class TurnLimits:
    max_turns: int
    """Model turns a trajectory may take."""
    turn_max_tokens: int
    """Tokens one model turn may take (its request's max_new_tokens, or less near the other limits)."""
    trajectory_max_tokens: int
    """The model's and the environment's tokens after the prompt, together."""
    context_length: int
    """Tokens the model sees at most (prompt included); at most the engine's max_seq_len."""
    invalid_action_reward: float = 0.0
    """The reward of a turn the environment refused with `InvalidAction`."""

    def __post_init__(self) -> None:
        if min(self.max_turns, self.turn_max_tokens, self.trajectory_max_tokens, self.context_length) < 1:
            raise ValueError(f"every turn limit must be >= 1, got {self}")


@dataclass(frozen=True)
class TrajectoryStart:
    problem_id: str
    index: int
    """Its place in its group (the group shares `env_seed`)."""
    prompt_token_ids: tuple[int, ...]
    """The task's prompt; the environment's first observation follows it."""
    env_seed: int


def turn_seed(base_seed: int | None, start: TrajectoryStart, turn: int) -> int | None:
    """Each turn's sampler seed, from the caller's seed and the turn's identity (no arrival order): a turn samples
    what a one-shot request over the same conversation with this seed samples. None leaves it to the engine."""
    if base_seed is None:
        return None
    return (base_seed * 1_000_003 + zlib.crc32(f"{start.problem_id}#{start.index}#{turn}".encode())) % (2**63 - 1)


class TrajectoryInFlight:
    """One trajectory between its turns: its environment, its conversation so far, its turns."""

    def __init__(self, start: TrajectoryStart, environment: TurnEnvironment, prompt: tuple[int, ...]) -> None:
        self.start = start
        self.environment = environment
        self.prompt_token_ids = prompt
        self.conversation: tuple[int, ...] = prompt
        self.turns: list[Turn] = []

    @property
    def num_response_tokens(self) -> int:
        return len(self.conversation) - len(self.prompt_token_ids)

    def request_id(self, turn: int) -> str:
        return f"{self.start.problem_id}#{self.start.index}/turn{turn}"

    def finish(self, reason: StopReason) -> Trajectory:
        self.environment.close()
        return Trajectory(self.start.problem_id, self.start.index, self.start.env_seed, self.prompt_token_ids,
                          tuple(self.turns), reason)


def run_trajectories(engine: TurnEngine, starts: Sequence[TrajectoryStart],
                     open_environment: Callable[[TrajectoryStart], TurnEnvironment], codec: TurnCodec,
                     limits: TurnLimits, params: SamplingParams) -> list[Trajectory]:
    """Run every trajectory to its stop, interleaved on `engine`; the trajectories in the order of `starts`.

    `params` is every turn's sampling (its max_new_tokens is replaced by what the limits leave, its seed by
    `turn_seed`)."""
    loop = TurnLoop(engine, codec, limits, params)
    for start in starts:
        loop.begin(start, open_environment(start))
    return loop.run_to_end([(s.problem_id, s.index) for s in starts])


class TurnLoop:
    """`run_trajectories`' state: the trajectories by the id of the request running their current turn."""

    def __init__(self, engine: TurnEngine, codec: TurnCodec, limits: TurnLimits, params: SamplingParams) -> None:
        self.engine, self.codec, self.limits, self.params = engine, codec, limits, params
        self.in_flight: dict[str, TrajectoryInFlight] = {}
        self.finished: dict[tuple[str, int], Trajectory] = {}

    def begin(self, start: TrajectoryStart, environment: TurnEnvironment) -> None:
        try:
            first = self.codec.first_observation_tokens(environment.reset(start.env_seed))
        except Exception:  # noqa: BLE001 - an environment's failure fails its trajectory only
            trajectory = TrajectoryInFlight(start, environment, start.prompt_token_ids)
            self._end(trajectory, StopReason.ENV_ERROR)
            return
        trajectory = TrajectoryInFlight(start, environment, (*start.prompt_token_ids, *first))
        if len(trajectory.conversation) + 1 > self.limits.context_length:
            self._end(trajectory, StopReason.CONTEXT_OVERFLOW)
            return
        self._submit_turn(trajectory)

    def run_to_end(self, order: list[tuple[str, int]]) -> list[Trajectory]:
        while self.engine.has_unfinished():
            for completion in self.engine.step():
                self._after_turn(self.in_flight.pop(completion.request_id), completion)
        return [self.finished[key] for key in order]

    def _submit_turn(self, trajectory: TrajectoryInFlight) -> None:
        turn = len(trajectory.turns)
        limits = self.limits
        max_new_tokens = min(limits.turn_max_tokens, limits.trajectory_max_tokens - trajectory.num_response_tokens,
                             limits.context_length - len(trajectory.conversation))
        params = replace(self.params, max_new_tokens=max_new_tokens,
                         seed=turn_seed(self.params.seed, trajectory.start, turn))
        request_id = trajectory.request_id(turn)
        self.in_flight[request_id] = trajectory
        self.engine.submit([Request(request_id, trajectory.conversation, params,
                                    problem_id=trajectory.start.problem_id, index=trajectory.start.index,
                                    keep_slot=turn + 1 < limits.max_turns,
                                    continues=trajectory.request_id(turn - 1) if turn else None)])

    def _after_turn(self, trajectory: TrajectoryInFlight, completion: Completion) -> None:
        action = completion.token_ids
        versions = completion.token_weight_versions or (completion.weight_version,) * len(action)
        trajectory.conversation += action
        if completion.finish_reason is FinishReason.ABORT:
            trajectory.turns.append(Turn(action, completion.logprobs, versions, ()))
            self._end(trajectory, StopReason.ABORT)
            return
        if completion.finish_reason is FinishReason.LENGTH:
            trajectory.turns.append(Turn(action, completion.logprobs, versions, ()))
            self._end(trajectory, self._cut_reason(trajectory, len(action)))
            return
        began = time.perf_counter()
        try:
            answer = trajectory.environment.step(self.codec.action_text(action))
        except InvalidAction as refusal:
            answer = EnvStep(str(refusal), reward=self.limits.invalid_action_reward)
        except Exception:  # noqa: BLE001 - an environment's failure fails its trajectory only
            trajectory.turns.append(Turn(action, completion.logprobs, versions, ()))
            self._end(trajectory, StopReason.ENV_ERROR)
            return
        step_s = time.perf_counter() - began
        reason, observation = self._next(trajectory, action, answer)
        trajectory.turns.append(Turn(action, completion.logprobs, versions, observation, answer.reward, step_s))
        trajectory.conversation += observation
        if reason is not None:
            self._end(trajectory, reason)
        else:
            self._submit_turn(trajectory)

    def _cut_reason(self, trajectory: TrajectoryInFlight, num_action_tokens: int) -> StopReason:
        if num_action_tokens >= self.limits.turn_max_tokens:
            return StopReason.TURN_TOKEN_LIMIT
        if trajectory.num_response_tokens >= self.limits.trajectory_max_tokens:
            return StopReason.TRAJECTORY_TOKEN_LIMIT
        return StopReason.CONTEXT_OVERFLOW

    def _next(self, trajectory: TrajectoryInFlight, action: tuple[int, ...],
              answer: EnvStep) -> tuple[StopReason | None, tuple[int, ...]]:
        """(why the trajectory stops here, or None; the observation tokens to append, () when it stops)."""
        if answer.done:
            return StopReason.DONE, ()
        if len(trajectory.turns) + 1 >= self.limits.max_turns:
            return StopReason.MAX_TURNS, ()
        observation = tuple(self.codec.observation_tokens(action, answer.observation))
        if trajectory.num_response_tokens + len(observation) + 1 > self.limits.trajectory_max_tokens:
            return StopReason.TRAJECTORY_TOKEN_LIMIT, ()
        if len(trajectory.conversation) + len(observation) + 1 > self.limits.context_length:
            return StopReason.CONTEXT_OVERFLOW, ()
        return None, observation

    def _end(self, trajectory: TrajectoryInFlight, reason: StopReason) -> None:
        if trajectory.turns:
            self.engine.release_kept([trajectory.request_id(len(trajectory.turns) - 1)])
        self.finished[(trajectory.start.problem_id, trajectory.start.index)] = trajectory.finish(reason)
