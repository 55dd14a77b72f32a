"""Random train samples over the tiny model's vocabulary, shared by the trainer tests (not a test module)."""
from __future__ import annotations

import random

from tailflow.engines.train.batch import TrainSample


def make_samples(count: int, seed: int, advantages=(-1.0, 0.5, 1.0),
                 with_rollout_logprobs: bool = True) -> list[TrainSample]:
    """`count` samples: prompts of 3-10 and responses of 1-20 token ids in 3..21, advantages drawn from
    `advantages`; each response token's rollout log-prob is -3.0, sampled at temperature 1 (None without
    `with_rollout_logprobs`).
    The same `seed` gives the same samples whatever the flag (it draws nothing)."""
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        prompt = tuple(rng.randrange(3, 22) for _ in range(rng.randint(3, 10)))
        response = tuple(rng.randrange(3, 22) for _ in range(rng.randint(1, 20)))
        rollout = tuple(-3.0 for _ in response) if with_rollout_logprobs else None
        samples.append(TrainSample(prompt, response, rng.choice(advantages), rollout,
                                   rollout_temperature=1.0 if with_rollout_logprobs else None))
    return samples
