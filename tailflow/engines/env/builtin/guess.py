"""Higher or lower: the shortest complete environment, an example to copy.

The secret is drawn from the seed, so a group's trajectories play the same game. Observations use only the
embedded model's characters: "+" the secret is higher, "-" lower, and the task's first line "0:99?".
"""
from __future__ import annotations

import random

from tailflow.engines.env.environment import EnvStep, Environment, InvalidAction


class Guess(Environment):
    def __init__(self, high: int = 99) -> None:
        self.high = high
        self.secret = 0

    def reset(self, seed: int) -> str:
        self.secret = random.Random(seed).randint(0, self.high)
        return f"0:{self.high}?\n"

    def step(self, action: str) -> EnvStep:
        text = action.strip()
        if not text.isdigit():
            raise InvalidAction(f"not a number: {text[:20]!r}")
        guess = int(text)
        if guess == self.secret:
            return EnvStep("", reward=1.0, done=True)
        return EnvStep("+" if guess < self.secret else "-")
