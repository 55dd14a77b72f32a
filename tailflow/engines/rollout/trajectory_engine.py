"""Multi-turn trajectories behind the rollout engine protocol: one request in, one trajectory's completion out.

`TrajectoryEngine` wraps an engine. A request submitted to it is a trajectory's start: its environment is reset,
the first observation follows the prompt, and each model turn is a request of the inner engine continuing the
previous one (`Request.continues`: the native engine prefills only the observation, vLLM's prefix cache finds the
rest), all trajectories sharing the inner engine's continuous batch. The wrapper's `step` returns a `Completion`
only when a trajectory ends: its tokens are every model turn and observation after the prompt, with
`response_mask` True on the model's tokens and `outcome` saying how it ended and what the environment paid. So
the rollout worker, its group, the tail-batching pipeline, the completion rule and the reward stream see requests
and completions as they do for single-turn answers, and a mode stays a parameter.

Tokens in, tokens out: the model's turn is decoded once, for the environment to read; the observation is encoded
once (`TurnCodec`); the tokens recorded and trained are the ones the inner engine sampled, never re-encoded.

Stop rules (`trajectory.StopReason`), checked in this order:
- a model turn cut by its length: TURN_TOKEN_LIMIT when it reached `turn_max_tokens` (kept, never shown to the
  environment), else TRAJECTORY_TOKEN_LIMIT when the trajectory's tokens reached `trajectory_max_tokens`, else
  CONTEXT_OVERFLOW (it filled the context);
- after the environment's reply: its failure (ENV_ERROR, TIMEOUT: the environment host's verdict); DONE;
  MAX_TURNS after `max_turns` turns; then, for the next observation, TRAJECTORY_TOKEN_LIMIT when it and one more
  model token would exceed `trajectory_max_tokens`, CONTEXT_OVERFLOW when they would not fit `context_length`; the
  observation is then not appended. An `InvalidAction` is answered with its message as the observation and
  `invalid_action_reward`, and the trajectory goes on;
- `abort` (tail batching's, a cancelled round, a weight sync): ABORT, with the turns so far.

Continuing an aborted trajectory (a partial rollout across a weight sync, a resumed run's requests in flight): its
completion's `as_prefix()` carries the tokens, the mask and the outcome (each turn's length, where the last one
stood). Its environment's state is not in its tokens, so the continuation resets a fresh environment from the
trajectory's seed and replays the recorded turns into it, checking that each observation, reward and `done`
equals the recorded one; then the model continues a turn cut while it was sampled (from its tokens, as a
single-turn partial response continues), the environment answers one it had not answered, or the model starts
the next. Environments must therefore be deterministic given their seed and actions (`Environment` says so);
one that answers a replayed turn differently ends the trajectory as ENV_ERROR (dropped, counted, logged). The
recorded tokens, log-probs and weight versions are kept, never resampled.

Three schedules (`EnvSchedule`, `env.schedule`), differing only in what a trajectory waits for:
- LOCKSTEP (the default): the environment calls issued while the inner engine ran step s are all answered
  before it runs step s + 1, and their answers are applied in the trajectories' arrival order. The inner
  engine's schedule is then a function of the seeds alone, not of how long environments take, so a seeded run
  repeats bit for bit and a resumed one ends where the uninterrupted one does. The price: a slow environment
  step holds every trajectory's next decode step for its duration (bounded by the host's step timeout).
- ASYNC (environment-level asynchrony, as in ROLL Flash): each step applies the answers that have arrived and
  decodes the rest; a trajectory waits for its own environment only. The engine waits for an environment only
  when it has nothing else to decode. Which answers are in by step s depends on how long environments took, so a
  run is not repeatable bit for bit (each turn's sampler is still seeded by the turn's identity, `turn_seed`).
- TURN_SYNC (for comparison): a barrier at every turn, the rollout loop of a batch agent: no trajectory starts its
  next turn before every trajectory in flight has finished its turn and been answered.
"""
from __future__ import annotations

