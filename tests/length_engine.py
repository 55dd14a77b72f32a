"""A model-free rollout for pipeline tests: each response's length and tokens are functions of its seed.

A request's seed fixes how long its response is (`length_of`) and which token comes at each position, so a
response continued from a prefix (`Request.prefix`, the engine's partial rollout) ends exactly as the
uninterrupted one would: what a real engine does by advancing the request's sampler past the prefix. Every
token records the weight version the engine held when it produced it (`version`, set by the test at each
"weight sync"). Admission is first come first served into `num_slots` slots, one token per running response
per engine step, finishes reported in admission order within a step: the completion rule sees lengths, not
luck of ordering.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Completion, FinishReason, Request, SamplingParams
from tailflow.engines.rollout.requests import request_seed
from tailflow.engines.tail.launch import launch_order


def token_at(seed: int, position: int) -> int:
    return 2 + (seed * 31 + position * 7) % 97


def lognormal_length(mu: float, sigma: float, cap: int) -> Callable[[int], int]:
    """The same LogNormal(mu, sigma) for every prompt, rounded up and capped: a response's length from its seed."""
    return lambda seed: min(cap, max(1, math.ceil(random.Random(seed).lognormvariate(mu, sigma))))


@dataclass
class Running:
    request: Request
    length: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def completion(self, reason: FinishReason, version: int) -> Completion:
        mixed = tuple(self.versions) if len(set(self.versions)) > 1 else ()
        return self.request.completion(tuple(self.tokens), tuple(self.logprobs), reason, version, mixed)


class LengthEngine:
    """The `StreamingRollout` calls over one simulated engine."""

    def __init__(self, length_of: Callable[[int], int], num_slots: int = 1 << 30) -> None:
        self.length_of, self.num_slots = length_of, num_slots
        self.version = 0
        self.queue: dict[str, Running] = {}
        """Submitted, in arrival order; the first `num_slots` of them run."""
        self.submitted: list[Request] = []

    def submit(self, requests):
        for request in requests:
            prefix = request.prefix
            running = Running(request, self.length_of(request.params.seed))
            if prefix is not None:
                running.tokens, running.logprobs = list(prefix.token_ids), list(prefix.logprobs)
                running.versions = list(prefix.weight_versions)
                assert running.tokens == [token_at(request.params.seed, i) for i in range(len(running.tokens))]
            assert len(running.tokens) < running.length, "a finished response is never continued"
            self.queue[request.request_id] = running
            self.submitted.append(request)

    def poll(self, max_steps):
        finished = []
        for _ in range(max_steps):
            if not self.queue:
                break
            for rid, running in list(self.queue.items())[: self.num_slots]:
                running.tokens.append(token_at(running.request.params.seed, len(running.tokens)))
                running.logprobs.append(-0.5)
                running.versions.append(self.version)
                if len(running.tokens) == running.length:
                    finished.append(running.completion(FinishReason.EOS, self.version))
                    del self.queue[rid]
        return finished

    def abort(self, request_ids):
        return [self.queue.pop(rid).completion(FinishReason.ABORT, self.version) for rid in request_ids
                if rid in self.queue]

    def generate(self, requests):
        self.submit(requests)
        done = {}
        while self.queue:
            done.update((c.request_id, c) for c in self.poll(64))
        return [done[request.request_id] for request in requests]

    def has_unfinished(self):
        return bool(self.queue)

    def stats(self):
        return []


def problems(count: int) -> list[Problem]:
    return [Problem(f"p{i:04d}", f"prompt {i}", "0") for i in range(count)]


def make_requests(planned, max_new_tokens: int = 10_000) -> list[Request]:
    """A round's seeded requests (response k of every prompt in turn, as `sampling_requests`)."""
    return [Request.for_problem(p.problem_id, k, (2, 3),
                                SamplingParams(max_new_tokens=max_new_tokens,
                                               seed=request_seed(0, planned.plan.iteration, p.problem_id, k)))
            for p, k in launch_order(planned.problems, planned.plan.responses_per_prompt)]
