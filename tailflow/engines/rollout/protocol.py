"""What crosses the rollout boundary: requests in, completions out.

Every rollout engine speaks this protocol (the native torch engine, on CPU
or CUDA, and the vLLM engine: run on vLLM's CPU build, on GPUs written, not run: docs/gpu.md), so
the tail-batching policy and the flows never depend on which engine runs
underneath.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping, Protocol, Sequence

import torch

from tailflow.engines.env.trajectory import StopReason, TrajectoryOutcome


class FinishReason(str, Enum):
    EOS = "eos"          # the model emitted its end-of-sequence token (kept in token_ids)
    STOP = "stop"        # a stop token or stop sequence was produced (kept in token_ids)
    LENGTH = "length"    # max_new_tokens reached
    ABORT = "abort"      # aborted by the caller; the partial response is discarded by policy


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 means no top-k filtering."""
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    seed: int | None = None
    """Seeds this request's own sampler; None derives one from the engine seed
    and the request's arrival index, so a seeded engine is still reproducible."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class ResponsePrefix:
    """Response tokens a request already has, sampled earlier (by this engine before a weight update, or by
    another engine that left): the engine prefills them after the prompt and samples on from there.

    The request's own sampler is advanced past them (one draw per token, as if it had sampled them), so a
    request continued from its prefix draws exactly what it would have drawn uninterrupted; only the keys and
    values of the prefix are recomputed, with the engine's current weights.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """The behaviour log-probs recorded when each token was sampled (kept, never recomputed)."""
    weight_versions: tuple[int, ...]
    """The weight version that sampled each token."""
    response_mask: tuple[bool, ...] = ()
    """A multi-turn trajectory's (`Completion.response_mask`); empty: a single-turn response."""
    outcome: TrajectoryOutcome | None = None
    """A multi-turn trajectory's, as it was stopped (ABORT): its turns' lengths and where the last one stood. Only
    a `TrajectoryEngine` continues it: it replays the turns into a fresh environment from the trajectory's seed
    (`trajectory_engine.py`); None: a single-turn response, which any engine continues."""

    def __post_init__(self) -> None:
        if not len(self.token_ids) == len(self.logprobs) == len(self.weight_versions):
            raise ValueError(f"a response prefix needs one log-prob and one weight version per token, got "
                             f"{len(self.token_ids)} tokens, {len(self.logprobs)} log-probs and "
                             f"{len(self.weight_versions)} versions")
        if (self.outcome is None) != (not self.response_mask) and self.token_ids:
            raise ValueError("a multi-turn trajectory's prefix needs both its response mask and its outcome")
        if self.response_mask and len(self.response_mask) != len(self.token_ids):
            raise ValueError(f"a response prefix of {len(self.token_ids)} tokens has {len(self.response_mask)} mask "
                             "flags")


@dataclass(frozen=True)
class Request:
    request_id: str
    """Unique within a round (the engines' key)."""
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    prefix: ResponsePrefix | None = None
    """Continue a response sampled so far (partial rollout across a weight update, migration); None: start."""
    problem_id: str = ""
    """The prompt this response answers: its group (GRPO normalises within it) and the completion rule's unit.
    Empty: the request is a group of its own (its id is used)."""
    index: int = 0
    """Which of its prompt's responses this is (0, 1, ...): the group's order."""
    keep_slot: bool = False
    """Multi-turn: once finished (not aborted), the engine keeps this request's keys and values so that a request
    that `continues` it computes only what it appends. A kept slot is occupied until continued or released
    (`release_kept`); an engine keeps a bounded number and gives the oldest back first when it needs the room."""
    continues: str | None = None
    """Multi-turn: the id of a finished `keep_slot` request this one continues. The prompt is the whole
    conversation (that request's prompt and response, then the appended tokens), so an engine that ignores the
    hint (vLLM, whose prefix cache finds the shared prefix itself) or lost the kept slot (released, given back,
    stale weights) gives the same result by prefilling it all. It is a hint, never a change of meaning."""

    def __post_init__(self) -> None:
        if not self.problem_id:
            object.__setattr__(self, "problem_id", self.request_id)

    @classmethod
    def for_problem(cls, problem_id: str, index: int, prompt_token_ids: tuple[int, ...],
                    params: SamplingParams | None = None) -> "Request":
        """Response `index` of `problem_id`; its id `<problem_id>#<index>` is only a key, never parsed."""
        return cls(f"{problem_id}#{index}", prompt_token_ids, params or SamplingParams(), problem_id=problem_id,
                   index=index)

    def completion(self, token_ids: tuple[int, ...], logprobs: tuple[float, ...], finish_reason: FinishReason,
                   weight_version: int, token_weight_versions: tuple[int, ...] = ()) -> "Completion":
        """What this request came back as: engines build every `Completion` here, so identity travels along."""
        return Completion(self.request_id, self.prompt_token_ids, tuple(token_ids), tuple(logprobs), finish_reason,
                          weight_version, tuple(token_weight_versions), self.problem_id, self.index)