import logging
import zlib
from collections import deque
from dataclasses import dataclass, replace
from enum import Enum
from typing import Collection, Protocol, Sequence

from tailflow.engines.env.trajectory import LastTurn, StopReason, Trajectory, TrajectoryOutcome, Turn
from tailflow.engines.rollout.protocol import Completion, EngineStats, FinishReason, Request, ResponsePrefix

log = logging.getLogger(__name__)


class EnvSchedule(str, Enum):
    """What a trajectory waits for between its turns (module docstring)."""

    LOCKSTEP = "lockstep"
    ASYNC = "async"
    TURN_SYNC = "turn_sync"


@dataclass(frozen=True)
class EnvReply:
    """An environment's answer to a reset or a step, as the wrapper applies it."""

    key: str
    """The trajectory (its first request's id)."""
    observation: str = ""
    reward: float = 0.0
    done: bool = False
    failure: StopReason | None = None
    """ENV_ERROR or TIMEOUT: the environment failed (raised, died, hung); the trajectory ends, dropped."""
    invalid: bool = False
    """The step raised `InvalidAction`: `observation` is its message; the turn is penalised and the trajectory
    goes on."""
    seconds: float = 0.0


class EnvConnector(Protocol):
    """Where a trajectory's environment lives: in this process (`LocalEnvironments`) or on an environment worker.
    Calls are issued, then answered by `wait`, so many environments work while the engine decodes."""

    def reset(self, key: str, seed: int) -> None:
        """Open `key`'s environment and reset it from `seed`."""

    def step(self, key: str, action: str) -> None:
        """Send `key`'s environment the model's turn."""

    def wait(self, keys: Collection[str]) -> list[EnvReply]:
        """Block until every one of `keys` has its pending call answered; their replies (any order)."""

    def ready(self, keys: Collection[str], wait_for_one: bool) -> list[EnvReply]:
        """The replies of those of `keys` answered by now (any order); with `wait_for_one`, block until there is
        at least one."""

    def close(self, key: str) -> None:
        """The trajectory is over: release its environment (a reply still pending is discarded)."""


class TurnCodec(Protocol):
    """Text <-> tokens at the turn boundaries (`tailflow/engines/data/chat_turns.py`: plain text, chat templates)."""

    def first_observation_tokens(self, text: str) -> list[int]:
        """What follows the task's prompt for the environment's first observation."""

    def observation_tokens(self, action_token_ids: Sequence[int], text: str) -> list[int]:
        """What follows a model turn for the observation `text` (a chat template's boundary tokens included)."""

    def action_text(self, action_token_ids: Sequence[int]) -> str:
        """The model's turn as the environment reads it."""


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


def turn_seed(base_seed: int | None, problem_id: str, index: int, turn: int) -> int | None:
    """Each turn's sampler seed, from the trajectory's request seed and the turn's identity (no arrival order): a
    turn samples what a one-shot request over the same conversation with this seed samples. None leaves it to the
    engine."""
    if base_seed is None:
        return None
    return (base_seed * 1_000_003 + zlib.crc32(f"{problem_id}#{index}#{turn}".encode())) % (2**63 - 1)


def group_env_seed(request: Request) -> int:
    """The environment seed of a request's trajectory: one per prompt (`problem_id`), so a GRPO group's
    trajectories all start from the same task."""
    return zlib.crc32(request.problem_id.encode())


FINISH_OF_STOP = {
    StopReason.DONE: FinishReason.STOP, StopReason.MAX_TURNS: FinishReason.STOP,
    StopReason.TURN_TOKEN_LIMIT: FinishReason.LENGTH, StopReason.TRAJECTORY_TOKEN_LIMIT: FinishReason.LENGTH,
    StopReason.CONTEXT_OVERFLOW: FinishReason.LENGTH, StopReason.ENV_ERROR: FinishReason.STOP,
    StopReason.TIMEOUT: FinishReason.STOP, StopReason.ABORT: FinishReason.ABORT,
}
"""A trajectory's stop as the round sees it: ended (counted finished, its `outcome` decides training) or aborted."""


