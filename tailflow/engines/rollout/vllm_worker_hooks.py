"""What the vLLM engine runs inside vLLM's worker (through `collective_rpc`): the sampler's draws for a prefix.

A request continued from a `ResponsePrefix` (a partial rollout after a weight sync, or one migrated from a
worker that left) must draw exactly what it would have drawn uninterrupted, as the native engine's does. vLLM
seeds each request's sampler from `SamplingParams.seed`; what a continued request needs on top depends on the
model runner (read in vLLM 0.32.0's and 0.33.0's source):

- Model runner V2 (`vllm/v1/worker/gpu/`, vLLM's default on a GPU with Triton): the Gumbel noise of a token is
  a hash of (seed, position in the sequence, token id), no generator state. A continued request sent with the
  same seed draws at each position what the uninterrupted one drew there: nothing to do. (Read, never run: no
  GPU here.)
- Model runner V1 (`gpu_model_runner.py`; the CPU backend's, `CPUModelRunner`): a `torch.Generator` per request,
  created from the seed when vLLM first schedules the request, advanced by every token it samples. On the CPU
  backend each sampled token takes one `torch.randint(0, 2**31, (1,))` from it (`TopKTopPSampler.forward_cpu`:
  the draw seeds that row's Gumbel noise); on a GPU one `exponential_()` over a vocabulary-sized row
  (`random_sample`). `install_prefix_draws` wraps the runner's `_update_states` (where that generator is made,
  before the step samples) so a new request whose `SamplingParams.extra_args` carry `PREFIX_DRAWS` first
  takes those draws: the CPU path ran (tests/test_vllm_engine.py); the GPU one is written from the source.

`_update_states` is vLLM's private method: `install_prefix_draws` refuses, naming what it missed, a runner that
has none, rather than let continued requests silently sample another stream.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

PREFIX_DRAWS = "tailflow_prefix_draws"
"""`SamplingParams.extra_args` key: the draws a request's sampler took for the prefix it continues from."""


def take_cpu_draws(generator: torch.Generator, count: int) -> None:
    """The draws of `count` sampled tokens on vLLM's CPU sampler (one 31-bit seed per token)."""
    for _ in range(count):
        torch.randint(0, 2**31, (1,), generator=generator, dtype=torch.long)


def take_gpu_draws(vocab_size: int, generator: torch.Generator, count: int) -> None:
    """The draws of `count` sampled tokens on vLLM's V1 GPU sampler (exponential noise over one vocabulary row).
    Written from vLLM's source, never run (no GPU here)."""
    row = torch.empty(vocab_size, dtype=torch.float32, device=generator.device)
    for _ in range(count):
        row.exponential_(generator=generator)


def install_prefix_draws(worker: Any) -> str:
    """Runs in vLLM's worker once per engine: make continued requests take their prefix's draws. Returns how
    ("position-keyed": nothing to take; "advanced": the V1 runner now takes them)."""
    if worker.vllm_config.use_v2_model_runner:
        return "position-keyed"
    runner = worker.model_runner
    missing = [name for name in ("_update_states", "requests") if not hasattr(runner, name)]
    if missing:
        raise RuntimeError(f"vLLM's {type(runner).__name__} has no {missing}: continued requests could not take "
                           "their prefix's draws (written against vLLM 0.32.0 / 0.33.0)")
    if runner.device.type == "cpu":
        take: Callable[[torch.Generator, int], None] = take_cpu_draws
    else:
        vocab_size = worker.vllm_config.model_config.get_vocab_size()
        take = lambda generator, count: take_gpu_draws(vocab_size, generator, count)  # noqa: E731
    update_states = runner._update_states

    def update_states_then_take_draws(scheduler_output):
        result = update_states(scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            extra = (new.sampling_params.extra_args or {}) if new.sampling_params is not None else {}
            generator = runner.requests[new.req_id].generator
            if extra.get(PREFIX_DRAWS) and generator is not None:
                take(generator, extra[PREFIX_DRAWS])
        return result

    runner._update_states = update_states_then_take_draws
    return "advanced"
