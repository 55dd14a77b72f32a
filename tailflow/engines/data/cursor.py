"""Where the run is in its training data: epoch and position in a seeded order.

The cursor is plain data (it goes into the run state), and the order of epoch
`e` is a pure function of (seed, e), so a resumed run draws the same prompts.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from tailflow.engines.data.problem import Problem


@dataclass
class DataCursor:
    epoch: int = 0
    position: int = 0
    """Index into this epoch's shuffled order of the next prompt to draw."""
    num_drawn: int = 0
    """Fresh prompts drawn since the run started."""


def epoch_order(num_problems: int, seed: int, epoch: int) -> list[int]:
    order = list(range(num_problems))
    random.Random(f"order:{seed}:{epoch}").shuffle(order)
    return order


def draw_prompts(problems: list[Problem], cursor: DataCursor, count: int, seed: int) -> list[Problem]:
    """The next `count` problems in the seeded order, advancing `cursor` in place."""
    drawn: list[Problem] = []
    while len(drawn) < count:
        order = epoch_order(len(problems), seed, cursor.epoch)
        take = order[cursor.position : cursor.position + count - len(drawn)]
        drawn.extend(problems[index] for index in take)
        cursor.position += len(take)
        if cursor.position >= len(problems):
            cursor.epoch, cursor.position = cursor.epoch + 1, 0
    cursor.num_drawn += count
    return drawn