@dataclass(frozen=True)
class InFlightTrajectory:
    """What `in_flight()` reports of a trajectory not yet ended (the worker's progress stream)."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]


class Episode:
    """One trajectory between its reset and its stop: its request, its conversation so far, its turns."""

    def __init__(self, request: Request, arrival: int, env_seed: int) -> None:
        self.request = request
        self.arrival = arrival
        self.env_seed = env_seed
        self.prompt_token_ids: tuple[int, ...] = request.prompt_token_ids
        self.conversation: tuple[int, ...] = request.prompt_token_ids
        self.turns: list[Turn] = []
        self.reset_s = 0.0
        self.pending_action: tuple[tuple[int, ...], tuple[float, ...], tuple[int, ...]] | None = None
        """The model turn the environment is answering (tokens, log-probs, versions)."""
        self.replay: deque[Turn] = deque(recorded_turns(request.prefix) if request.prefix else ())
        """A continued trajectory's recorded turns not yet replayed into its fresh environment."""
        self.replaying: Turn | None = None
        """The recorded turn the environment is answering again (its reply must equal the recording)."""
        self.last_turn = request.prefix.outcome.last_turn if request.prefix else LastTurn.ANSWERED

    @property
    def key(self) -> str:
        return self.request.request_id

    @property
    def num_response_tokens(self) -> int:
        return len(self.conversation) - len(self.prompt_token_ids)

    def turn_request_id(self, turn: int) -> str:
        return f"{self.key}/turn{turn}"

    def trajectory(self, reason: StopReason) -> Trajectory:
        return Trajectory(self.request.problem_id, self.request.index, self.env_seed, self.prompt_token_ids,
                          tuple(self.turns), reason)


