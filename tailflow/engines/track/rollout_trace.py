"""`rollout_trace.jsonl`: what every round launched and how each response ended, one JSON line a round.

    {"format": "tailflow-rollout-trace/1", "iteration": 3, "round": "short", "max_new_tokens": 720,
     "generate_s": 2.41,
     "prompts": [{"problem_id": "arith-17", "prompt_tokens": 40,
                  "responses": [{"index": 0, "length": 17, "finish": "eos", "step": 22, "worker": 0,
                                 "outcome": "kept"}, ...]}, ...]}

A response a long round continued from where the round that deferred its
prompt left it (`tail.continue_deferred`) has `"continued": n`, the tokens it
carried over (its `length` counts them; a carried response that had finished
has `step` null); a response that started in its own round has no such key.

A multi-turn trajectory (an agentic run, `env` set) also has `"stop"`, its `StopReason` (`done`, `max_turns`,
..., `abort`), `"env_reset_s"`, the seconds its environment's reset took, and `"turns"`, one entry a turn:

    {"reward": 0.0, "env_s": 0.003, "model_tokens": 12, "observation_tokens": 9}

`env_s` is the environment's step after that turn (0.0 where the environment never saw it: a cut or aborted
turn); `model_tokens` and `observation_tokens` split the trajectory's `length`, which counts both (both 0 in the
one case its mask cannot tell the turns apart: a turn without a model token). A single-turn response has none of
these keys.

`outcome` is `kept` (trained on), `finished` (ended by itself but not trained:
its prompt was deferred, or it finished after its prompt had R0) or `aborted`
(discarded by the rule). An aborted response with `finish` `abort` was stopped
before it ended: `length` is what it had generated, a lower bound on what it
would have, and `step` is null; one with another `finish` did end, in the same
poll as the abort that discarded it, and its length is exact. `step` is the decode step of the round
(1 = its first, counted on the engine that ran it) at which it finished, and
`worker` that engine. `generate_s` is the
round's measured rollout time (null when unknown). Every run writes it (`storage.rollout_trace`) through the
artifact store, in every mode, from the round the rollout pipeline hands over (`trace_of`); `tailflow plan`
draws from its per-prompt lengths (engines/sim/trace.py: `pools_from_trace`), and bench/research/replay.py
replays it round by round (`TraceLengths`).

A row is written when the round is taken, before its iteration commits; an iteration that is run again (an
actor died) appends its row again, so readers keep the last row of each iteration, and a resumed run drops rows
past its commit, as the metrics log does.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from tailflow.engines.rollout.protocol import Completion, FinishReason
from tailflow.engines.runs.layout import rollout_trace_key
from tailflow.engines.store import ArtifactStore
from tailflow.engines.tail.taken import TakenRound
from tailflow.engines.track.env_metrics import turn_tokens

FORMAT = "tailflow-rollout-trace/1"
OUTCOMES = ("kept", "finished", "aborted")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, line and field."""


@dataclass(frozen=True)
class TraceTurn:
    """One model turn of a multi-turn trajectory and the environment's answer."""

    reward: float
    env_s: float
    """Seconds of the environment's step after this turn (0.0: it never saw the turn)."""
    model_tokens: int
    observation_tokens: int


