"""The run's durable state: what a resumed run needs to continue exactly.

Committed with every iteration (`<run_id>/states/iter-NNNN.json`, named by the
`latest` pointer; see `tailflow.engines.runs.commit`). Everything random in a
run is derived from seeds and names (the data order from `data.seed` and the
epoch, each request's sampling seed from `train.seed`, the iteration and the
request id), so the RNG states recorded here are the driver's own, restored on
resume for anything that draws from the global generators. The code reward's
adaptive-timeout anchors (`engines/reward/timeouts.py`) are part of it too.
"""
from __future__ import annotations

import base64
import random

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tailflow.engines.outcome import IterationOutcome
from tailflow.engines.reward.timeouts import TimeoutAnchors
from tailflow.engines.tail.pipeline_state import PipelineState
from tailflow.engines.tail.state import TailState


class RngState(BaseModel):
    """The driver's global generators (python, numpy, torch) in plain JSON (no pickle: states are read back
    from a shared store)."""

    python: list
    """`random.getstate()`: (version, 625 ints, gauss_next)."""
    numpy: list
    """`np.random.get_state()`: (name, 624 words, pos, has_gauss, cached_gaussian)."""
    torch: str
    """`torch.get_rng_state()` bytes, base64."""
    engine_seed: int
    """`train.seed`: request seeds derive from it, the iteration and the request id."""

    @classmethod
    def capture(cls, engine_seed: int) -> "RngState":
        version, words, gauss_next = random.getstate()
        name, keys, pos, has_gauss, cached = np.random.get_state()
        return cls(
            python=[version, list(words), gauss_next],
            numpy=[name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
            torch=base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
            engine_seed=engine_seed,
        )

    def restore(self) -> None:
        version, words, gauss_next = self.python
        random.setstate((version, tuple(words), gauss_next))
        name, keys, pos, has_gauss, cached = self.numpy
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(self.torch)), dtype=torch.uint8))


class RunState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    iteration: int = 0
    """Next iteration to run (= iterations completed)."""
    weight_version: int = 0
    """Version of the policy weights; +1 per optimizer step."""
    tail: TailState = Field(default_factory=TailState)
    """Tail batching's long-prompt queue and the data cursor."""
    latest_checkpoint: str | None = None
    """Store key of the checkpoint holding this state's weights; None: the run's initial model."""
    weights_sha256: str | None = None
    """sha256 of that checkpoint's model.safetensors."""
    rng: RngState | None = None
    round_history: list[int] = Field(default_factory=list)
    """`tail/round` of every iteration so far (0 short, 1 long; 0 for synchronous rounds)."""
    reward_anchors: TimeoutAnchors = Field(default_factory=TimeoutAnchors)
    """The code reward's adaptive-timeout anchors after this commit's iteration."""
    initial_eval_accuracy: float | None = None
    last_eval_accuracy: float | None = None
    pipeline: PipelineState | None = None
    """Asynchronous runs (`rollout.async_ratio` > 0): the rounds launched ahead of training and the requests in
    flight, with every token they have (engines/tail/pipeline_state.py); with `tail.continue_deferred` also the
    deferred prompts' responses their long round will continue (synchronous runs too); None when it holds
    nothing."""
    rollout_workers_added: int = 0
    """Rollout workers added at runtime minus those removed (`tailflow workers add/remove`), as of this commit: a
    resumed run starts `rollout.num_workers` plus these (`RolloutGroup.keep_added`)."""

    @model_validator(mode="before")
    @classmethod
    def _read_older_states(cls, data):
        """States committed before `tail` existed kept the queue and cursor at the top level."""
        if isinstance(data, dict) and ("long_queue" in data or "cursor" in data):
            data = dict(data)
            data["tail"] = {"queue": data.pop("long_queue", []), "cursor": data.pop("cursor", {})}
        return data

    def advance(self, outcome: IterationOutcome, pipeline: PipelineState | None = None,
                rollout_workers_added: int = 0) -> "RunState":
        """The state after `outcome`'s iteration, before its commit names a checkpoint; `pipeline`: an
        asynchronous run's rounds and requests in flight at that point; `rollout_workers_added`: the rollout
        group's `workers_added()` then."""
        evaluated = outcome.evaluated.accuracy if outcome.evaluated is not None else self.last_eval_accuracy
        return self.model_copy(update=dict(
            iteration=outcome.iteration + 1, weight_version=self.weight_version + 1, tail=outcome.tail,
            round_history=[*self.round_history, outcome.taken.planned.plan.round_metric],
            reward_anchors=outcome.anchors, last_eval_accuracy=evaluated, pipeline=pipeline,
            rollout_workers_added=rollout_workers_added))

    def without_pipeline(self) -> "RunState":
        """This state as a subflow parameter: Prefect refuses flow-run parameters over 512 KB, and an async run's
        pipeline (every token in flight) can pass that; the iteration reads the pipeline from the commit."""
        return self.model_copy(update={"pipeline": None})

    def committed(self, checkpoint_key: str, weights_sha256: str, rng: RngState) -> "RunState":
        """This state as committed: with the checkpoint that holds its weights and the driver's RNG."""
        return self.model_copy(update=dict(latest_checkpoint=checkpoint_key, weights_sha256=weights_sha256, rng=rng))