class TrajectoryEngine:
    """A `RolloutEngine` whose requests are trajectories (module docstring). `env_seed_of` names each request's
    environment seed (default: one per prompt)."""

    def __init__(self, engine, environments: EnvConnector, codec: TurnCodec, limits: TurnLimits,
                 env_seed_of=group_env_seed, turn_stop_sequences: Sequence[tuple[int, ...]] = (),
                 keep_trajectories: bool = False, schedule: EnvSchedule = EnvSchedule.LOCKSTEP) -> None:
        """`turn_stop_sequences`: token sequences that end every model turn, beside the request's own stops.
        `keep_trajectories`: keep each ended trajectory whole for `take_trajectories` (in-process callers; a
        rollout worker reads completions only, and keeping them would grow without end)."""
        if limits.context_length > getattr(engine, "max_seq_len", limits.context_length):
            raise ValueError(f"the turn limits' context_length {limits.context_length} exceeds the engine's "
                             f"max_seq_len {engine.max_seq_len}")
        self.engine, self.environments, self.codec, self.limits = engine, environments, codec, limits
        self.env_seed_of = env_seed_of
        self.keep_trajectories = keep_trajectories
        self.turn_stop_sequences = tuple(tuple(stop) for stop in turn_stop_sequences)
        self.episodes: dict[str, Episode] = {}
        """Trajectories not yet ended, by key."""
        self.turn_of: dict[str, str] = {}
        """Inner request id -> the key of the trajectory whose turn it is."""
        self.awaiting: set[str] = set()
        """Keys whose environment call is unanswered."""
        self.ended: list[Completion] = []
        self.trajectories: dict[str, Trajectory] = {}
        """Ended trajectories, whole, by key, with `keep_trajectories` (`take_trajectories`)."""
        self.num_arrived = 0
        self.schedule = EnvSchedule(schedule)
        self.held: list[tuple[Episode, ResponsePrefix | None]] = []
        """TURN_SYNC: next turns waiting at the barrier, in the order they became ready."""

    # ---- the protocol ------------------------------------------------------------------------

    def submit(self, requests: Sequence[Request]) -> None:
        """Each request starts a trajectory, or continues an aborted one (its `prefix`: module docstring): its
        environment is reset (answered at the next `step`)."""
        episodes = []  # built (a continued one's recorded turns split and checked) before anything is queued
        for arrival, request in enumerate(requests, start=self.num_arrived):
            if request.prefix is not None and request.prefix.outcome is None:
                raise ValueError(f"request {request.request_id!r}: its prefix is a single-turn response's (no "
                                 "trajectory outcome): a trajectory continues only from an aborted trajectory")
            if request.request_id in self.episodes:
                raise ValueError(f"request {request.request_id!r} is already a trajectory in flight on this engine")
            episodes.append(Episode(request, arrival, self.env_seed_of(request)))
        for episode in episodes:
            self.num_arrived += 1
            self.episodes[episode.key] = episode
            self.environments.reset(episode.key, episode.env_seed)
            self.awaiting.add(episode.key)

    def step(self) -> list[Completion]:
        """Apply the environments' answers (as the schedule says), run one inner step, end what ended."""
        if self.awaiting:
            if self.schedule is EnvSchedule.ASYNC:
                answered = self.environments.ready(set(self.awaiting), wait_for_one=not self.engine.has_unfinished())
            else:
                answered = self.environments.wait(set(self.awaiting))
            for reply in sorted(answered, key=lambda reply: self.episodes[reply.key].arrival):
                self.awaiting.discard(reply.key)
                self._after_reply(self.episodes[reply.key], reply)
        if self.held and not self.awaiting and not self.engine.has_unfinished():  # TURN_SYNC: everyone is here
            held, self.held = self.held, []
            for episode, prefix in held:
                self._submit_turn_now(episode, prefix)
        if self.engine.has_unfinished():
            for completion in self.engine.step():
                self._after_turn(self.episodes[self.turn_of.pop(completion.request_id)], completion)
        ended, self.ended = self.ended, []
        return ended

    def has_unfinished(self) -> bool:
        return bool(self.awaiting) or bool(self.held) or self.engine.has_unfinished()

    def abort(self, request_ids: Sequence[str]) -> list[Completion]:
        """End these trajectories (unknown or ended ones ignored) with the turns they finished and the part of the
        running turn sampled so far."""
        keys = [key for key in dict.fromkeys(request_ids) if key in self.episodes]
        running = {inner: key for inner, key in self.turn_of.items() if key in keys}
        partial = {running[c.request_id]: c for c in self.engine.abort(list(running))}
        for inner in running:
            self.turn_of.pop(inner, None)
        self.held = [(episode, prefix) for episode, prefix in self.held if episode.key not in keys]
        for key in keys:
            episode = self.episodes[key]
            self.awaiting.discard(key)
            if episode.replaying is not None or episode.replay:  # stopped while replaying: the rest as recorded
                episode.turns += [turn for turn in (episode.replaying, *episode.replay) if turn is not None]
                episode.pending_action, episode.replaying, episode.replay = None, None, deque()
                episode.last_turn = episode.request.prefix.outcome.last_turn
            elif episode.pending_action is not None:
                episode.turns.append(Turn(*episode.pending_action, ()))
                episode.pending_action = None
                episode.last_turn = LastTurn.AWAITING_ENV
            elif key in partial and partial[key].token_ids:
                completion = partial[key]
                episode.turns.append(Turn(completion.token_ids, completion.logprobs, versions_of(completion), ()))
                episode.last_turn = LastTurn.SAMPLING
            else:
                episode.last_turn = LastTurn.ANSWERED
            self._end(episode, StopReason.ABORT)
        ended = [c for c in self.ended if c.request_id in keys]
        self.ended = [c for c in self.ended if c.request_id not in keys]
        return ended

    def in_flight(self) -> list[InFlightTrajectory]:
        """Each trajectory not yet ended, with its tokens after the prompt so far (the running turn's included)."""
        running = {seq.request_id: seq for seq in self.engine.in_flight()}
        reported = []
        for episode in self.episodes.values():
            tokens = list(episode.conversation[len(episode.prompt_token_ids):])
            logprobs = [x for turn in episode.turns for x in turn.action_logprobs + (0.0,) * len(turn.observation_token_ids)]
            versions = [v for turn in episode.turns for v in observation_versions(turn)]
            if episode.pending_action is not None:  # a turn the environment is answering: in the conversation
                _, action_logprobs, action_versions = episode.pending_action
                logprobs += action_logprobs
                versions += action_versions
            current = running.get(episode.turn_request_id(len(episode.turns)))
            if current is not None:
                tokens += list(current.token_ids)
                logprobs += list(current.logprobs)
                versions += list(current.weight_versions)
            reported.append(InFlightTrajectory(episode.key, tokens, logprobs, versions))
        return reported

    def load_weights(self, state_dict, version: int) -> None:
        """Refused while a trajectory is in flight, even between its turns (its next turn would be another
        policy's)."""
        if self.episodes:
            raise RuntimeError(f"load_weights(version={version}) refused: {len(self.episodes)} trajectories in "
                               "flight would mix weight versions")
        self.engine.load_weights(state_dict, version)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def release_kept(self, request_ids: Sequence[str]) -> None:
        self.engine.release_kept(request_ids)

    def take_trajectories(self, keys: Sequence[str]) -> list[Trajectory]:
        """The ended trajectories of `keys`, whole, in that order (forgotten here once taken)."""
        return [self.trajectories.pop(key) for key in keys]

    @property
    def num_steps(self) -> int:
        return self.engine.num_steps

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def __getattr__(self, name: str):
        """Everything else (sleep, wake_up, max_seq_len, ...) is the inner engine's."""
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)

    # ---- turns -----------------------------------------------------------------------------

    def _after_reply(self, episode: Episode, reply: EnvReply) -> None:
        if episode.pending_action is None:  # the reset's answer
            self._after_reset(episode, reply)
            return
        action, logprobs, versions = episode.pending_action
        episode.pending_action = None
        recorded, episode.replaying = episode.replaying, None
        if reply.failure is not None:
            episode.turns.append(Turn(action, logprobs, versions, (), 0.0, reply.seconds))
            self._end(episode, reply.failure)
            return
        reward = self.limits.invalid_action_reward if reply.invalid else reply.reward
        reason, observation = self._next(episode, action, reply)
        if recorded is not None and (observation, reason, reward) != (recorded.observation_token_ids, None,
                                                                       recorded.reward):
            log.warning("trajectory %r: its environment answered replayed turn %d differently than recorded (an "
                        "environment must be deterministic given its seed and actions): ended as env_error",
                        episode.key, len(episode.turns))
            episode.turns.append(Turn(action, logprobs, versions, (), 0.0, reply.seconds))
            self._end(episode, StopReason.ENV_ERROR)
            return
        seconds = recorded.env_step_s if recorded is not None else reply.seconds
        episode.turns.append(Turn(action, logprobs, versions, observation, reward, seconds))
        episode.conversation += observation
        if reason is not None:
            self._end(episode, reason)
        else:
            self._next_turn(episode)

    def _next_turn(self, episode: Episode) -> None:
        """The model's next turn, or (continuing a trajectory) the next recorded turn replayed."""
        if not episode.replay:
            self._submit_turn(episode)
            return
        turn = episode.replay.popleft()
        action = (turn.action_token_ids, turn.action_logprobs, turn.action_weight_versions)
        if not episode.replay and episode.last_turn is LastTurn.SAMPLING:  # cut while sampled: the model goes on
            self._submit_turn(episode, ResponsePrefix(*action))
            return
        episode.pending_action = action
        episode.conversation += turn.action_token_ids
        if not episode.replay and episode.last_turn is LastTurn.AWAITING_ENV:
            episode.replaying = None  # never answered: this reply is new, nothing to compare
        else:
            episode.replaying = turn
        self.environments.step(episode.key, self.codec.action_text(turn.action_token_ids))
        self.awaiting.add(episode.key)

    def _after_reset(self, episode: Episode, reply: EnvReply) -> None:
        episode.reset_s = reply.seconds
        if reply.failure is not None:
            self._end(episode, reply.failure)
            return
        first = tuple(self.codec.first_observation_tokens(reply.observation))
        episode.prompt_token_ids = episode.conversation = (*episode.request.prompt_token_ids, *first)
        if not episode.prompt_token_ids:
            raise ValueError(f"trajectory {episode.key!r}: an empty prompt and an empty first observation leave the "
                             "model nothing to continue")
        if len(episode.conversation) + 1 > self.limits.context_length:
            self._end(episode, StopReason.CONTEXT_OVERFLOW)
            return
        self._next_turn(episode)

    def _submit_turn(self, episode: Episode, prefix: ResponsePrefix | None = None) -> None:
        """The model's next turn (`prefix`: the part of it sampled before the trajectory was stopped); under
        TURN_SYNC, once every trajectory in flight is at the barrier."""
        if self.schedule is EnvSchedule.TURN_SYNC:
            self.held.append((episode, prefix))
        else:
            self._submit_turn_now(episode, prefix)

    def _submit_turn_now(self, episode: Episode, prefix: ResponsePrefix | None) -> None:
        turn = len(episode.turns)
        limits = self.limits
        max_new_tokens = min(limits.turn_max_tokens, limits.trajectory_max_tokens - episode.num_response_tokens,
                             limits.context_length - len(episode.conversation))
        request = episode.request
        params = replace(request.params, max_new_tokens=max_new_tokens,
                         seed=turn_seed(request.params.seed, request.problem_id, request.index, turn),
                         stop_sequences=request.params.stop_sequences + self.turn_stop_sequences)
        inner_id = episode.turn_request_id(turn)
        self.turn_of[inner_id] = episode.key
        self.engine.submit([Request(inner_id, episode.conversation, params, prefix, problem_id=request.problem_id,
                                    index=request.index, keep_slot=turn + 1 < limits.max_turns,
                                    continues=episode.turn_request_id(turn - 1) if turn else None)])

    def _after_turn(self, episode: Episode, completion: Completion) -> None:
        action, logprobs, versions = completion.token_ids, completion.logprobs, versions_of(completion)
        episode.conversation += action
        if completion.finish_reason is FinishReason.ABORT:  # aborted inside the inner engine (not by us)
            episode.turns.append(Turn(action, logprobs, versions, ()))
            self._end(episode, StopReason.ABORT)
            return
        if completion.finish_reason is FinishReason.LENGTH:
            episode.turns.append(Turn(action, logprobs, versions, ()))
            self._end(episode, self._cut_reason(episode, len(action)))
            return
        episode.pending_action = (action, logprobs, versions)
        self.environments.step(episode.key, self.codec.action_text(action))
        self.awaiting.add(episode.key)

    def _cut_reason(self, episode: Episode, num_action_tokens: int) -> StopReason:
        if num_action_tokens >= self.limits.turn_max_tokens:
            return StopReason.TURN_TOKEN_LIMIT
        if episode.num_response_tokens >= self.limits.trajectory_max_tokens:
            return StopReason.TRAJECTORY_TOKEN_LIMIT
        return StopReason.CONTEXT_OVERFLOW

    def _next(self, episode: Episode, action: tuple[int, ...],
              reply: EnvReply) -> tuple[StopReason | None, tuple[int, ...]]:
        """(why the trajectory stops here, or None; the observation tokens to append, () when it stops)."""
        if reply.done:
            return StopReason.DONE, ()
        if len(episode.turns) + 1 >= self.limits.max_turns:
            return StopReason.MAX_TURNS, ()
        observation = tuple(self.codec.observation_tokens(action, reply.observation))
        if episode.num_response_tokens + len(observation) + 1 > self.limits.trajectory_max_tokens:
            return StopReason.TRAJECTORY_TOKEN_LIMIT, ()
        if len(episode.conversation) + len(observation) + 1 > self.limits.context_length:
            return StopReason.CONTEXT_OVERFLOW, ()
        return None, observation

    def _end(self, episode: Episode, reason: StopReason) -> None:
        if episode.turns:
            self.engine.release_kept([episode.turn_request_id(len(episode.turns) - 1)])
        self.environments.close(episode.key)
        del self.episodes[episode.key]
        trajectory = episode.trajectory(reason)
        if self.keep_trajectories:
            self.trajectories[episode.key] = trajectory
        self.ended.append(trajectory_completion(episode.request, trajectory, episode.reset_s,
                                                self.engine.weight_version, episode.last_turn))


