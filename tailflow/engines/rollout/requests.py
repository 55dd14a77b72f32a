"""Problems -> engine requests: ids, prompt tokens and per-request seeds.

Request ids are `<problem_id>#<k>` so completions find their group again.
Seeds are a stable hash of (run seed, iteration, problem, k): the same request
samples the same tokens in any worker, in any order.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Request, SamplingParams


def request_seed(*parts: object) -> int:
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def prompt_token_ids(problem: Problem, tokenizer, template: str = "{prompt}") -> tuple[int, ...]:
    return tuple(tokenizer(template.format(prompt=problem.prompt), add_special_tokens=False)["input_ids"])


def sampling_requests(
    problems: Sequence[Problem],
    responses_per_prompt: int,
    params: SamplingParams,
    tokenizer,
    seed: int,
    iteration: int,
    template: str = "{prompt}",
) -> list[Request]:
    """`responses_per_prompt` sampled requests per problem, problem-major order."""
    requests = []
    for problem in problems:
        prompt = prompt_token_ids(problem, tokenizer, template)
        for k in range(responses_per_prompt):
            seeded = SamplingParams(**{**params.__dict__, "seed": request_seed(seed, iteration, problem.problem_id, k)})
            requests.append(Request(f"{problem.problem_id}#{k}", prompt, seeded))
    return requests


def greedy_requests(problems: Sequence[Problem], max_new_tokens: int, tokenizer, template: str = "{prompt}") -> list[Request]:
    """One greedy request per problem (evaluation); the engine stops at the model's EOS."""
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    return [Request(f"{problem.problem_id}#0", prompt_token_ids(problem, tokenizer, template), params) for problem in problems]
