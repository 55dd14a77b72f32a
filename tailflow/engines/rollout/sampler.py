"""Turn one step's logits into tokens, reproducibly, with per-request settings.

Each request draws from its own `torch.Generator`, so its tokens do not depend
on which other requests share the batch. The only per-row Python is one
uniform draw per sampled row; filtering (temperature, top-k, top-p) and the
inverse-CDF draw are batched. The recorded logprob is always the raw model's
(temperature 1, no filtering): the quantity the trainer recomputes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingBatch:
    """Per-row settings for one step, all [B] (or [B, 1] for broadcasting)."""

    temperatures: torch.Tensor  # [B, 1] float; 0 = greedy
    top_ks: torch.Tensor        # [B, 1] long; 0 = off
    top_ps: torch.Tensor        # [B, 1] float; 1 = off
    uniforms: torch.Tensor      # [B] float in [0, 1), drawn from each row's generator (unused if greedy)
    is_all_greedy: bool
    needs_filter: bool


def make_batch(temperatures: list[float], top_ks: list[int], top_ps: list[float],
               generators: list[torch.Generator], device: torch.device | str = "cpu") -> SamplingBatch:
    """Gather settings; draw one uniform per non-greedy row from its own (CPU) generator, so a request's
    draws are the same on any device; the settings then move to the logits' `device`."""
    is_all_greedy = all(t == 0 for t in temperatures)
    draws = [0.0 if t == 0 else torch.rand(1, generator=g).item() for t, g in zip(temperatures, generators)]
    return SamplingBatch(
        temperatures=torch.tensor(temperatures, device=device)[:, None],
        top_ks=torch.tensor(top_ks, device=device)[:, None],
        top_ps=torch.tensor(top_ps, device=device)[:, None],
        uniforms=torch.tensor(draws, device=device),
        is_all_greedy=is_all_greedy,
        needs_filter=any(k > 0 for k in top_ks) or any(p < 1 for p in top_ps),
    )


def sample(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, V] -> (token ids [B], raw logprobs of those tokens [B]), computed in fp32."""
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    if batch.is_all_greedy:
        tokens = greedy
    else:
        drawn = draw_filtered(logits, batch) if batch.needs_filter else draw(logits, batch)
        tokens = torch.where(batch.temperatures[:, 0] == 0, greedy, drawn)
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs


def scaled_probs(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """softmax(logits / T); greedy rows (T = 0) get T = 1 since their draw is discarded."""
    return torch.softmax(logits / torch.where(temperatures == 0, 1.0, temperatures), dim=-1)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index [B] where each row's cumulative (unnormalised) mass first exceeds u * total."""
    cdf = probs.cumsum(dim=-1)
    targets = uniforms[:, None] * cdf[:, -1:]
    index = torch.searchsorted(cdf, targets, right=True)[:, 0]
    return index.clamp_(max=probs.shape[-1] - 1)


def draw(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    return inverse_cdf(scaled_probs(logits, batch.temperatures), batch.uniforms)


def draw_filtered(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Top-k then top-p over tokens sorted by logit (stable, so ties keep argmax's order)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = scaled_probs(sorted_logits, batch.temperatures)
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None]
    top_ks = torch.where(batch.top_ks == 0, logits.shape[-1], batch.top_ks)
    probs = probs.masked_fill(ranks >= top_ks, 0.0)
    mass_before = probs.cumsum(dim=-1) - probs
    probs = probs.masked_fill(mass_before >= batch.top_ps * probs.sum(-1, keepdim=True), 0.0)
    return order.gather(1, inverse_cdf(probs, batch.uniforms)[:, None])[:, 0]
