"""What the trainer trains on, and how a step's samples are cut up.

Two cuts, both deterministic: `shard_across_ranks` gives each data-parallel
rank a share balanced by tokens; `split_by_token_budget` cuts a rank's share
into micro-batches that fit in memory. `collate` makes the tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TrainSample:
    """One scored response: the prompt, the response and its advantage.

    `rollout_logprobs[i]` is the rollout engine's log-prob of
    `response_token_ids[i]` (the behaviour policy's): the off-policy losses
    correct with it, and every loss compares it with the trainer's own (a
    health metric).
    """

    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    advantage: float
    rollout_logprobs: tuple[float, ...] | None = None
    reward: float = 0.0
    """The response's reward (for the record: every loss reads the advantage, TOPR's positive set included)."""
    rollout_temperature: float | None = None
    """The temperature the response was sampled at: `rollout_logprobs` are log-probs of that tempered (and, with
    top-k / top-p, filtered and renormalised) distribution (`Completion.logprobs`). None: not known. An
    off-policy loss compares them with the trainer's log-probs at its own temperature, so `PolicyTrainer`
    refuses samples whose temperature is not its own."""
    response_mask: tuple[bool, ...] | None = None
    """One flag per response token: True where the model sampled it (trained), False where the environment wrote
    it (a multi-turn observation, `Trajectory.response_mask`). A False token stays in the input (the model reads
    it as context) but has no policy loss, KL or entropy and is not counted by any per-token divisor. None:
    every response token is the model's (single-turn), the same tensors bit for bit as an all-True mask."""
    token_advantages: tuple[float, ...] | None = None
    """One advantage per response token (train.advantage gae: `gae.py`; 0.0 on the environment's tokens), read
    instead of `advantage`. None: `advantage` for every token (the group-relative estimators)."""
    values: tuple[float, ...] | None = None
    """GAE: the critic's value of each response token's state, the one its advantage was computed from (0.0 on
    the environment's tokens); the value loss clips against it. None: no critic."""
    returns: tuple[float, ...] | None = None
    """GAE: each response token's lambda-return, the critic's regression target (0.0 on environment tokens)."""

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("a sample needs at least one prompt token (the first response token is predicted from it)")
        if self.rollout_logprobs is not None and len(self.rollout_logprobs) != len(self.response_token_ids):
            raise ValueError(
                f"rollout_logprobs has {len(self.rollout_logprobs)} entries for "
                f"{len(self.response_token_ids)} response tokens"
            )
        if self.response_mask is not None:
            if len(self.response_mask) != len(self.response_token_ids):
                raise ValueError(f"response_mask has {len(self.response_mask)} flags for "
                                 f"{len(self.response_token_ids)} response tokens")
            if not any(self.response_mask):
                raise ValueError("response_mask marks no model token: a sample of environment tokens alone has "
                                 "nothing to train (and would count 0 in the token-mean divisor)")

        for name in ("token_advantages", "values", "returns"):
            per_token = getattr(self, name)
            if per_token is not None and len(per_token) != len(self.response_token_ids):
                raise ValueError(f"{name} has {len(per_token)} entries for {len(self.response_token_ids)} response "
                                 "tokens")

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.response_token_ids)

    @property
    def has_signal(self) -> bool:
        """Some token's advantage is not 0 (a sample without has no policy gradient, no KL term aside)."""
        if self.token_advantages is not None:
            return any(advantage != 0.0 for advantage in self.token_advantages)
        return self.advantage != 0.0

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_token_ids)

    @property
    def num_model_tokens(self) -> int:
        """The response tokens the model sampled (those the loss reads): all of them without a `response_mask`."""
        return self.num_response_tokens if self.response_mask is None else sum(self.response_mask)

    @property
    def response_positions(self) -> slice:
        """The positions of its collated row whose next-token predictions are the response tokens."""
        start = len(self.prompt_token_ids) - 1
        return slice(start, start + self.num_response_tokens)


class MicroBatch(NamedTuple):
    """Right-padded tensors for one forward pass (B rows, T positions); unpacks like a tuple."""

    input_ids: torch.Tensor
    """[B, T] long, pad_id after each row's end."""
    attention_mask: torch.Tensor
    """[B, T] long, 1 on real tokens."""
    response_mask: torch.Tensor
    """[B, T] float, 1 where position t predicts a response token the model sampled (t+1 is in the response and
    not an environment token): every loss, KL and entropy reads only these positions."""
    advantages: torch.Tensor
    """[B] float, one per row; [B, T] where a sample has `token_advantages`, aligned like response_mask."""


def count_response_tokens(samples: list[TrainSample]) -> int:
    """The token-level loss denominator: the model's response tokens in the whole step's batch (a multi-turn
    sample's environment tokens are context, not actions, and are not counted; single-turn: every response
    token)."""
    return sum(sample.num_model_tokens for sample in samples)


def pack_longest_first(lengths: Sequence[int], max_tokens_per_micro_batch: int) -> list[list[int]]:
    """Indices packed, longest first (ties by index), into groups with rows * longest_row <= budget.

    Sorting by length keeps padding small (lengths are heavy-tailed: one padded
    batch would be mostly padding). An item longer than the budget on its own
    gets a group of its own. Same input -> same groups. The RL trainer and the
    warm-start SFT both cut their batches with it.
    """
    if max_tokens_per_micro_batch < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1, got {max_tokens_per_micro_batch}")
    groups: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        longest = lengths[current[0]] if current else lengths[index]
        if current and (len(current) + 1) * longest > max_tokens_per_micro_batch:
            groups.append(current)
            current = []
        current.append(index)
    if current:
        groups.append(current)
    return groups


