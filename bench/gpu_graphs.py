"""The `graphs` stage: why a woken engine's greedy tokens differed with CUDA graphs (H200, turns stage, call 3).

What the H200 showed: generating twice without a sleep gives equal tokens;
after `sleep()` and `wake_up()`, with CUDA graphs, 1 of 16 requests differed
from its token 60 of 64; with `cuda_graphs=False` all were equal. Two readings
remain: a numerics change (graphs captured again compute the same step with
other kernels or another order, and a near-tie flipped) or a state bug (some
tensor the step reads is not what it was: a weight, a rope table, the cache).

What this stage runs, on one engine, before and after a sleep and wake:

* the turn: between the sleep and the wake, what the turns stage did there
  (a trainer of the same shape takes a step and offloads), so the wake
  finds the device as it did on the H200;
* the state: every tensor the decode step reads (`runner_tensors`: the
  embedding, final norm, head, rope tables and each layer's fused weights),
  snapshot before the sleep and compared bit for bit after the wake, and
  whether each was re-allocated (a new address: every captured graph that
  reads it had to be captured again);
* the numbers: teacher-forced traces (`gpu_trace.py`, the same inputs every
  time, so logits compare step for step) with the graphs captured first
  (G1), captured again without a sleep (G1b), captured after the wake (G2),
  and eagerly at the same bucket shapes before and after (E1, E2);
* the tokens: `generate()` before the sleep and after the wake, and where a
  token first differs, how close the first run's top two logits were there.

`verdict` reads them in that order: tensors that changed are a state bug; an
eager trace that changed with the same tensors is state outside them; G1 vs
G1b different means capturing again is itself not reproducible (no sleep
needed), bounded by its largest logit difference; only G2 different means
the wake matters to the capture. On a CPU (the dry run) the buckets run
eagerly and every comparison must come out equal.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from gpu_trace import TraceDiff, compare, forced_decode, top2_gap


@dataclass(frozen=True)
class TensorState:
    name: str
    equal_after_wake: bool
    reallocated: bool


@dataclass(frozen=True)
class GraphsResult:
    device: str
    captured_graphs: bool
    tokens_equal_after_wake: bool
    first_difference: tuple[int, int] | None
    """(request, token index) of the first token that differs after the wake; None: all equal."""
    flip_gap: float | None
    """Top-two logit gap of the run before the sleep where the first token differs (a near-tie is small)."""
    trace_reproduces_generate: bool
    """The teacher-forced trace's argmax equals `generate()`'s tokens: the trace runs what the engine runs."""
    states: list[TensorState]
    diffs: list[TraceDiff]
    captured_before: list[tuple[int, int]]
    captured_after: list[tuple[int, int]]

    @property
    def changed_tensors(self) -> list[str]:
        return [s.name for s in self.states if not s.equal_after_wake]

    def diff(self, a: str, b: str) -> TraceDiff:
        return next(d for d in self.diffs if (d.a, d.b) == (a, b))

    @property
    def verdict(self) -> str:
        if self.changed_tensors:
            return f"state: tensors differ after the wake: {', '.join(self.changed_tensors[:8])}"
        if not self.diff("E1", "E2").bitwise_equal:
            return "state: the eager step differs after the wake with equal weights and tables (the KV cache?)"
        recapture, woken = self.diff("G1", "G1b"), self.diff("G1", "G2")
        if not recapture.bitwise_equal:
            return (f"numerics: capturing the same step again changes its logits without any sleep (max "
                    f"{recapture.max_abs:.3g}); the wake only triggers the re-capture")
        if not woken.bitwise_equal:
            return (f"numerics: only the capture after the wake differs (max {woken.max_abs:.3g}), with every "
                    "tensor read equal: something of the wake reaches the capture")
        if not self.tokens_equal_after_wake:
            return "state: every trace is equal but generate() differs: the engine's loop, not the step"
        return "not reproduced: every trace and every token equal"

    def describe(self) -> list[str]:
        lines = [f"CUDA graphs {'captured' if self.captured_graphs else 'not captured (eager buckets)'}; "
                 f"graphs before the sleep {self.captured_before}, after the wake {self.captured_after}",
                 f"tensors the step reads: {len(self.states)}, re-allocated by the wake "
                 f"{sum(s.reallocated for s in self.states)}, changed in value {len(self.changed_tensors)}",
                 f"the trace reproduces generate(): {self.trace_reproduces_generate}"]
        for d in self.diffs:
            lines.append(f"  {d.a:>3} vs {d.b:<3} bitwise equal {str(d.bitwise_equal):5}  max |diff| "
                         f"{d.max_abs:.4g}  first differing step {d.first_step}  argmax flips {d.argmax_differs}")
        lines.append(f"generate() after the wake equals before: {self.tokens_equal_after_wake}"
                     + (f" (first difference: request {self.first_difference[0]}, token {self.first_difference[1]},"
                        f" top-two gap there {self.flip_gap:.4g})" if self.first_difference else ""))
        lines.append(f"RESULT graphs_verdict={self.verdict}")
        return lines

    def to_json(self) -> dict:
        return {**asdict(self), "verdict": self.verdict}


def runner_tensors(runner) -> dict[str, torch.Tensor]:
    """Every tensor a decode step reads besides the KV cache and its own inputs, by name."""
    found = {"embed": runner.embed, "final_norm": runner.final_norm, "lm_head": runner.lm_head,
             "cos": runner.cos, "sin": runner.sin}
    for index, layer in enumerate(runner.layers):
        for field, tensor in asdict_shallow(layer).items():
            if tensor is not None:
                found[f"layers.{index}.{field}"] = tensor
    return found


def asdict_shallow(record) -> dict:
    """A dataclass's fields without `asdict`'s deep copy (these are device tensors)."""
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


def first_difference(before: list[list[int]], after: list[list[int]]) -> tuple[int, int] | None:
    for request, (a, b) in enumerate(zip(before, after)):
        for index, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return request, index
    return None


def measure_graphs(model, device: str, num_slots: int, max_seq_len: int, num_requests: int, prompt_len: int,
                   new_tokens: int, between: Callable[[], object] | None = None, seed: int = 0) -> GraphsResult:
    """`model`: any random model; the engine places it (bf16 on CUDA). The turns stage's shapes reproduce the
    H200 case (64 slots, 2,048 tokens, 16 requests of 16 + 64). `between()` runs while the engine sleeps (the
    kit: a trainer's step and offload, what the turns stage did there when the difference showed); what it
    returns is held until the end, as the turns stage held its trainer."""
    from tailflow.engines.rollout import NativeEngine, Request, SamplingParams

    engine = NativeEngine(model, num_slots=num_slots, max_seq_len=max_seq_len, eos_token_ids=(), device=device,
                          bucketed_decode=True)
    runner = engine.runner
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(1, vocab) for _ in range(prompt_len)] for _ in range(num_requests)]

    def generate(tag: str) -> list[list[int]]:
        requests = [Request(f"{tag}{i}", tuple(p), SamplingParams(temperature=0.0, max_new_tokens=new_tokens))
                    for i, p in enumerate(prompts)]
        done = {c.request_id: list(c.token_ids) for c in engine.generate(requests)}
        return [done[f"{tag}{i}"] for i in range(num_requests)]

    def trace(eager: bool):
        capture = runner.graphs.capture
        runner.graphs.capture = capture and not eager
        try:
            return forced_decode(runner, prompts, new_tokens, forced=before)
        finally:
            runner.graphs.capture = capture

    before = generate("a")
    captured_before = sorted(runner.graphs.captured)
    g1 = trace(eager=False)
    e1 = trace(eager=True)
    runner.graphs.clear()
    g1b = trace(eager=False)
    tensors = runner_tensors(runner)
    snapshot = {name: (t.clone(), t.data_ptr()) for name, t in tensors.items()}
    engine.sleep()
    held = between() if between is not None else None  # noqa: F841 (kept alive through the wake, as in turns)
    engine.wake_up()
    after = generate("b")
    captured_after = sorted(runner.graphs.captured)
    g2 = trace(eager=False)
    e2 = trace(eager=True)
    states = [TensorState(name, torch.equal(snapshot[name][0], tensor), snapshot[name][1] != tensor.data_ptr())
              for name, tensor in runner_tensors(runner).items()]
    where = first_difference(before, after)
    flip_gap = top2_gap(g1.logits[where[1], where[0]]) if where else None
    diffs = [compare("G1", g1, "E1", e1), compare("G1", g1, "G1b", g1b), compare("G1", g1, "G2", g2),
             compare("E1", e1, "E2", e2), compare("G2", g2, "E2", e2)]
    return GraphsResult(device=device, captured_graphs=runner.graphs.capture, tokens_equal_after_wake=where is None,
                        first_difference=where, flip_gap=flip_gap, trace_reproduces_generate=g1.tokens == before,
                        states=states, diffs=diffs, captured_before=captured_before, captured_after=captured_after)
