"""The embedded default task: multi-term addition, solved one step per line.

A problem is a sum of 2-digit terms; the reference solution adds one term per
line and ends with a `#### <answer>` line (a final-answer marker that
math-verify extracts). The number of terms follows a truncated power law, so
most problems take a few lines and a few take fifty: correct responses range
from 15 to ~690 tokens with median 27, P75 52, P99 ~540. The longest is ~26x
the median, inside the 25-32x that RollPacker (arXiv 2509.21009) measured on
RLVR rollouts: the long tail this system exists for. The longest prompt plus
its solution (~860 tokens) fits the tiny model's 1024-token context.

    prompt   "23+45+11\n"
    solution "23+45=68\n68+11=79\n#### 79"
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from tailflow.engines.data.problem import Problem


@dataclass(frozen=True)
class ArithmeticTask:
    """Parameters of the generator; the defaults are the embedded task."""

    min_terms: int = 2
    max_terms: int = 56
    tail_exponent: float = 1.6
    """P(k terms) is proportional to (k - 1) ** -tail_exponent."""
    max_term_value: int = 99

    def sample(self, rng: random.Random, problem_id: str) -> Problem:
        counts = list(range(self.min_terms, self.max_terms + 1))
        num_terms = rng.choices(counts, weights=[(k - 1) ** -self.tail_exponent for k in counts])[0]
        terms = [rng.randint(1, self.max_term_value) for _ in range(num_terms)]
        return make_problem(terms, problem_id)

    def generate(self, num_problems: int, seed: int, split: str) -> list[Problem]:
        """`num_problems` problems; ids are `<split>-<index>`, the seed fixes them."""
        rng = random.Random(f"{split}:{seed}")
        return [self.sample(rng, f"{split}-{index}") for index in range(num_problems)]


def make_problem(terms: list[int], problem_id: str) -> Problem:
    lines, total = [], terms[0]
    for term in terms[1:]:
        lines.append(f"{total}+{term}={total + term}")
        total += term
    lines.append(f"#### {total}")
    prompt = "+".join(str(t) for t in terms) + "\n"
    return Problem(problem_id=problem_id, prompt=prompt, answer=str(total), solution="\n".join(lines))


def default_splits(num_train: int, num_eval: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """Train and held-out eval splits of the embedded task; no prompt is in both."""
    task = ArithmeticTask()
    train = task.generate(num_train, seed, "train")
    train_prompts = {p.prompt for p in train}
    eval_pool = task.generate(num_eval * 2, seed, "eval")
    held_out = [p for p in eval_pool if p.prompt not in train_prompts][:num_eval]
    return train, held_out