@dataclass(frozen=True)
class Completion:
    """A finished (or aborted) request.

    `logprobs[i]` is the log-probability of `token_ids[i]` under the
    distribution the engine drew it from (the behaviour policy mu): the model's
    logits divided by the request's temperature, top-k then top-p applied, and
    renormalised over the tokens they kept (`sampler.py`). Every engine must
    report exactly this: the off-policy losses weight by pi / mu, pi being the
    trainer's softmax(logits / T), unfiltered. Greedy requests (temperature 0)
    report the model's log-prob at temperature 1, unfiltered. `weight_version` is the engine's weight
    version when the request finished; `token_weight_versions` is empty when that
    version produced every token, else it names the version of each token (a
    partial rollout continued across weight updates).
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: int
    token_weight_versions: tuple[int, ...] = ()
    problem_id: str = ""
    """The request's `problem_id` (empty: the request id)."""
    index: int = 0
    """The request's `index` within its prompt's group."""
    response_mask: tuple[bool, ...] = ()
    """A multi-turn trajectory's: True on the tokens the model sampled, False on the environment's observations
    (whose `logprobs` slots hold 0.0, never read). Empty: every token is the model's (single-turn)."""
    outcome: TrajectoryOutcome | None = None
    """A multi-turn trajectory's stop reason and turn rewards (`rollout/trajectory_engine.py`); None: single-turn."""

    def __post_init__(self) -> None:
        if not self.problem_id:
            object.__setattr__(self, "problem_id", self.request_id)
        if self.response_mask and len(self.response_mask) != len(self.token_ids):
            raise ValueError(f"completion {self.request_id!r}: response_mask has {len(self.response_mask)} flags "
                             f"for {len(self.token_ids)} tokens")

    @property
    def oldest_weight_version(self) -> int:
        """The oldest weights that sampled a token of this response: its staleness is measured from here."""
        return min(self.token_weight_versions, default=self.weight_version)

    def as_prefix(self) -> ResponsePrefix:
        """This (partial) response as a prefix to continue from. An aborted multi-turn trajectory's carries its
        mask and outcome: its environment's state is not in its tokens, so the `TrajectoryEngine` continuing it
        replays its turns into a fresh environment first; an ended trajectory is not continued."""
        if self.outcome is not None and self.outcome.stop_reason is not StopReason.ABORT:
            raise ValueError(f"completion {self.request_id!r} is a trajectory that ended "
                             f"({self.outcome.stop_reason.value}): there is nothing to continue")
        versions = self.token_weight_versions or (self.weight_version,) * len(self.token_ids)
        return ResponsePrefix(self.token_ids, self.logprobs, versions, self.response_mask, self.outcome)


@dataclass(frozen=True)
class FinishedAt:
    """A completion with the engine step that finished it (workers return these to their group)."""

    completion: Completion
    step: int
    """Decode steps this engine has run in the current round, that one included (1 = the round's first)."""
    offset: int
    """1 for the first step of the call that returned it, 2 for the second...: a group merges workers'
    completions by it, so the ones finished in the same step of a poll come before later ones."""


@dataclass(frozen=True)
class EngineStats:
    num_slots: int
    num_running: int
    num_waiting: int
    weight_version: int
    steps: int
    """Decode steps run so far."""
    busy_slot_steps: int
    """Sum over steps of the rows that decoded: 1 - busy/(steps*num_slots) is the bubble ratio."""
    tokens_generated: int
    num_kept: int = 0
    """Finished requests' slots kept for a continuation (`Request.keep_slot`): occupied, not decoding."""
    prefill_tokens: int = 0
    """Tokens whose keys and values were computed by a prefill (a decode's own token is not counted)."""
    reused_prefix_tokens: int = 0
    """Tokens a continued request took from a kept slot instead of prefilling them again."""


class RolloutEngine(Protocol):
    def submit(self, requests: Sequence[Request]) -> None: ...

    def step(self) -> list[Completion]:
        """Run one scheduling step (admit, prefill, decode one token); return what finished."""

    def abort(self, request_ids: Sequence[str]) -> list[Completion]:
        """Stop these requests now, freeing their slots; return their partial completions."""

    def has_unfinished(self) -> bool: ...

    def release_kept(self, request_ids: Sequence[str]) -> None:
        """Give back the kept slots of these finished requests (`Request.keep_slot`); unknown ids ignored."""

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Replace the weights; refused while any request is in flight."""

    def stats(self) -> EngineStats: ...
