"""Problems -> engine requests: ids, prompt tokens and per-request seeds.

Each request carries its problem id and response index (`Request.for_problem`), so completions find their
group by field; the id `<problem_id>#<k>` is only a key.
Seeds are a stable hash of (run seed, iteration, problem, k): the same request
samples the same tokens in any worker, in any order.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Request, SamplingParams
from tailflow.engines.tail.launch import launch_order


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
    """`responses_per_prompt` sampled requests per problem, in the policy's launch order (response k of every
    problem in turn, `tail.launch.launch_order`)."""
    prompts = {problem.problem_id: prompt_token_ids(problem, tokenizer, template) for problem in problems}
    requests = []
    for problem, k in launch_order(problems, responses_per_prompt):
        seeded = SamplingParams(**{**params.__dict__, "seed": request_seed(seed, iteration, problem.problem_id, k)})
        requests.append(Request.for_problem(problem.problem_id, k, prompts[problem.problem_id], seeded))
    return requests


def greedy_requests(problems: Sequence[Problem], max_new_tokens: int, tokenizer, template: str = "{prompt}") -> list[Request]:
    """One greedy request per problem (evaluation); the engine stops at the model's EOS."""
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    return [Request.for_problem(problem.problem_id, 0, prompt_token_ids(problem, tokenizer, template), params)
            for problem in problems]
