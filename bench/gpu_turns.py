"""Colocated turns on one GPU: does the engine's sleep and the trainer's offload really give memory back, and
what does a turn cost?

One native engine and one `PolicyTrainer` (world size 1) share the device, as
trainer rank i and rollout worker i do in a colocated `cluster.device: gpu`
run. The sequence is a run's: the engine generates, sleeps, the trainer steps
(its AdamW state appears), offloads, the engine wakes and generates again,
and the trainer steps once more from host memory. Reported: the device
memory allocated after each event (`torch.cuda.memory_allocated`; None on a
CPU, where there is nothing to free), the seconds each move takes, and
whether the woken engine's greedy tokens equal those before the sleep.
"""
from __future__ import annotations

import random
import tempfile
import time
from dataclasses import dataclass, field

import torch

from tailflow.config import TrainConfig
from tailflow.engines.rollout import NativeEngine, Request, SamplingParams
from tailflow.engines.train.batch import TrainSample, count_response_tokens
from tailflow.engines.train.trainer import PolicyTrainer


@dataclass
class TurnsResult:
    device: str
    allocated_mib: dict[str, float | None] = field(default_factory=dict)
    """Device memory allocated after each event, in order (None on a CPU)."""
    seconds: dict[str, float] = field(default_factory=dict)
    same_tokens_after_wake: bool = False

    def freed_mib(self, before: str, after: str) -> float | None:
        a, b = self.allocated_mib.get(before), self.allocated_mib.get(after)
        return None if a is None or b is None else a - b

    def describe(self) -> list[str]:
        lines = [f"{'after':<22}{'allocated MiB':>14}"]
        for event, mib in self.allocated_mib.items():
            lines.append(f"{event:<22}{'-' if mib is None else f'{mib:14.0f}':>14}")
        lines.append("seconds: " + ", ".join(f"{name} {s:.3f}" for name, s in self.seconds.items()))
        for what, before, after in (("engine sleep", "generate", "engine sleep"),
                                    ("trainer offload", "trainer step", "trainer offload")):
            freed = self.freed_mib(before, after)
            lines.append(f"{what} freed: {'- (no device memory here)' if freed is None else f'{freed:.0f} MiB'}")
        lines.append(f"woken engine's greedy tokens equal those before the sleep: {self.same_tokens_after_wake}")
        return lines


def measure_turns(model, device: str, num_slots: int, max_seq_len: int, num_requests: int, max_new_tokens: int,
                  synchronize) -> TurnsResult:
    """`model` (fp32, on the CPU: the trainer loads it from a directory in fp32, the engine rounds its own copy
    to its dtype) is saved once and loaded by both."""
    result = TurnsResult(device)

    def mark(event: str) -> None:
        synchronize()
        result.allocated_mib[event] = (torch.cuda.memory_allocated() / 2**20
                                       if torch.device(device).type == "cuda" else None)

    def timed(name: str, action):
        started = time.perf_counter()
        value = action()
        synchronize()
        result.seconds[name] = time.perf_counter() - started
        return value

    vocab = model.config.vocab_size
    rng = random.Random(0)
    requests = [Request(f"r{i}", tuple(rng.randrange(1, vocab) for _ in range(16)),
                        SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)) for i in range(num_requests)]
    samples = [TrainSample(tuple(rng.randrange(1, vocab) for _ in range(16)),
                           tuple(rng.randrange(1, vocab) for _ in range(max_new_tokens)), rng.choice([-1.0, 1.0]))
               for _ in range(num_requests)]
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        mark("start")
        engine = NativeEngine.from_pretrained(directory, num_slots, max_seq_len, eos_token_ids=(), device=device)
        mark("engine built")
        trainer = PolicyTrainer(directory, TrainConfig(lr=1e-6, max_tokens_per_micro_batch=4096))
        mark("trainer built")
    before = sorted(timed("generate", lambda: engine.generate(requests)), key=lambda c: c.request_id)
    mark("generate")
    timed("engine sleep", engine.sleep)
    mark("engine sleep")
    timed("trainer step", lambda: trainer.train_step(samples, count_response_tokens(samples)))
    mark("trainer step")
    timed("trainer offload", trainer.offload)
    mark("trainer offload")
    timed("engine wake", engine.wake_up)
    mark("engine wake")
    after = sorted(engine.generate([Request(f"again-{r.request_id}", r.prompt_token_ids, r.params)
                                    for r in requests]), key=lambda c: c.request_id)
    result.same_tokens_after_wake = [c.token_ids for c in before] == [c.token_ids for c in after]
    timed("engine sleep again", engine.sleep)
    timed("trainer step from host", lambda: trainer.train_step(samples, count_response_tokens(samples)))
    mark("trainer back, stepped")
    return result
