"""Turn one step's logits into tokens, reproducibly, with per-request settings.

Each request draws from its own `torch.Generator`, so its tokens do not depend
on which other requests share the batch. The only per-row Python is one
uniform draw per sampled row; filtering (temperature, top-k, top-p) and the
inverse-CDF draw are batched.

The recorded log-prob of a sampled token is the one `Completion.logprobs` defines (mu, the distribution that
drew it; greedy rows: temperature 1, unfiltered, and nothing trains on them: the trainer refuses temperature 0).
Recording the raw temperature-1 log-prob instead would make the losses' weight pi / mu ~1 where it is p / mu (a
top-p token with p = 0.459 in a kept mass of 0.62 has weight 0.74).
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
    """logits [B, V] -> (token ids [B], log-probs [B] of those tokens under the distribution each row drew from
    (greedy rows: temperature 1, unfiltered)), computed in fp32."""
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    greedy_logprobs = torch.log_softmax(logits, dim=-1).gather(1, greedy[:, None])[:, 0]
    if batch.is_all_greedy:
        return greedy, greedy_logprobs
    drawn, drawn_logprobs = draw_filtered(logits, batch) if batch.needs_filter else draw(logits, batch)
    is_greedy = batch.temperatures[:, 0] == 0
    return torch.where(is_greedy, greedy, drawn), torch.where(is_greedy, greedy_logprobs, drawn_logprobs)


def scaled_logits(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """logits / T; greedy rows (T = 0) get T = 1 since their draw is discarded."""
    return logits / torch.where(temperatures == 0, 1.0, temperatures)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index [B] where each row's cumulative (unnormalised) mass first exceeds u * total: index i is drawn with
    probability probs[i] / total."""
    cdf = probs.cumsum(dim=-1)
    targets = uniforms[:, None] * cdf[:, -1:]
    index = torch.searchsorted(cdf, targets, right=True)[:, 0]
    return index.clamp_(max=probs.shape[-1] - 1)


def draw(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B], their log-probs under softmax(logits / T) [B])."""
    scaled = scaled_logits(logits, batch.temperatures)
    tokens = inverse_cdf(torch.softmax(scaled, dim=-1), batch.uniforms)
    return tokens, torch.log_softmax(scaled, dim=-1).gather(1, tokens[:, None])[:, 0]


def draw_filtered(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k then top-p over tokens sorted by logit (stable, so ties keep argmax's order); (tokens [B], their
    log-probs under the kept tokens' renormalised distribution [B]: log p - log(mass kept))."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    scaled = scaled_logits(sorted_logits, batch.temperatures)
    probs = torch.softmax(scaled, dim=-1)
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None]
    top_ks = torch.where(batch.top_ks == 0, logits.shape[-1], batch.top_ks)
    probs = probs.masked_fill(ranks >= top_ks, 0.0)
    mass_before = probs.cumsum(dim=-1) - probs
    probs = probs.masked_fill(mass_before >= batch.top_ps * probs.sum(-1, keepdim=True), 0.0)
    index = inverse_cdf(probs, batch.uniforms)[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1).gather(1, index)[:, 0] - probs.sum(-1).log()
    return order.gather(1, index)[:, 0], logprobs
