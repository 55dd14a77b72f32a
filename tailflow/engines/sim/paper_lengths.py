"""A seeded length generator with the RollPacker paper's characterisation of RLVR rollouts: the shipped profile
`rollpacker-14b-math`, labelled by what it was characterised from.

What the paper reports (arXiv 2509.21009, section 2.2 and Figure 2a; Qwen2.5-14B,
math, 16k cap, 128 prompts x 8): most responses are short to moderate, P75
between 755 and 1.1k tokens; the longest response of a batch is 25-32x the
median and reaches the 16k cap; and "some difficult prompts consistently
produce long responses" (section 6.3), so one prompt's responses are
correlated.

The parameters below were fixed from that characterisation alone, before any
simulated result was looked at (the test
`test_paper_lengths_match_the_characterisation` checks the characterisation,
nothing else):

* a prompt has a difficulty z ~ N(0, 1);
* a normal response is log-normal around median_tokens (585: the median that
  makes a batch reaching the 16k cap 28x its median), scaled by
  exp(prompt_sigma x z), with its own spread response_sigma: together
  sigma 0.67, so P75 ~ 1.57 x median;
* with probability min(0.95, tail_base x exp(tail_slope x z)) a response
  rambles instead: log-uniform between 4 x the median and 1.3 x cap, cut at
  the cap (~12% of rambling responses hit a 16k cap). Hard prompts (z = 2)
  ramble in 40% of their responses, typical ones (z = 0) in 2%.

A response that ends by itself does not know the cap, so the body is in tokens
whatever the cap (it used to scale with the cap, as median = cap / 28, which
fixed a short round's length at a fraction of the cap by construction); a
rambling one runs until the cap cuts it, so the tail reaches whatever cap is
set. The profile is the 14B's on a math task: other models and tasks write
other lengths, so a plan from it says so (`describe`), and a plan from a
trace (`--run`, `--trace`, `--rollpacker`) uses measured lengths instead.
Prompts are log-normal around 256 tokens (the paper gives no prompt lengths;
they matter little beside responses).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tailflow.engines.rollout.protocol import Request
from tailflow.engines.sim.lengths import LengthSource, ResponseLength, capped, seeded_rng


@dataclass(frozen=True)
class PaperLengthParams:
    median_tokens: float = 16384 / 28
    prompt_sigma: float = 0.5
    response_sigma: float = 0.45
    tail_base: float = 0.02
    tail_slope: float = 1.5
    tail_low: float = 4.0
    """Rambling responses start at tail_low x the median..."""
    tail_high_fraction: float = 1.3
    """...and reach tail_high_fraction x cap (anything above the cap is cut there)."""
    prompt_median_tokens: int = 256
    prompt_token_sigma: float = 0.5


PROFILE = "rollpacker-14b-math"
PROFILE_SOURCE = ("characterised from RollPacker (arXiv 2509.21009) section 2.2 and Figure 2a: Qwen2.5-14B on math "
                  "at a 16k cap (median 585 tokens, longest/median 25-32x, the tail reaching the cap)")


class PaperLikeLengths(LengthSource):
    """`num_prompts` synthetic prompts `p000000`..., each response's length a seeded draw (see module doc)."""

    def __init__(self, num_prompts: int, max_new_tokens: int, seed: int = 0,
                 params: PaperLengthParams = PaperLengthParams()) -> None:
        if num_prompts < 1 or max_new_tokens < 2:
            raise ValueError(f"need num_prompts >= 1 and max_new_tokens >= 2, got {num_prompts}, {max_new_tokens}")
        super().__init__()
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.params = params
        self._ids = [f"p{index:06d}" for index in range(num_prompts)]
        self._difficulty = {p: seeded_rng("difficulty", seed, p).gauss(0.0, 1.0) for p in self._ids}

    def describe(self) -> str:
        return f"profile {PROFILE} ({PROFILE_SOURCE}), {self.max_new_tokens}-token cap, seed {self.seed}"

    def problem_ids(self) -> list[str]:
        return list(self._ids)

    def difficulty(self, problem_id: str) -> float:
        return self._difficulty[problem_id]

    def prompt_tokens(self, problem_id: str) -> int:
        draw = seeded_rng("prompt", self.seed, problem_id).gauss(0.0, self.params.prompt_token_sigma)
        return int(min(max(self.params.prompt_median_tokens * math.exp(draw), 16), 4096))

    def draw(self, iteration: int, request: Request) -> ResponseLength:
        return self.draw_for(request.problem_id, request.request_id, iteration,
                             min(self.max_new_tokens, request.params.max_new_tokens))

    def draw_for(self, problem_id: str, request_id: str, iteration: int, cap: int) -> ResponseLength:
        p = self.params
        z = self._difficulty[problem_id]
        rng = seeded_rng("response", self.seed, iteration, request_id)
        median = p.median_tokens
        if rng.random() < min(0.95, p.tail_base * math.exp(p.tail_slope * z)):
            low, high = math.log(p.tail_low * median), math.log(p.tail_high_fraction * cap)
            return capped(round(math.exp(rng.uniform(low, high))), cap)
        return capped(round(median * math.exp(p.prompt_sigma * z + rng.gauss(0.0, p.response_sigma))), cap)