def versions_of(completion: Completion) -> tuple[int, ...]:
    return completion.token_weight_versions or (completion.weight_version,) * len(completion.token_ids)


def observation_versions(turn: Turn) -> tuple[int, ...]:
    """A turn's per-token weight versions with its observation's tokens given its action's last version (they
    were sampled by no policy; masked, never read; the staleness of a trajectory is its actions')."""
    last = turn.action_weight_versions[-1] if turn.action_weight_versions else 0
    return turn.action_weight_versions + (last,) * len(turn.observation_token_ids)


def trajectory_completion(request: Request, trajectory: Trajectory, reset_s: float, weight_version: int,
                          last_turn: LastTurn = LastTurn.ANSWERED) -> Completion:
    """An ended trajectory as its request's completion: the prompt it was sampled after (the task's and the first
    observation), every token after it, the mask, per-token versions, and the outcome."""
    versions = tuple(v for turn in trajectory.turns for v in observation_versions(turn))
    outcome = TrajectoryOutcome(trajectory.stop_reason, tuple(turn.reward for turn in trajectory.turns),
                                (reset_s, *(turn.env_step_s for turn in trajectory.turns)),
                                tuple(len(turn.action_token_ids) for turn in trajectory.turns), last_turn)
    return Completion(request.request_id, trajectory.prompt_token_ids, trajectory.response_token_ids,
                      trajectory.rollout_logprobs, FINISH_OF_STOP[trajectory.stop_reason],
                      weight_version, versions, request.problem_id, request.index,
                      response_mask=trajectory.response_mask, outcome=outcome)


