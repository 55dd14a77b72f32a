"""What an agentic run's metrics and rollout trace say of its trajectories (no Ray, no model: Completions built
by hand with their masks and outcomes)."""
import json
from dataclasses import replace

import pytest

from tailflow.engines.env.trajectory import StopReason, TrajectoryOutcome
from tailflow.engines.env.worker import EnvCounters
from tailflow.engines.rollout.protocol import Completion, FinishReason
from tailflow.engines.track.env_metrics import (
    counters_delta,
    env_metrics,
    model_token_count,
    observation_token_count,
    turn_tokens,
)
from tailflow.engines.track.rollout_trace import FORMAT, TracePrompt, TraceRound, parse_round, traced_response


def trajectory(rid: str, turns: list[tuple[int, int]], stop: StopReason, rewards: list[float],
               steps: list[float]) -> Completion:
    """`turns`: (model tokens, observation tokens) each; `steps`: the reset's seconds, then each step's."""
    mask = tuple(m for model, obs in turns for m in (True,) * model + (False,) * obs)
    finish = FinishReason.ABORT if stop is StopReason.ABORT else FinishReason.STOP
    return Completion(rid, (1, 2), tuple(range(len(mask))), (0.0,) * len(mask), finish, 0,
                      problem_id="p", response_mask=mask,
                      outcome=TrajectoryOutcome(stop, tuple(rewards), tuple(steps)))


def single(rid: str, length: int) -> Completion:
    return Completion(rid, (1, 2), tuple(range(length)), (0.0,) * length, FinishReason.EOS, 0, problem_id="p")


DONE = trajectory("a", [(3, 4), (2, 0)], StopReason.DONE, [0.0, 1.0], [0.01, 0.02, 0.04])
MAX_TURNS = trajectory("b", [(1, 2), (1, 2), (5, 0)], StopReason.MAX_TURNS, [0.0, 0.0, 0.0], [0.0, 0.1, 0.1, 0.1])
FAILED = trajectory("c", [(4, 0)], StopReason.ENV_ERROR, [0.5], [0.0, 0.3])
ABORTED = trajectory("d", [(2, 3), (6, 0)], StopReason.ABORT, [0.0, 0.0], [0.0, 0.5])


def test_token_counts_split_the_model_from_the_environment():
    assert (model_token_count(DONE), observation_token_count(DONE)) == (5, 4)
    assert (model_token_count(single("s", 7)), observation_token_count(single("s", 7))) == (7, 0)
    assert [(t.model, t.observation) for t in turn_tokens(MAX_TURNS)] == [(1, 2), (1, 2), (5, 0)]
    assert turn_tokens(single("s", 3)) == []


def test_env_metrics_over_kept_and_ended_trajectories():
    counters = EnvCounters(failures={"env_error": 1, "timeout": 2}, invalid_actions=3, cut_observations=1)
    row = env_metrics([DONE, MAX_TURNS, FAILED], [DONE, MAX_TURNS, FAILED, ABORTED], counters)
    assert row["env/turns_mean"] == pytest.approx(2.0) and row["env/turns_max"] == 3
    assert {f"env/stop/{r.value}" for r in StopReason} <= row.keys()
    assert {f"env/stop_all/{r.value}" for r in StopReason} <= row.keys()
    assert (row["env/stop/done"], row["env/stop/max_turns"], row["env/stop/env_error"], row["env/stop/abort"]) \
        == (1, 1, 1, 0)
    assert row["env/stop_all/abort"] == 1 and sum(v for k, v in row.items() if k.startswith("env/stop_all/")) == 4
    assert row["env/dropped"] == 1  # the environment's failure is not trained
    assert row["env/groups_dropped"] == 0  # all three are task "p": two trained
    lonely = env_metrics([DONE, FAILED, replace(MAX_TURNS, problem_id="q")], [], counters)
    assert lonely["env/groups_dropped"] == 2  # p: one trained of two; q: one trajectory
    assert row["env/reward_mean"] == pytest.approx(0.5)  # over the trained ones: (1 + 0) / 2
    steps = [0.02, 0.04, 0.1, 0.1, 0.1, 0.3, 0.5]  # every step of every trajectory that ended, resets excluded
    assert row["time/env_step_s_mean"] == pytest.approx(sum(steps) / len(steps))
    assert (row["env/failures"], row["env/invalid_actions"], row["env/cut_observations"]) == (3, 3, 1)
    assert row["token/observation_length/mean"] == pytest.approx((4 + 4 + 0) / 3)


def test_env_metrics_of_a_round_without_trajectories_are_zeros():
    row = env_metrics([], [], EnvCounters())
    assert row["env/turns_mean"] == 0.0 and row["env/turns_max"] == 0 and row["time/env_step_s_mean"] == 0.0
    assert row["env/reward_mean"] == 0.0 and row["token/observation_length/mean"] == 0.0