def split_by_token_budget(samples: list[TrainSample], max_tokens_per_micro_batch: int) -> list[list[TrainSample]]:
    """Micro-batches of samples, cut by `pack_longest_first` on their token counts: ALL their tokens, a
    multi-turn sample's environment tokens included (they carry no loss but cost the same forward and backward
    compute and memory as the model's)."""
    groups = pack_longest_first([sample.num_tokens for sample in samples], max_tokens_per_micro_batch)
    return [[samples[i] for i in group] for group in groups]


def shard_across_ranks(samples: list[TrainSample], world_size: int) -> list[list[TrainSample]]:
    """Greedy longest-first balancing: each sample goes to the rank with the fewest tokens so far (all tokens,
    environment tokens included: they cost compute).

    Deterministic (ties go to the lowest rank). With at least `world_size`
    samples every rank gets one; with fewer, some ranks get [] and must still
    join the step's collectives.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    shards: list[list[TrainSample]] = [[] for _ in range(world_size)]
    num_tokens = [0] * world_size
    for index in sorted(range(len(samples)), key=lambda i: (-samples[i].num_tokens, i)):
        sample = samples[index]
        rank = min(range(world_size), key=lambda r: (num_tokens[r], len(shards[r]), r))
        shards[rank].append(sample)
        num_tokens[rank] += sample.num_tokens
    return shards


def plan_micro_batches(samples: list[TrainSample], max_tokens_per_micro_batch: int, world_size: int,
                       device: torch.device, allow_empty: bool = False) -> list[list[TrainSample]]:
    """This rank's token-budget micro-batches, padded with [] up to the largest count on any rank (each forward
    and backward is a collective, so every rank runs as many). No samples on any rank: an error, or with
    `allow_empty` one filler (zero gradients: an update whose mini-batch had nothing to train still steps, as its
    zero-advantage samples would have made it)."""
    parts = split_by_token_budget(samples, max_tokens_per_micro_batch) if samples else []
    count = torch.tensor([len(parts)], device=device)
    if world_size > 1:
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
    if count.item() == 0:
        if not allow_empty:
            raise ValueError("train_step got no samples on any rank")
        return [[]]
    return parts + [[] for _ in range(int(count.item()) - len(parts))]


def collate_on(part: list[TrainSample], pad_id: int, device: torch.device) -> MicroBatch:
    """`collate` onto `device`; an empty part becomes one all-padding row with a zero mask: it runs the
    collectives and adds nothing."""
    if part:
        return MicroBatch(*(t.to(device) for t in collate(part, pad_id)))
    filler = collate([TrainSample((pad_id,), (pad_id,), 0.0)], pad_id)
    return MicroBatch(*(t.to(device) for t in filler._replace(response_mask=filler.response_mask * 0)))


def collate(samples: list[TrainSample], pad_id: int) -> MicroBatch:
    """Right-pad prompt + response rows.

    For a row with prompt length P and response length L, response_mask is 1
    at positions P-1 .. P+L-2: those positions' next-token predictions are
    the response tokens; a sample's own `response_mask` then zeroes the
    positions predicting environment tokens (they stay in input_ids).
    """
    width = max(sample.num_tokens for sample in samples)
    input_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), width), dtype=torch.long)
    response_mask = torch.zeros((len(samples), width), dtype=torch.float32)
    for row, sample in enumerate(samples):
        tokens = sample.prompt_token_ids + sample.response_token_ids
        input_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        attention_mask[row, : len(tokens)] = 1
        response_mask[row, sample.response_positions] = model_token_flags(sample)
    advantages = torch.tensor([sample.advantage for sample in samples], dtype=torch.float32)
    if any(sample.token_advantages is not None for sample in samples):
        per_position = torch.zeros((len(samples), width), dtype=torch.float32)
        for row, sample in enumerate(samples):
            per_position[row, sample.response_positions] = (
                torch.tensor(sample.token_advantages, dtype=torch.float32) if sample.token_advantages is not None
                else advantages[row])
        advantages = per_position
    return MicroBatch(input_ids, attention_mask, response_mask, advantages)


def rollout_logprobs_matrix(samples: list[TrainSample], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rollout log-probs aligned like `collate`'s response_mask: ([B, T] values, [B, T] has-value mask). An
    environment token's slot holds no behaviour log-prob (the model did not sample it): has-value is 0 there."""
    values = torch.zeros((len(samples), width), dtype=torch.float32)
    present = torch.zeros((len(samples), width), dtype=torch.float32)
    for row, sample in enumerate(samples):
        if sample.rollout_logprobs is None:
            continue
        values[row, sample.response_positions] = torch.tensor(sample.rollout_logprobs)
        present[row, sample.response_positions] = model_token_flags(sample)
    return values, present


def model_token_flags(sample: TrainSample) -> torch.Tensor | float:
    """[L] float: 1.0 on the model's response tokens, 0.0 on the environment's; the scalar 1.0 without a mask
    (so a single-turn row is filled exactly as before)."""
    if sample.response_mask is None:
        return 1.0
    return torch.tensor(sample.response_mask, dtype=torch.float32)
