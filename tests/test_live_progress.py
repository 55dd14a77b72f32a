"""Live progress: a round's line from its finished responses, plain lines off a terminal, and the run's Prefect
progress artifact moving within a round (through a real Prefect API)."""
from __future__ import annotations

from tailflow.config import config_from_dict
from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Completion, FinishReason
from tailflow.engines.track.live import RoundCount, round_watcher


def problems(n: int) -> list[Problem]:
    return [Problem(problem_id=f"p{i}", prompt=f"{i}+1", answer=str(i + 1)) for i in range(n)]


def finished(problem_id: str, k: int, tokens: int = 5) -> Completion:
    return Completion(request_id=f"{problem_id}#{k}", prompt_token_ids=(1,), token_ids=(2,) * tokens,
                      logprobs=(0.0,) * tokens, finish_reason=FinishReason.EOS, weight_version=0)


def test_a_round_counts_prompts_with_r0_finished_responses_and_what_is_still_in_flight():
    count = RoundCount(num_prompts=6, responses_per_prompt=5, prompts_needed=4, responses_needed=4)
    count.add([finished("p0", k) for k in range(4)] + [finished("p1", k) for k in range(3)])
    assert (count.prompts_done, count.in_flight, count.num_tokens) == (1, 30 - 7, 35)
    count.add([finished(f"p{i}", k) for i in range(1, 6) for k in range(4, 5)] + [finished("p1", 3)])
    assert count.prompts_done == 2  # p0 and p1; the others have one response each
    count.add([finished(f"p{i}", k) for i in range(2, 6) for k in range(3)])
    assert count.prompts_done == 4  # capped at P0: the round keeps the first 4 prompts


def test_off_a_terminal_the_round_line_is_a_plain_line(tmp_path, monkeypatch, capsys):
    from tailflow.flows.live_progress import live_progress

    monkeypatch.setenv("TAILFLOW_PROGRESS_EVERY_S", "0")
    config = config_from_dict({"storage": {"uri": str(tmp_path)}, "data": {"prompts_per_step": 2},
                               "rollout": {"n": 2}, "tail": {"responses_launched": 3}})
    with live_progress(config, "r1", terminal=False):
        watch = round_watcher(problems(3))
        watch([finished("p0", 0), finished("p0", 1), finished("p2", 0)])
    assert round_watcher(problems(3)) is None  # nobody watches once the run is over
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("[tailflow] iter 0000 round: 1/2 prompts complete | 6 requests in flight | ")
    assert line.endswith("long queue 0")


def test_the_progress_artifact_moves_within_a_round(tmp_path, prefect_api):
    from prefect import flow
    from prefect.client.orchestration import get_client

    from tailflow.flows.artifacts import RunArtifacts
    from tailflow.flows.live_progress import latest_artifact_id, live_progress

    config = config_from_dict({"storage": {"uri": str(tmp_path)}, "data": {"prompts_per_step": 2},
                               "rollout": {"n": 2}, "train": {"iterations": 4}, "tail": {"responses_launched": 3}})

    @flow
    def one_round() -> str:
        RunArtifacts("live-run", 4).progress(0)  # as the parent flow makes it, 0 of 4 iterations
        with live_progress(config, "live-run", terminal=False):
            watch = round_watcher(problems(3))
            watch([finished("p0", 0), finished("p0", 1)])  # one of P0 = 2 prompts complete
        return str(latest_artifact_id("live-run-progress"))

    artifact_id = one_round()
    with get_client(sync_client=True) as client:
        (artifact,) = [a for a in client.read_artifacts() if str(a.id) == artifact_id]
    assert artifact.data == 100.0 * 0.5 / 4  # half of iteration 0's prompts: 12.5% of the run
    assert "iteration 0 of 4 in progress" in artifact.description