def test_counters_delta_is_the_iteration_and_never_negative():
    before = EnvCounters(resets=4, steps=10, failures={"timeout": 1}, invalid_actions=2, cut_observations=1,
                         step_seconds=1.0)
    now = EnvCounters(resets=6, steps=15, failures={"timeout": 1, "env_error": 2}, invalid_actions=5,
                      cut_observations=1, step_seconds=1.5, peak_concurrent_calls=3, active_environments=2)
    delta = counters_delta(now, before)
    assert (delta.resets, delta.steps, delta.failures, delta.invalid_actions, delta.cut_observations) \
        == (2, 5, {"env_error": 2}, 3, 0)
    assert delta.step_seconds == pytest.approx(0.5)
    restarted = counters_delta(EnvCounters(invalid_actions=1), before)  # a worker started again counts from 0
    assert restarted.invalid_actions == 0 and restarted.resets == 0


def test_trace_records_a_trajectorys_turns_and_round_trips():
    kept = traced_response(0, DONE, None, "kept", (0, 7))
    aborted = traced_response(1, None, ABORTED, "aborted", (None, None))
    plain = traced_response(2, single("s", 5), None, "kept", (0, 3))
    assert kept.stop == "done" and kept.env_reset_s == pytest.approx(0.01) and kept.length == 9
    assert [(t.reward, t.env_s, t.model_tokens, t.observation_tokens) for t in kept.turns] \
        == [(0.0, 0.02, 3, 4), (1.0, 0.04, 2, 0)]
    assert aborted.stop == "abort" and [t.model_tokens for t in aborted.turns] == [2, 6]
    assert aborted.turns[1].env_s == 0.0  # the aborted turn never reached its environment
    line = TraceRound(0, "sync", 64, 1.0, (TracePrompt("p", 2, (kept, aborted, plain)),)).to_line()
    responses = json.loads(line)["prompts"][0]["responses"]
    assert responses[0]["turns"][0] == {"reward": 0.0, "env_s": 0.02, "model_tokens": 3, "observation_tokens": 4}
    assert {"stop", "turns", "env_reset_s"}.isdisjoint(responses[2])  # a single-turn response's keys as before
    assert parse_round(line, "t").prompts[0].responses == (kept, aborted, plain)
    assert json.loads(line)["format"] == FORMAT


def agentic_row(iteration: int) -> dict:
    """A single-turn row's keys the summaries read, then an agentic round's env/* keys."""
    row = {"iteration": iteration, "time/step_total": 2.0, "time/step_generate": 1.0, "time/step_train": 0.5,
           "reward/mean": 0.25, "token/response_length/mean": 12.0, "token/response_length/max": 20}
    return row | env_metrics([DONE, MAX_TURNS, FAILED], [DONE, MAX_TURNS, FAILED, ABORTED],
                             EnvCounters(failures={"timeout": 1}))


def single_turn_row(iteration: int) -> dict:
    return {key: value for key, value in agentic_row(iteration).items()
            if not key.startswith("env/") and key != "token/observation_length/mean"}


def test_console_line_and_closing_summary_show_turns_only_for_agentic_runs():
    from tailflow.cli import environment_line
    from tailflow.driver.run_log import progress_line
    from tailflow.flows.training import env_summary

    assert "turns mean 2.0" in progress_line(agentic_row(0))
    assert "turns" not in progress_line(single_turn_row(0))
    summary = env_summary([agentic_row(0), agentic_row(1)])
    assert summary.turns_mean == pytest.approx(2.0) and summary.failures == 2
    assert "2.0 turns per trajectory" in environment_line(summary) and "2 failures" in environment_line(summary)
    assert env_summary([single_turn_row(0)]) is None and environment_line(None) == ""


def test_iteration_artifact_and_run_table_show_the_environment_only_when_present():
    from tailflow.engines.run_state import RunState
    from tailflow.driver.artifacts import TABLE_COLUMNS, iteration_markdown, metrics_table

    state = RunState(run_id="r")
    text = iteration_markdown(agentic_row(0), state)
    assert "2.00 turns per trajectory" in text and "1 failed calls" in text
    assert "| `env_error` | 1 | 1 |" in text and "| `abort` | 0 | 1 |" in text and "`timeout`" not in text
    assert "Environment" not in iteration_markdown(single_turn_row(0), state)
    assert tuple(metrics_table([single_turn_row(0)])[0]) == TABLE_COLUMNS
    assert "env/turns_mean" in metrics_table([agentic_row(0)])[0]


def test_report_page_lists_environment_facts_only_for_agentic_runs():
    from tailflow.engines.track.report import environment_facts, page_html
    from tailflow.engines.track.report_data import MetricColumns

    facts = dict(environment_facts(MetricColumns.of_rows([agentic_row(0), single_turn_row(1), agentic_row(2)])))
    assert facts["turns per trajectory (mean over iterations)"] == "2.00 (max 3)"
    assert facts["environment failures (failed resets and steps)"] == "2"
    assert environment_facts(MetricColumns.of_rows([single_turn_row(0)])) == []
    assert "turns per trajectory" not in page_html("r", MetricColumns.of_rows([single_turn_row(0)]), [])


def test_report_length_histogram_counts_a_trajectorys_model_tokens():
    from tailflow.engines.track.report_data import model_length

    assert model_length(traced_response(0, DONE, None, "kept", (0, 1)).to_dict()) == 5
    assert model_length(traced_response(0, single("s", 7), None, "kept", (0, 1)).to_dict()) == 7
