"""The agentic rollout simulator (engines/sim/agentic.py): the three environment schedules on hand-computable
cases, their order when environments vary, trajectories read from a rollout trace, and `tailflow plan --env-trace`."""
from __future__ import annotations

import random
import re

import pytest
from sim_unit_cost import UnitCost

from tailflow.cli import main
from tailflow.engines.sim.agentic import SCHEDULES, SimTrajectory, SimTurn, compare_schedules, simulate_rollout
from tailflow.engines.sim.sources import env_trace
from tailflow.engines.sim.trace import sample_trajectories, trajectories_from_trace
from tailflow.engines.store import LocalStore
from tailflow.engines.track.rollout_trace import (RolloutTraceLog, TraceError, TracePrompt, TraceResponse, TraceRound,
                                                  TraceTurn, read_trace, write_trace)


def trajectory(*turns: tuple[int, int, float], prompt_tokens: int = 0, reset_s: float = 0.0) -> SimTrajectory:
    return SimTrajectory(tuple(SimTurn(*turn) for turn in turns), prompt_tokens, reset_s)


def walls(trajectories, num_slots: int = 64, cost=None) -> dict[str, float]:
    return {r.schedule: r.wall_s for r in compare_schedules(trajectories, cost or UnitCost(0.0), num_slots)}


def test_one_trajectory_takes_the_hand_sum_under_every_schedule():
    """Reset 0.5 s; prefill the 10-token prompt (0.1 s); 3 decode steps (1 s each); its environment 2 s; prefill
    the 4-token observation (0.04 s); 2 steps; its environment 1 s, and it ends."""
    one = trajectory((3, 4, 2.0), (2, 0, 1.0), prompt_tokens=10, reset_s=0.5)
    for schedule in SCHEDULES:
        result = simulate_rollout([one], schedule, UnitCost(0.01), num_slots=4)
        assert result.wall_s == pytest.approx(0.5 + 0.1 + 3 + 2 + 0.04 + 2 + 1)
        assert result.engine_busy_share == pytest.approx(5.14 / 8.64)
        assert result.max_env_wait_s == pytest.approx(2.0)  # its own environment's longest step


def test_two_trajectories_separate_the_schedules_by_hand():
    """A: a 2-token turn, a 4 s environment step, a 1-token turn. B: five 1-token turns, instant environment.
    lockstep: step 1 (B's turn 1 ends), step 2 (A's turn 1 and B's turn 2 end), the engine waits for A's
    environment until 6, step 3 ends A's turn 2 and B's turn 3, steps 4 and 5 end B: 9 s.
    async: B goes on while A's environment runs (its turns end at 3, 4, 5), A's turn 2 runs 6 -> 7: 7 s.
    turn_sync: B's turn 2 waits for A's turn 1 and its environment (the barrier), so B's turns 2-5 run 6 -> 10."""
    a, b = trajectory((2, 0, 4.0), (1, 0, 0.0)), trajectory(*[(1, 0, 0.0)] * 5)
    assert walls([a, b]) == {"lockstep": 9.0, "turn_sync": 10.0, "async": 7.0}
    waits = {r.schedule: r.max_env_wait_s for r in compare_schedules([a, b], UnitCost(0.0), 4)}
    assert waits == {"lockstep": 4.0, "async": 4.0, "turn_sync": 5.0}  # turn_sync: B held from 1 to 6


def test_one_row_makes_turns_queue():
    """One row: A's turn 1 (2 steps) runs while B's waits for the row. async: B's turn runs 2 -> 4 while A's
    environment (1 s) answers, then A's turn 2 runs 4 -> 5. lockstep and turn_sync: the step after A's turn waits
    for A's environment (2 -> 3) though B could decode, so B runs 3 -> 5 and A's turn 2 5 -> 6."""
    a, b = trajectory((2, 0, 1.0), (1, 0, 0.0)), trajectory((2, 0, 0.0))
    assert walls([a, b], num_slots=1) == {"lockstep": 6.0, "turn_sync": 6.0, "async": 5.0}


def varied(num: int, seed: int, env_scale: float) -> list[SimTrajectory]:
    """Trajectories of 3-8 turns of 5-15 model tokens, heavy-tailed environment steps (LogNormal, median
    `env_scale` seconds, sigma 1.5: bench/agentic.py's shape) and a reset."""
    rng = random.Random(seed)
    return [trajectory(*[(rng.randint(5, 15), rng.randint(2, 9), env_scale * rng.lognormvariate(0, 1.5))
                         for _ in range(rng.randint(3, 8))], prompt_tokens=40, reset_s=env_scale * rng.random())
            for _ in range(num)]


