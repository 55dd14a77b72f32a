"""`tailflow plan` and the `plan` flow on tiny settings: a table, a recommendation, a heatmap; bad input is one line."""
from __future__ import annotations

import re

import pytest
import yaml

from tailflow.cli import main
from tailflow.engines.track.rollout_trace import RolloutTraceLog, TracePrompt, TraceResponse, TraceRound
from tailflow.engines.store import LocalStore

TINY = ["--gpus", "4", "--model", "qwen2.5-7b", "--hardware", "h100", "--rounds", "3", "--jobs", "1"]


def check_outputs(out, stdout: str, num_settings: int) -> None:
    rows = [line for line in stdout.splitlines() if re.match(r"\s+[\d.]+\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+x", line)]
    assert len(rows) == num_settings
    assert re.search(r"recommendation: .*rollout TP \d for short rounds, \d for long rounds", stdout)
    assert (out / "plan_heatmap.png").read_bytes().startswith(b"\x89PNG")
    assert "| prompt ratio |" in (out / "plan.md").read_text()


def test_plan_with_the_paper_generator(tmp_path, capsys):
    out = tmp_path / "plan"
    code = main(["plan", "--paper", "--max-new-tokens", "2048", "--prompts-per-step", "8", "--responses", "4",
                 "--out", str(out), *TINY])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    check_outputs(out, stdout, 16)  # the paper's 4 x 4 grid
    assert "1.125          5" in stdout  # responses ceil(1.125 x 4) = 5


@pytest.mark.long
def test_the_32b_example_reports_what_cannot_run_and_still_recommends(tmp_path, capsys):
    """docs/simulator.md's 32B plan (64 GPUs, 32k cap) on reduced rounds and P0. At TP 1 a replica holds the
    65 GB of weights with 3 GB to spare: its KV budget (11k tokens) is positive but smaller than one request, the
    setting that used to crash the plan; it is a row now, and the plan goes on.
    Costs ~40 s here, all CPU (two plans of 32k-token rounds, every cell simulated): the infeasible row only
    appears at the 32B model's real sizes, and the recommendation needs every TP's cells."""
    out = tmp_path / "plan"
    code = main(["plan", "--paper", "--max-new-tokens", "32768", "--gpus", "64", "--model", "qwen2.5-32b",
                 "--prompts-per-step", "16", "--rounds", "1", "--pricing", "roofline", "--out", str(out),
                 "--jobs", "2"])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    assert "pricing: roofline: FSDP train step" in stdout
    assert re.search(r"TP 1: infeasible: request '\S+': prompt \+ max_new_tokens = \d+ tokens can never fit the KV "
                     r"budget of [\d,]+ tokens", stdout)
    assert re.search(r"recommendation: .*rollout TP (2|4|8|16) for short rounds, (2|4|8|16) for long rounds", stdout)
    # asked for TP 1 itself: every cell says why, and the recommendation names the TPs that can run it
    code = main(["plan", "--paper", "--max-new-tokens", "32768", "--gpus", "64", "--model", "qwen2.5-32b",
                 "--prompts-per-step", "16", "--rounds", "1", "--tp", "1", "--out", str(out), "--jobs", "2"])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    rows = [line for line in stdout.splitlines() if re.match(r"\s+[\d.]+\s+\d+\s+infeasible", line)]
    assert len(rows) == 16
    assert "infeasible: request" in stdout and "recommendation: none: no setting runs at rollout TP 1" in stdout
    assert "rollout TP 2, 4, 8, 16 can run it" in stdout


def fake_run(store_root, run_id: str) -> None:
    """A run directory as a training run leaves it: its config and a trace of 4 rounds (P0 = 4, R0 = 2)."""
    store = LocalStore(store_root)
    store.write_text(f"{run_id}/config.yaml", yaml.safe_dump({"data": {"prompts_per_step": 4}, "rollout": {"n": 2}}))
    log = RolloutTraceLog(store, run_id)
    for iteration in range(4):
        prompts = tuple(TracePrompt(f"q{iteration}-{p}", 30, tuple(
            TraceResponse(k, 10 + 37 * p * k % 300, "eos", 10 + 37 * p * k % 300, 0, "kept") for k in range(3)))
            for p in range(6))
        log.append(TraceRound(iteration, "short", 400, None, prompts))


