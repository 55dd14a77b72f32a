"""Live progress: a round's line from its finished responses, plain lines off a terminal, and the run's Prefect
progress artifact moving within a round (through a real Prefect API)."""
from __future__ import annotations

import pytest

from tailflow.config import config_from_dict
from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Completion, FinishReason, Request
from tailflow.engines.track.live import RoundCount


def problems(n: int) -> list[Problem]:
    return [Problem(problem_id=f"p{i}", prompt=f"{i}+1", answer=str(i + 1)) for i in range(n)]


def finished(problem_id: str, k: int, tokens: int = 5) -> Completion:
    return Request.for_problem(problem_id, k, (1,)).completion((2,) * tokens, (0.0,) * tokens, FinishReason.EOS, 0)


def test_a_round_counts_prompts_with_r0_finished_responses_and_what_is_still_in_flight():
    count = RoundCount(num_prompts=6, responses_per_prompt=5, prompts_needed=4, responses_needed=4)
    count.add([finished("p0", k) for k in range(4)] + [finished("p1", k) for k in range(3)])
    assert (count.prompts_done, count.in_flight, count.num_tokens) == (1, 30 - 7, 35)
    count.add([finished(f"p{i}", k) for i in range(1, 6) for k in range(4, 5)] + [finished("p1", 3)])
    assert count.prompts_done == 2  # p0 and p1; the others have one response each
    count.add([finished(f"p{i}", k) for i in range(2, 6) for k in range(3)])
    assert count.prompts_done == 4  # capped at P0: the round keeps the first 4 prompts


def test_off_a_terminal_the_round_line_is_a_plain_line(tmp_path, monkeypatch, capsys):
    from tailflow.driver.live_progress import live_progress

    monkeypatch.setenv("TAILFLOW_PROGRESS_EVERY_S", "0")
    config = config_from_dict({"storage": {"uri": str(tmp_path)}, "data": {"prompts_per_step": 2},
                               "rollout": {"n": 2}, "tail": {"responses_launched": 3}})
    with live_progress(config, "r1", terminal=False) as live:
        watch = live.watcher(problems(3))  # what the run hands each round's scorer
        watch([finished("p0", 0), finished("p0", 1), finished("p2", 0)])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("[tailflow] iter 0000 round: 1/2 prompts complete | 6 requests in flight | ")
    assert line.endswith("long queue 0")


@pytest.mark.slow
def test_the_progress_artifact_moves_within_a_round(tmp_path, prefect_api):
    """Marked slow because it needs the session's Prefect server (`prefect_api`, 15-35 s to start here, paid by the
    first test on each xdist worker that asks for it): the fast subset starts no server; this test's own part is
    ~1 s."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    from tailflow.driver.artifacts import RunArtifacts
    from tailflow.driver.live_progress import latest_artifact_id, live_progress

    config = config_from_dict({"storage": {"uri": str(tmp_path)}, "data": {"prompts_per_step": 2},
                               "rollout": {"n": 2}, "train": {"iterations": 4}, "tail": {"responses_launched": 3}})

    @flow
    def one_round() -> str:
        RunArtifacts("live-run", 4).progress(0)  # as the parent flow makes it, 0 of 4 iterations
        with live_progress(config, "live-run", terminal=False) as live:
            watch = live.watcher(problems(3))
            watch([finished("p0", 0), finished("p0", 1)])  # one of P0 = 2 prompts complete
        return str(latest_artifact_id("live-run-progress"))

    artifact_id = one_round()
    with get_client(sync_client=True) as client:
        (artifact,) = [a for a in client.read_artifacts() if str(a.id) == artifact_id]
    assert artifact.data == 100.0 * 0.5 / 4  # half of iteration 0's prompts: 12.5% of the run
    assert "iteration 0 of 4 in progress" in artifact.description


@pytest.mark.slow
def test_actor_warnings_and_errors_reach_the_flow_runs_logs(tmp_path, prefect_api, ray_session):
    """Marked slow because it needs the session's Prefect server (`prefect_api`, 15-35 s to start here, paid by the
    first test on each xdist worker that asks for it): the fast subset starts no server; this test's own part is
    ~7-12 s (it also starts Ray)."""
    import time

    import ray
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.runtime import flow_run

    from tailflow.driver.live_progress import live_progress

    @ray.remote(num_cpus=0)
    class Noisy:
        def complain(self) -> None:
            import sys
            print("WARNING tailflow-test: the judge is slow", file=sys.stderr, flush=True)
            print("ValueError: tailflow-test broke", file=sys.stderr, flush=True)

    def messages(run_id) -> dict[str, int]:
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
        return {log.message: log.level for log in logs if "tailflow-test" in log.message}

    config = config_from_dict({"storage": {"uri": str(tmp_path)}})

    @flow
    def noisy_run() -> dict[str, int]:
        with live_progress(config, "noisy", terminal=False):
            ray.get(Noisy.remote().complain.remote())
            deadline = time.time() + 120  # Ray's log monitor and Prefect's log batching both take a moment
            while len(found := messages(flow_run.id)) < 2 and time.time() < deadline:
                time.sleep(1)
        return found

    found = noisy_run()
    levels = {message.split(") ", 1)[1]: level for message, level in found.items()}
    assert levels == {"WARNING tailflow-test: the judge is slow": 30, "ValueError: tailflow-test broke": 40}
    assert all(message.startswith("(Noisy pid=") for message in found)