@dataclass(frozen=True)
class TraceResponse:
    index: int
    length: int
    finish: str
    """eos, stop, length or abort."""
    step: int | None
    worker: int | None
    outcome: str
    continued: int = 0
    """Tokens carried from the round that deferred its prompt (tail.continue_deferred); 0: started here."""
    stop: str | None = None
    """A multi-turn trajectory's stop reason (`env/trajectory.StopReason`); None: a single-turn response."""
    env_reset_s: float | None = None
    turns: tuple[TraceTurn, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: `continued` only where it is not 0, the trajectory's keys only for a trajectory (rows of
        runs without them stay as they were)."""
        row = asdict(self)
        if not self.continued:
            del row["continued"]
        if self.stop is None:
            del row["stop"], row["env_reset_s"], row["turns"]
        return row


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
        row = {"format": FORMAT, **asdict(self)}
        row["prompts"] = [{**asdict(p), "responses": [r.to_dict() for r in p.responses]} for p in self.prompts]
        return json.dumps(row, separators=(",", ":"))


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
                                    None if r.get("worker") is None else int(r["worker"]), str(r["outcome"]),
                                    int(r.get("continued", 0)), None if r.get("stop") is None else str(r["stop"]),
                                    None if r.get("env_reset_s") is None else float(r["env_reset_s"]),
                                    tuple(TraceTurn(float(t["reward"]), float(t["env_s"]), int(t["model_tokens"]),
                                                    int(t["observation_tokens"])) for t in r.get("turns", ())))
                      for r in data["responses"])
    for response in responses:
        if response.outcome not in OUTCOMES:
            raise ValueError(f"outcome {response.outcome!r} of {data['problem_id']}#{response.index} is not one of "
                             f"{', '.join(OUTCOMES)}")
        FinishReason(response.finish)  # raises ValueError naming the bad value
    return TracePrompt(str(data["problem_id"]), int(data["prompt_tokens"]), responses)


class RolloutTraceLog:
    """A run's `rollout_trace.jsonl` in the artifact store (local or S3): appended each iteration."""

    def __init__(self, store: ArtifactStore, run_id: str) -> None:
        self.store = store
        self.key = rollout_trace_key(run_id)

    def append(self, trace_round: TraceRound) -> None:
        self.store.append_line(self.key, trace_round.to_line())

    def rounds(self) -> list[TraceRound]:
        """Every iteration's last row, in iteration order (FileNotFoundError when the run wrote none)."""
        text = self.store.read_text(self.key)
        last = {r.iteration: r for r in parse_trace(text, self.store.uri(self.key))}
        return [last[iteration] for iteration in sorted(last)]

    def keep_committed(self, num_iterations: int) -> None:
        """On resume: drop rows of iterations >= `num_iterations` (rolled out, never committed)."""
        if not self.store.exists(self.key):
            return
        kept = [r for r in self.rounds() if r.iteration < num_iterations]
        self.store.write_text(self.key, "".join(r.to_line() + "\n" for r in kept))


def trace_of(taken: TakenRound, max_new_tokens: int) -> TraceRound:
    """The trace row of a round the pipeline handed over: every launched response, how it ended."""
    kept = {c.request_id for _, completions in taken.result.completed for c in completions}
    aborted = set(taken.result.aborted_request_ids)
    finished = {c.request_id: c for c in taken.finished}
    partials = {c.request_id: c for c in taken.aborted}
    prompts: dict[str, list[TraceResponse]] = {}
    prompt_tokens: dict[str, int] = {}
    for request in taken.requests:
        prompt_tokens[request.problem_id] = len(request.prompt_token_ids)
        rid = request.request_id
        outcome = "aborted" if rid in aborted else "kept" if rid in kept else "finished"
        response = traced_response(request.index, finished.get(rid), partials.get(rid), outcome,
                                   taken.finish_steps.get(rid, (None, None)))
        if rid in taken.continued:
            response = replace(response, continued=taken.continued[rid])
        prompts.setdefault(request.problem_id, []).append(response)
    return TraceRound(taken.iteration, taken.planned.plan.kind.value, max_new_tokens, taken.stats.seconds,
                      tuple(TracePrompt(p, prompt_tokens[p], tuple(r)) for p, r in prompts.items()))


def traced_response(index: int, finished: Completion | None, partial: Completion | None, outcome: str,
                    step: tuple[int | None, int | None]) -> TraceResponse:
    if finished is None:  # stopped by the rule before it finished (or lost): its length is a lower bound
        response = TraceResponse(index, len(partial.token_ids) if partial else 0, "abort", None, None, "aborted")
        return with_turns(response, partial)
    # finished: kept, not kept, or finished in the same poll as the abort that discarded it (its length is exact)
    worker, engine_step = step
    response = TraceResponse(index, len(finished.token_ids), finished.finish_reason.value, engine_step, worker,
                             outcome)
    return with_turns(response, finished)


def with_turns(response: TraceResponse, completion: Completion | None) -> TraceResponse:
    """A trajectory's response with its stop reason and turns; a single-turn one (no outcome) as it is."""
    if completion is None or completion.outcome is None:
        return response
    outcome = completion.outcome
    tokens = turn_tokens(completion)
    if len(tokens) != outcome.num_turns:  # a turn without a model token hides in the mask: counts unknown
        tokens = [None] * outcome.num_turns
    steps = outcome.env_step_s[1:]
    turns = tuple(TraceTurn(reward, steps[i] if i < len(steps) else 0.0,
                            t.model if t else 0, t.observation if t else 0)
                  for i, (reward, t) in enumerate(zip(outcome.turn_rewards, tokens)))
    return replace(response, stop=outcome.stop_reason.value,
                   env_reset_s=outcome.env_step_s[0] if outcome.env_step_s else 0.0, turns=turns)