@pytest.mark.parametrize("num_slots", [64, 16])
def test_async_is_fastest_when_environments_vary(num_slots):
    result = walls(varied(48, seed=1, env_scale=2.0), num_slots)
    assert result["async"] <= result["lockstep"] and result["async"] <= result["turn_sync"]
    assert result["lockstep"] / result["async"] > 1.5  # each step waited for the tail of the calls before it


def test_instant_environments_make_lockstep_and_async_equal():
    """With every env_s (and reset) 0, lockstep's wait and async's are both nothing: the same steps, the same
    clock. turn_sync still holds a trajectory's next turn until every trajectory's turn has ended, so it is
    slower when turn lengths differ, and equal when they do not."""
    instant = [trajectory(*[(t.model_tokens, t.observation_tokens, 0.0) for t in x.turns], prompt_tokens=40)
               for x in varied(32, seed=2, env_scale=1.0)]
    for num_slots in (64, 8):
        result = walls(instant, num_slots)
        assert result["lockstep"] == result["async"] < result["turn_sync"]
    alike = [trajectory((5, 3, 0.0), (7, 2, 0.0), (4, 0, 0.0), prompt_tokens=40)] * 12
    result = walls(alike)
    assert result["lockstep"] == result["async"] == result["turn_sync"]


def turns_response(index: int, turns: list[tuple[int, int, float]], stop: str = "done") -> TraceResponse:
    traced = tuple(TraceTurn(0.0, env_s, model, observation) for model, observation, env_s in turns)
    length = sum(model + observation for model, observation, _ in turns)
    outcome = "aborted" if stop == "abort" else "kept"
    return TraceResponse(index, length, "abort" if stop == "abort" else "stop", None, 0, outcome, stop=stop,
                         env_reset_s=0.25, turns=traced)


AGENTIC_ROUND = TraceRound(0, "sync", 64, 1.5, (
    TracePrompt("env7-train-0", 12, (turns_response(0, [(4, 2, 0.02), (3, 0, 0.5)]),
                                     turns_response(1, [(5, 1, 0.01)]),
                                     turns_response(2, [(2, 0, 0.0)], stop="abort"))),))


def test_trajectories_from_a_written_trace(tmp_path):
    path = tmp_path / "rollout_trace.jsonl"
    write_trace(path, [AGENTIC_ROUND])
    trajectories = trajectories_from_trace(read_trace(path), str(path))
    assert trajectories == [trajectory((4, 2, 0.02), (3, 0, 0.5), prompt_tokens=12, reset_s=0.25),
                            trajectory((5, 1, 0.01), prompt_tokens=12, reset_s=0.25)]  # the aborted one left out
    drawn = sample_trajectories(trajectories, 50, seed=3)
    assert drawn == sample_trajectories(trajectories, 50, seed=3) and set(drawn) == set(trajectories)
    # a run folder reads the run's log, with (P0, R0) from its config when it has one
    log = RolloutTraceLog(LocalStore(tmp_path / "store"), "run-a")
    log.append(AGENTIC_ROUND)
    rounds, where, p0, r0 = env_trace(str(tmp_path / "store" / "run-a"), None, 4)
    assert (rounds, p0, r0) == ([AGENTIC_ROUND], 32, 4) and where.endswith("run-a/rollout_trace.jsonl")


def test_a_single_turn_trace_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "single.jsonl"
    write_trace(path, [TraceRound(0, "sync", 64, None, (
        TracePrompt("q0", 12, (TraceResponse(0, 30, "eos", 30, 0, "kept"),)),))])
    with pytest.raises(TraceError, match=f"^{path}: no multi-turn trajectories"):
        trajectories_from_trace(read_trace(path), str(path))


def test_plan_env_trace_prints_the_three_schedules(tmp_path, capsys):
    path = tmp_path / "rollout_trace.jsonl"
    write_trace(path, [AGENTIC_ROUND])
    code = main(["plan", "--env-trace", str(path), "--gpus", "2", "--model", "qwen2.5-7b", "--hardware", "h100",
                 "--prompts-per-step", "4", "--responses", "4"])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    assert stdout.startswith("SIMULATED agentic rollout: 16 trajectories")
    rows = [line.split()[0] for line in stdout.splitlines() if re.match(r"\w+ +[\d.]+ +[\d.]+ +\d+% ", line)]
    assert rows == list(SCHEDULES)
    assert "async / lockstep:" in stdout and "plan_heatmap" not in stdout  # the table only: no search without lengths
    single = tmp_path / "single.jsonl"
    write_trace(single, [TraceRound(0, "sync", 64, None, (TracePrompt("q0", 12, (
        TraceResponse(0, 30, "eos", 30, 0, "kept"),)),))])
    code = main(["plan", "--env-trace", str(single), "--gpus", "2", "--model", "qwen2.5-7b"])
    err = capsys.readouterr().err
    assert code == 2 and str(single) in err and len(err.strip().splitlines()) == 1
