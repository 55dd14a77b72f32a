"""Round dumps (storage.dump_rounds, engines/runs/round_dump.py): what is written is what is read back, to the
last bit of every log-prob; a missing or damaged dump is refused with the file named; the simulator reads a dump
as the kept trajectories it holds. Replaying a dump through the trainer runs in tests/test_agentic_runs.py."""
from __future__ import annotations

import json

import pytest

from tailflow.engines.data.problem import Problem
from tailflow.engines.env.trajectory import StopReason, TrajectoryOutcome
from tailflow.engines.reward.scoring import ScoredGroup, ScoredResponse
from tailflow.engines.rollout.protocol import Completion, FinishReason
from tailflow.engines.runs.layout import RunError, round_dump_key
from tailflow.engines.runs.round_dump import RoundDump, compact, read_round_dump, round_as_trace, write_round_dump
from tailflow.engines.sim.sources import env_trace
from tailflow.engines.store import LocalStore
from tailflow.engines.track.rollout_trace import TraceError


def trajectory(index: int, turns: int) -> Completion:
    """`turns` turns of 2 model tokens and 1 observation token (none after the last), awkward log-probs."""
    mask = ([True, True, False] * turns)[:-1]
    logprobs = tuple(-1 / (3 + i) if m else 0.0 for i, m in enumerate(mask))  # 1/3, 1/7: not exact in binary
    return Completion(f"p1-{index}", (5, 6, 7), tuple(10 + i for i in range(len(mask))), logprobs, FinishReason.STOP,
                      2, token_weight_versions=(1,) * len(mask), problem_id="p1", index=index,
                      response_mask=tuple(mask),
                      outcome=TrajectoryOutcome(StopReason.DONE, (0.0,) * (turns - 1) + (1.0,),
                                                (0.004,) + (0.25 * (index + 1),) * turns, (2,) * turns))


def dump_of(iteration: int) -> RoundDump:
    multi = ScoredGroup(Problem("p1", "2+3+4", ""), tuple(
        ScoredResponse(trajectory(i, 2 + i), "text", 1.0, True) for i in range(2)))
    single = ScoredGroup(Problem("p2", "1+1", "2"), (
        ScoredResponse(Completion("p2-0", (1, 2), (3, 4), (-0.1, -1e-300), FinishReason.EOS, 2, problem_id="p2"),
                       "2", 1.0, True, exec_s=0.5),))
    return RoundDump(iteration, weight_version=2, max_staleness=None, max_new_tokens=160, groups=[multi, single])


def test_a_dump_reads_back_equal_to_what_was_written(tmp_path):
    store = LocalStore(tmp_path)
    for iteration in (0, 1, 2, 5):
        write_round_dump(store, "run", dump_of(iteration))
    assert read_round_dump(store, "run", 5) == dump_of(5)
    data = json.loads((tmp_path / round_dump_key("run", 1)).read_text())
    assert data["format"] == "tailflow-round/1" and data["groups"][0]["responses"][1]["completion"]["outcome"][
        "stop_reason"] == "done"
    with pytest.raises(RunError, match=r"iter-0003\.json; dumped iterations: 0-2, 5"):
        read_round_dump(store, "run", 3)
    with pytest.raises(RunError, match="dumped none.*storage.dump_rounds"):
        read_round_dump(store, "other", 0)
    assert compact([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"


def test_a_damaged_dump_is_refused_naming_the_file_and_field(tmp_path):
    store = LocalStore(tmp_path)
    write_round_dump(store, "run", dump_of(0))
    path = tmp_path / round_dump_key("run", 0)
    data = json.loads(path.read_text())
    data["groups"][0]["responses"][0]["completion"]["finish_reason"] = "tired"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"iter-0000\.json: field groups\.0\.responses\.0\.completion\.finish_reason"):
        read_round_dump(store, "run", 0)
    path.write_text(json.dumps({**data, "format": "tailflow-round/9"}))
    with pytest.raises(ValueError, match="field format must be 'tailflow-round/1'"):
        read_round_dump(store, "run", 0)


def test_the_simulator_reads_a_dump_as_its_kept_trajectories(tmp_path):
    dump = dump_of(4)
    trace = round_as_trace(dump)
    first, second = trace.prompts[0].responses
    assert [len(first.turns), len(second.turns)] == [2, 3] and first.stop == "done" and first.outcome == "kept"
    assert [t.env_s for t in second.turns] == [0.5, 0.5, 0.5] and first.env_reset_s == 0.004
    assert [(t.model_tokens, t.observation_tokens) for t in second.turns] == [(2, 1), (2, 1), (2, 0)]
    assert [t.reward for t in first.turns] == [0.0, 1.0] and trace.prompts[0].prompt_tokens == 3

    store = LocalStore(tmp_path)
    for iteration in (3, 4):
        write_round_dump(store, "run", dump_of(iteration))
    rounds, where, p0, r0 = env_trace(str(tmp_path / "run" / "rounds"), None, None)
    assert [r.iteration for r in rounds] == [3, 4] and rounds[1] == trace and (p0, r0) == (32, 8)
    rounds, _, p0, _ = env_trace(str(tmp_path / round_dump_key("run", 4)), 16, None)
    assert rounds == [trace] and p0 == 16
    (tmp_path / "run" / "rounds" / "iter-0003.json").write_text(json.dumps({"format": "tailflow-round/1"}))
    with pytest.raises(TraceError, match=r"iter-0003\.json: field"):
        env_trace(str(tmp_path / "run" / "rounds"), None, None)
    with pytest.raises(TraceError, match="no round dumps"):
        (tmp_path / "empty" / "rounds").mkdir(parents=True)
        env_trace(str(tmp_path / "empty" / "rounds"), None, None)
