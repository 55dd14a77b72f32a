"""The problems of a multi-turn run on an environment without a dataset (`env` set, no `data.train_path`).

The environment states the task: `reset(seed)` draws it and its first observation shows it
(`engines/env/environment.py`), so a problem here is only an identity, `env<data.seed>-<split>-<i>`, whose hash is
its trajectories' environment seed (`rollout/trajectory_engine.group_env_seed`: one task per GRPO group, the same
task whenever the problem comes back, from a long-prompt queue or a resumed run). Its prompt is empty: what the
model first sees is the first observation.

Held-out problems are other identities, so other seeds; whether two seeds draw the same task is the environment's
business (the embedded calculator draws from ~10^4 two-term sums, so some held-out tasks are also trained ones).
"""
from __future__ import annotations

from tailflow.engines.data.problem import Problem


def env_splits(num_train: int, num_eval: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """`num_train` training and `num_eval` held-out problem identities (prompt and answer empty)."""
    return ([Problem(f"env{seed}-train-{i}", "", "") for i in range(num_train)],
            [Problem(f"env{seed}-eval-{i}", "", "") for i in range(num_eval)])
