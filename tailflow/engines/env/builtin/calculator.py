"""A calculator for the embedded arithmetic task: the model writes each step's sum, the environment computes it.

Single-turn, the model must both plan ("23+45=") and add ("68"). Here it plans and the environment adds:

    first observation  "23+45+11\n"     (the problem: the same prompt the single-turn task shows)
    model turn         "23+45="         (one line, ending at "=")
    observation        "68\n"           (the true value, then a newline)
    model turn         "68+11="
    observation        "79\n"
    model turn         "#### 79"        (the final answer: reward 1.0 if it is the sum of the terms, else 0.0)

How the task and the environment agree: there is one source of the problem, the seed. `reset(seed)` draws the
problem from the embedded generator (engines/data/arith.py, `ArithmeticTask.sample`, with a generator seeded by
the seed alone), and the first observation is the problem's prompt, so the run's own prompt for this environment
carries no problem (it may be empty). A group shares the seed, so it shares the problem. `settings` choose the
distribution (the number of terms, the largest term): the defaults keep trajectories short, a few turns each.

Every observation is digits, "-" and a newline: inside the embedded model's vocabulary.

With `task=False` it is a tool only: the task is the run's own problem (a dataset's prompt), `reset` shows
nothing, and the final answer ends the trajectory unpaid: the verifier scores it against the problem's answer
(`env.reward: verifier` or `sum`).
"""
from __future__ import annotations

import random
import re

from tailflow.engines.data.arith import ArithmeticTask
from tailflow.engines.env.environment import EnvStep, Environment, InvalidAction

OPERATION = re.compile(r"(\d{1,12})([+\-*])(\d{1,12})=")
"""One binary operation on non-negative integers, ending at "=" (the turn's end); 12 digits bound the work."""
ANSWER = re.compile(r"#### (-?\d{1,12})")
"""The final answer line, as the single-turn task's reward reads it."""


class Calculator(Environment):
    def __init__(self, min_terms: int = 2, max_terms: int = 6, max_term_value: int = 99, task: bool = True) -> None:
        self.task = ArithmeticTask(min_terms=min_terms, max_terms=max_terms, max_term_value=max_term_value)
        self.terms: tuple[int, ...] = ()
        self.has_task = task

    def reset(self, seed: int) -> str:
        if not self.has_task:
            return ""
        problem = self.task.sample(random.Random(f"calculator:{seed}"), f"calculator-{seed}")
        self.terms = tuple(int(term) for term in problem.prompt.strip().split("+"))
        return problem.prompt

    def step(self, action: str) -> EnvStep:
        text = action.strip()
        if answer := ANSWER.fullmatch(text):
            if not self.has_task:
                return EnvStep("", done=True)  # the verifier pays
            correct = int(answer.group(1)) == sum(self.terms)
            return EnvStep("", reward=1.0 if correct else 0.0, done=True, info={"correct": int(correct)})
        if operation := OPERATION.fullmatch(text):
            left, operator, right = int(operation.group(1)), operation.group(2), int(operation.group(3))
            value = {"+": left + right, "-": left - right, "*": left * right}[operator]
            return EnvStep(f"{value}\n")
        raise InvalidAction(f"neither 'a+b=' nor '#### n': {text[:40]!r}")
