"""`rollout_trace.jsonl`: what every round launched and how each response ended, one JSON line a round.

    {"format": "tailflow-rollout-trace/1", "iteration": 3, "round": "short", "max_new_tokens": 720,
     "generate_s": 2.41,
     "prompts": [{"problem_id": "arith-17", "prompt_tokens": 40,
                  "responses": [{"index": 0, "length": 17, "finish": "eos", "step": 22, "worker": 0,
                                 "outcome": "kept"}, ...]}, ...]}

`outcome` is `kept` (trained on), `finished` (ended by itself but not trained:
its prompt was deferred, or it finished after its prompt had R0) or `aborted`
(discarded by the rule). An aborted response with `finish` `abort` was stopped
before it ended: `length` is what it had generated, a lower bound on what it
would have, and `step` is null; one with another `finish` did end, in the same
poll as the abort that discarded it, and its length is exact. `step` is the decode step of the round
(1 = its first, counted on the engine that ran it) at which it finished, and
`worker` that engine. `generate_s` is the
round's measured rollout time (null when unknown). Runs write it through the
artifact store; the simulator replays it (`TraceLengths`) or draws from its
per-prompt lengths (`pools_from_trace`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from tailflow.engines.rollout.protocol import FinishReason, Request
from tailflow.engines.sim.lengths import PromptPoolLengths, ResponseLength

FORMAT = "tailflow-rollout-trace/1"
OUTCOMES = ("kept", "finished", "aborted")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, line and field."""


@dataclass(frozen=True)
class TraceResponse:
    index: int
    length: int
    finish: str
    """eos, stop, length or abort."""
    step: int | None
    worker: int | None
    outcome: str


@dataclass(frozen=True)
class TracePrompt:
    problem_id: str
    prompt_tokens: int
    responses: tuple[TraceResponse, ...]


@dataclass(frozen=True)
class TraceRound:
    iteration: int
    round: str
    """short, long or sync."""
    max_new_tokens: int
    generate_s: float | None
    prompts: tuple[TracePrompt, ...]

    def to_line(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, separators=(",", ":"))

    def request_ids(self) -> list[str]:
        return [f"{p.problem_id}#{r.index}" for p in self.prompts for r in p.responses]


def write_trace(path: str | Path, rounds: Iterable[TraceRound]) -> None:
    Path(path).write_text("".join(r.to_line() + "\n" for r in rounds))


def parse_trace(text: str, source: str) -> list[TraceRound]:
    rounds = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            rounds.append(parse_round(line, f"{source}:{number}"))
    if not rounds:
        raise TraceError(f"{source}: no rounds (empty trace)")
    return rounds


def read_trace(path: str | Path) -> list[TraceRound]:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    return parse_trace(text, str(path))


def parse_round(line: str, where: str) -> TraceRound:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise TraceError(f"{where}: not JSON ({error.msg})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TraceError(f"{where}: field 'format' must be {FORMAT!r}")
    try:
        prompts = tuple(parse_prompt(p) for p in data["prompts"])
        return TraceRound(int(data["iteration"]), str(data["round"]), int(data["max_new_tokens"]),
                          None if data.get("generate_s") is None else float(data["generate_s"]), prompts)
    except KeyError as error:
        raise TraceError(f"{where}: missing field {error.args[0]!r}") from None
    except (TypeError, ValueError) as error:
        raise TraceError(f"{where}: bad value ({error})") from None


def parse_prompt(data: dict[str, Any]) -> TracePrompt:
    responses = tuple(TraceResponse(int(r["index"]), int(r["length"]), str(r["finish"]),
                                    None if r.get("step") is None else int(r["step"]),
                                    None if r.get("worker") is None else int(r["worker"]), str(r["outcome"]))
                      for r in data["responses"])
    for response in responses:
        if response.outcome not in OUTCOMES:
            raise ValueError(f"outcome {response.outcome!r} of {data['problem_id']}#{response.index} is not one of "
                             f"{', '.join(OUTCOMES)}")
        FinishReason(response.finish)  # raises ValueError naming the bad value
    return TracePrompt(str(data["problem_id"]), int(data["prompt_tokens"]), responses)


def finished_lengths(rounds: Sequence[TraceRound]) -> dict[str, list[int]]:
    """Per prompt, the lengths of its responses that ended by themselves (any round)."""
    pools: dict[str, list[int]] = {}
    for trace_round in rounds:
        for prompt in trace_round.prompts:
            pools.setdefault(prompt.problem_id, []).extend(
                r.length for r in prompt.responses if r.finish != "abort")
    return pools


def imputed_length(partial: int, prompt_lengths: Sequence[int], max_new_tokens: int) -> ResponseLength:
    """An aborted response's length is censored: the prompt's longest finished response if that is longer
    than the partial, else the cap (the rule stopped it, so all we know is that it was still going)."""
    longest = max(prompt_lengths, default=0)
    if longest > partial and longest < max_new_tokens:
        return ResponseLength(longest, FinishReason.EOS)
    return ResponseLength(max_new_tokens, FinishReason.LENGTH)


class TraceLengths:
    """Replay: request `<problem>#<k>` of round `iteration` gets exactly the length it had in the trace."""

    def __init__(self, rounds: Sequence[TraceRound]) -> None:
        self.rounds = {r.iteration: r for r in rounds}
        self.max_new_tokens = max(r.max_new_tokens for r in rounds)
        pools = finished_lengths(rounds)
        self._lengths: dict[tuple[int, str], ResponseLength] = {}
        self._prompt_tokens: dict[str, int] = {}
        for trace_round in rounds:
            for prompt in trace_round.prompts:
                self._prompt_tokens[prompt.problem_id] = prompt.prompt_tokens
                for r in prompt.responses:
                    length = (imputed_length(r.length, pools.get(prompt.problem_id, []), trace_round.max_new_tokens)
                              if r.finish == "abort" else ResponseLength(r.length, FinishReason(r.finish)))
                    self._lengths[trace_round.iteration, f"{prompt.problem_id}#{r.index}"] = length
        self.iteration = min(self.rounds)

    def problem_ids(self) -> list[str]:
        return list(self._prompt_tokens)

    def prompt_tokens(self, problem_id: str) -> int:
        return self._prompt_tokens[problem_id]

    def begin_round(self, iteration: int) -> None:
        if iteration not in self.rounds:
            raise KeyError(f"the trace has no round {iteration}")
        self.iteration = iteration

    def length_of(self, request: Request) -> ResponseLength:
        try:
            return self._lengths[self.iteration, request.request_id]
        except KeyError:
            raise KeyError(f"round {self.iteration} of the trace never launched {request.request_id!r}") from None


def pools_from_trace(rounds: Sequence[TraceRound], seed: int = 0, source: str = "trace") -> PromptPoolLengths:
    """Per-prompt pools of finished lengths; aborted (censored) responses are left out, and so are prompts that
    have only those. A deferred prompt's long round finishes all its responses, so its long tail is in."""
    pools = {p: lengths for p, lengths in finished_lengths(rounds).items() if lengths}
    prompt_tokens = {p.problem_id: p.prompt_tokens for r in rounds for p in r.prompts}
    return PromptPoolLengths(pools, prompt_tokens, max(r.max_new_tokens for r in rounds), seed, source)

