"""`<run>/rounds/iter-NNNN.json` (storage.dump_rounds): what an iteration's optimizer step trained on.

One JSON object per iteration, written by the train task before the step starts:

    {"format": "tailflow-round/1", "iteration": 3, "weight_version": 3, "max_staleness": 0,
     "max_new_tokens": 160, "groups": [{"problem": {...}, "responses": [{"completion": {...}, "text": "...",
     "reward": 1.0, "correct": true, "exec_s": null}, ...]}, ...]}

`groups` are the `ScoredGroup`s as the trainer received them (launch order), each completion whole: prompt and
response tokens, the behaviour log-probs, the weight versions, a trajectory's response mask and outcome (stop
reason, turn rewards, each environment step's seconds, each turn's model tokens). `weight_version` is the
trainer's version when the step began and `max_staleness` the bound the step checked its tokens against (null:
none). With the run's config and the checkpoint before the iteration, that is everything the step is a function
of: `tailflow replay` (driver/replay.py) runs it again, and `round_as_trace` hands the trajectories to the
simulator (`tailflow plan --env-trace`).

The records are written and read by pydantic's `TypeAdapter` over the dataclasses themselves, so a field added to
`Completion` is dumped without a change here. Floats are written in their shortest round-trip form: a read dump
equals what was written (tests/test_round_dump.py). An iteration run again (an actor died, a resumed run)
overwrites its file.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from tailflow.engines.reward.scoring import ScoredGroup
from tailflow.engines.runs.layout import RunError, round_dump_key
from tailflow.engines.track.rollout_trace import TracePrompt, TraceRound, traced_response

FORMAT = "tailflow-round/1"
DUMP_NAME = re.compile(r"iter-(\d{4,})\.json")


@dataclass(frozen=True)
class RoundDump:
    iteration: int
    weight_version: int
    """The trainer's weight version when the step began (the step makes it one newer)."""
    max_staleness: int | None
    """How many versions older than `weight_version` a trained token could be (None: no bound)."""
    max_new_tokens: int
    """The longest response the run allowed (a trajectory's: env.trajectory_max_tokens)."""
    groups: list[ScoredGroup]
    format: str = FORMAT


DUMP_ADAPTER = TypeAdapter(RoundDump)


def write_round_dump(store: Any, run_id: str, dump: RoundDump) -> None:
    store.write_bytes(round_dump_key(run_id, dump.iteration), DUMP_ADAPTER.dump_json(dump))


def parse_round_dump(data: bytes, source: str) -> RoundDump:
    """A dump's bytes as written; a ValueError naming `source` and the first bad field otherwise."""
    try:
        tree = json.loads(data)
    except json.JSONDecodeError as error:
        raise ValueError(f"{source}: not JSON ({error.msg})") from None
    if not isinstance(tree, dict) or tree.get("format") != FORMAT:
        found = tree.get("format") if isinstance(tree, dict) else None
        raise ValueError(f"{source}: field format must be {FORMAT!r}, not {found!r}")
    try:
        return DUMP_ADAPTER.validate_python(tree)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"{source}: field {where}: {first['msg']}") from None


def read_round_dump(store: Any, run_id: str, iteration: int) -> RoundDump:
    """Iteration `iteration`'s dump; a RunError naming the file and the iterations that were dumped if it is absent."""
    key = round_dump_key(run_id, iteration)
    try:
        data = store.read_bytes(key)
    except FileNotFoundError:
        dumped = dumped_iterations(store, run_id)
        have = (f"dumped iterations: {compact(dumped)}" if dumped else
                "the run dumped none (set storage.dump_rounds: true before it runs)")
        raise RunError(f"no round dump {store.uri(key)}; {have}") from None
    return parse_round_dump(data, store.uri(key))


def dumped_iterations(store: Any, run_id: str) -> list[int]:
    folder = round_dump_key(run_id, 0).rpartition("/")[0]
    return sorted(int(match.group(1)) for name in store.list_dir(folder) if (match := DUMP_NAME.fullmatch(name)))


def compact(iterations: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    spans: list[list[int]] = []
    for number in iterations:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def round_as_trace(dump: RoundDump) -> TraceRound:
    """The dump's trajectories as a rollout-trace round of kept responses: what the simulator samples from."""
    prompts = tuple(
        TracePrompt(group.problem.problem_id, len(group.responses[0].completion.prompt_token_ids) if group.responses
                    else 0, tuple(traced_response(r.completion.index, r.completion, None, "kept", (None, None))
                                  for r in group.responses))
        for group in dump.groups)
    return TraceRound(dump.iteration, "dump", dump.max_new_tokens, None, prompts)
