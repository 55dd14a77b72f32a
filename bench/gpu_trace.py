"""Teacher-forced decode through the native engine's `ModelRunner`: the logits of every step, kept.

The engine's `generate()` only shows the tokens it picked; two runs that differ
in one token say nothing of how far apart their numbers were. This drives the
runner the way `NativeEngine` does (each prompt but its last token prefilled
into its own row, then one decode step of every row at its own position) and
keeps each step's logits, feeding either the tokens given (teacher forcing:
two traces then see exactly the same inputs and their logits can be compared
step for step) or each row's argmax (greedy). Used by the kit's `rope` and
`graphs` stages. The runner must be idle (no request in flight): the trace
writes rows 0..len(prompts)-1 of its KV cache.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class Trace:
    """`logits[s, r]`: row r's logits at decode step s, in the runner's dtype (bf16 on CUDA: the decode's own
    precision, so nothing is lost), on the runner's device; `tokens[r][s]`: the argmax of `logits[s, r]`."""

    logits: torch.Tensor
    tokens: list[list[int]]


@dataclass(frozen=True)
class TraceDiff:
    """Two traces of the same inputs compared: bitwise, and by how much."""

    a: str
    b: str
    bitwise_equal: bool
    max_abs: float
    """max |a - b| over every step, row and token (in fp32)."""
    first_step: int | None
    """The first decode step whose logits differ in any bit (None: none)."""
    argmax_differs: int
    """(step, row) pairs whose argmax differs."""


def forced_decode(runner, prompts: Sequence[Sequence[int]], steps: int,
                  forced: Sequence[Sequence[int]] | None = None) -> Trace:
    """`steps` decode steps of every prompt, row i holding prompts[i]. Step s feeds prompts[i][-1] (s = 0) or
    forced[i][s - 1] (greedy: the previous step's argmax when `forced` is None)."""
    if len(prompts) > runner.num_slots:
        raise ValueError(f"{len(prompts)} prompts, {runner.num_slots} slots")
    for row, prompt in enumerate(prompts):
        if len(prompt) > 1:
            runner.prefill(torch.tensor([list(prompt[:-1])]), first_row=row)
    feed = [prompt[-1] for prompt in prompts]
    position = [len(prompt) - 1 for prompt in prompts]
    all_logits, tokens = [], [[] for _ in prompts]
    for step in range(steps):
        logits = runner.decode(torch.tensor(feed), torch.tensor(position), max(position) + 1)
        all_logits.append(logits.to(runner.dtype, copy=True))  # never a graph's static output buffer itself
        chosen = logits.argmax(dim=-1).tolist()
        for row, token in enumerate(chosen):
            tokens[row].append(token)
        feed = [forced[row][step] for row in range(len(prompts))] if forced is not None else chosen
        position = [p + 1 for p in position]
    return Trace(torch.stack(all_logits), tokens)


def compare(a_name: str, a: Trace, b_name: str, b: Trace) -> TraceDiff:
    differs = (a.logits != b.logits).flatten(1).any(dim=1)
    first = int(differs.nonzero()[0, 0]) if bool(differs.any()) else None
    max_abs = (a.logits.float() - b.logits.float()).abs().max().item()
    argmax = (a.logits.argmax(dim=-1) != b.logits.argmax(dim=-1)).sum().item()
    return TraceDiff(a_name, b_name, first is None, max_abs, first, int(argmax))


def top2_gap(logits: torch.Tensor) -> float:
    """Best minus second-best logit of one row's logits (how close a greedy choice was)."""
    top = logits.float().topk(2).values
    return (top[0] - top[1]).item()