def recorded_turns(prefix: ResponsePrefix) -> list[Turn]:
    """An aborted trajectory's turns from its prefix: each turn's action (its recorded length of model tokens)
    and the environment tokens after it, with the turn's recorded reward and step seconds."""
    outcome = prefix.outcome
    lengths, mask = outcome.action_lengths, prefix.response_mask
    if len(outcome.turn_rewards) != len(lengths) or len(outcome.env_step_s) != len(lengths) + 1:
        raise ValueError(f"a trajectory prefix of {len(lengths)} turns has {len(outcome.turn_rewards)} turn rewards "
                         f"and {len(outcome.env_step_s)} step times (the reset's first)")
    turns, at = [], 0
    for number, length in enumerate(lengths):
        action_end = at + length
        observation_end = action_end
        while observation_end < len(mask) and not mask[observation_end]:
            observation_end += 1
        if length < 1 or action_end > len(mask) or not all(mask[at:action_end]):
            raise ValueError(f"a trajectory prefix's turn {number} of {length} model tokens does not match its "
                             f"response mask at token {at}")
        turns.append(Turn(prefix.token_ids[at:action_end], prefix.logprobs[at:action_end],
                          prefix.weight_versions[at:action_end], prefix.token_ids[action_end:observation_end],
                          outcome.turn_rewards[number], outcome.env_step_s[number + 1]))
        at = observation_end
    if at != len(prefix.token_ids):
        raise ValueError(f"a trajectory prefix's {len(lengths)} turns cover {at} of its {len(prefix.token_ids)} "
                         "tokens")
    return turns
