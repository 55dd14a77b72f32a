"""What an agentic run shows of itself, on a real 2-iteration run of configs/agentic.yaml (the calculator) through
Prefect and Ray: its metrics rows, rollout trace and closing summary (~100 s here)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tailflow.engines.env.trajectory import StopReason

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "agentic.yaml"


def test_an_agentic_run_reports_its_trajectories(prefect_api, tmp_path):
    from tailflow.flows.training import rl_training

    summary = rl_training(config_path=str(CONFIG), run_id="agentic-report", overrides=[
        "train.iterations=2", "data.num_eval=8", "data.prompts_per_step=4", "train.eval_every=2",
        f"storage.uri={tmp_path}"])
    run_dir = tmp_path / "agentic-report"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trace = [json.loads(line) for line in (run_dir / "rollout_trace.jsonl").read_text().splitlines()]
    assert len(rows) == len(trace) == 2
    for row, round_ in zip(rows, trace):
        kept = [r for p in round_["prompts"] for r in p["responses"] if r["outcome"] == "kept"]
        ended = [r for p in round_["prompts"] for r in p["responses"]]
        assert len(kept) == 4 * 8  # P0 prompts x R0 trajectories
        assert sum(row[f"env/stop/{reason.value}"] for reason in StopReason) == len(kept)
        for reason in StopReason:
            assert row[f"env/stop/{reason.value}"] == sum(r["stop"] == reason.value for r in kept)
            assert row[f"env/stop_all/{reason.value}"] == sum(r.get("stop") == reason.value for r in ended)
        turns = [len(r["turns"]) for r in kept]
        assert row["env/turns_mean"] == pytest.approx(sum(turns) / len(turns)) and row["env/turns_max"] == max(turns)
        model = [sum(t["model_tokens"] for t in r["turns"]) for r in kept]
        observed = [sum(t["observation_tokens"] for t in r["turns"]) for r in kept]
        assert [m + o for m, o in zip(model, observed)] == [r["length"] for r in kept]
        assert row["token/response_length/mean"] == pytest.approx(sum(model) / len(model))
        assert row["token/response_length/max"] == max(model)
        assert row["token/observation_length/mean"] == pytest.approx(sum(observed) / len(observed))
        assert row["env/step_s_mean"] > 0 and row["env/failures"] >= 0 and row["env/dropped"] >= 0
    assert summary.env is not None and summary.env.turns_mean == pytest.approx(
        sum(row["env/turns_mean"] for row in rows) / 2)