def test_plan_from_a_run_in_the_store(tmp_path, capsys):
    fake_run(tmp_path / "store", "run-a")
    out = tmp_path / "plan"
    code = main(["plan", "--run", "run-a", "--set", f"storage.uri={tmp_path / 'store'}", "--out", str(out), *TINY])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    check_outputs(out, stdout, 16)
    assert "(P0=4, R0=2)" in stdout or "keep tail batching off" in stdout  # sizes from the run's config
    assert "run run-a: 4 rounds, 24 prompts, cap 400" in stdout


@pytest.mark.parametrize("args,message", [
    (["--paper", "--max-new-tokens", "2048", "--hardware", "tpu"], "--hardware: unknown preset 'tpu'"),
    (["--paper"], "--paper needs --max-new-tokens"),
    (["--trace", "/nonexistent/t.jsonl"], "/nonexistent/t.jsonl: no such trace file"),
    (["--run", "nope"], "run nope: no nope/config.yaml"),
    (["--paper", "--max-new-tokens", "64", "--trace", "x"], "give exactly one of --run, --trace"),
])
def test_bad_plan_input_is_one_line(tmp_path, capsys, args, message):
    code = main(["plan", "--gpus", "4", "--model", "qwen2.5-7b", "--set", f"storage.uri={tmp_path}", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_plan_flow_publishes_a_markdown_artifact(prefect_api, tmp_path):
    """Marked slow because it needs the session's Prefect server (`prefect_api`, 15-35 s to start here, paid by the
    first test on each xdist worker that asks for it): the fast subset starts no server; this test's own part is
    ~2-3 s."""
    from prefect.client.orchestration import get_client

    from tailflow.flows.plan import plan_tail_batching

    summary = plan_tail_batching(gpus=4, hardware="h100", model="qwen2.5-7b", paper_prompts=500, max_new_tokens=2048,
                                 prompts_per_step=8, responses_kept=4, rounds=3, out_dir=str(tmp_path / "plan"),
                                 jobs=1)
    assert summary.recommendation.startswith("recommendation:")
    assert (tmp_path / "plan" / "plan_heatmap.png").is_file()
    with get_client(sync_client=True) as client:
        artifact = client.read_latest_artifacts()  # newest per key
        page = next(a for a in artifact if a.key == "tail-batching-plan")
    assert "| prompt ratio |" in page.data and summary.recommendation in page.data


def test_a_runs_trace_replays_round_by_round_on_a_gpu_preset(tmp_path):
    """What bench/tail_batching.py's simulated line does: each traced round again, on 8 x H100 with a 7B."""
    import bench_path  # noqa: F401
    from research.replay import replay_on
    from tailflow.engines.sim.roofline import RooflineCost

    fake_run(tmp_path, "run-b")
    rounds = RolloutTraceLog(LocalStore(tmp_path), "run-b").rounds()
    cost = RooflineCost.from_presets("h100", "qwen2.5-7b", 8, 1)
    replayed = replay_on(rounds, cost, 8, 2048, prompts_per_step=4, responses_kept=2)
    assert [r.iteration for r in replayed] == [0, 1, 2, 3] and all(r.kind.value == "short" for r in replayed)
    assert all(r.num_kept == 4 * 2 for r in replayed)  # P0 prompts x R0 responses, as the run trained
    assert all(r.num_aborted > 0 and r.rollout_s > 0 for r in replayed)  # 6 launched, 4 complete: the rest abort


def test_plan_uses_a_measured_gpu_calibration_when_given(tmp_path, capsys):
    import json

    measured = {"format": "tailflow-step-costs/1", "kind": "measured", "device": "hand-written", "engine": "vllm",
                "model": "qwen2.5-7b", "tp": 2, "attention": "paged", "rows": [1, 256], "context": [128, 8192],
                "decode_seconds": [[0.010, 0.012], [0.014, 0.030]], "prefill_seconds": [[0.01, 0.2], [0.2, 5.0]],
                "kv_budget_tokens": 400_000}
    (tmp_path / "measured.json").write_text(json.dumps(measured))
    code = main(["plan", "--paper", "--max-new-tokens", "2048", "--prompts-per-step", "8", "--responses", "4",
                 "--measured", str(tmp_path / "measured.json"), "--out", str(tmp_path / "plan"), *TINY])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    assert "cost model: measured: vllm engine on hand-written" in stdout and "2 replicas, KV budget 400,000" in stdout
    assert re.search(r"^  TP 2: ", stdout, re.M) and not re.search(r"^  TP [148]: ", stdout, re.M)  # the file's TP only
