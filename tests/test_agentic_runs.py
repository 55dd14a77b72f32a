"""Agentic runs end to end: `tailflow train` on the built-in calculator environment (environment workers on Ray,
each trajectory's environment in its own process, a TrajectoryEngine in the rollout worker), SIGKILLed mid-run and
resumed, must end bit for bit where the uninterrupted run does: same weights, same metrics rows; and the clean run's
metrics rows agree with its rollout trace, trajectory by trajectory, and its last round, dumped and replayed through
the trainer (`tailflow replay`), gives its weights. Environments are
seeded per task and their calls answered in lockstep with the engine's steps (rollout/trajectory_engine.py), so
nothing a resume re-runs can come out differently.
"""
from __future__ import annotations

import json
import signal

import pytest
import yaml

from durable_cli import outcome, run_cli
from tailflow.engines.env.trajectory import StopReason
from tailflow.engines.runs.checkpoint import CRITIC_DIR, weights_sha256
from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.store import LocalStore
from tailflow.driver.inputs import shipped_warmstart_dir

pytestmark = pytest.mark.slow

CALCULATOR = "tailflow.engines.env.builtin.calculator:Calculator"


def agentic_config(storage, asynchronous: bool = False) -> dict:
    """3 iterations of 4 tasks x 4 trajectories, tail batching (a long round at iteration 2), one rollout worker
    (bit for bit), one environment worker, one trainer rank. `asynchronous`: one round ahead of training, a fixed
    number of engine steps per train step (deterministic), the trajectories in flight at each weight sync
    continued under the new weights (partial; replayed into fresh environments), a deferred prompt's first
    trajectories continued by its long round (tail.continue_deferred), and PPO with a critic (train.advantage
    gae: per-token advantages over the model's tokens, turn rewards at turn ends)."""
    return {
        "model": {"path": str(shipped_warmstart_dir())},
        "data": {"num_train": 64, "num_eval": 8, "prompts_per_step": 4},
        "rollout": {"n": 4, "num_slots": 24, "elastic": False},
        "env": {"class_path": CALCULATOR, "settings": {"min_terms": 2, "max_terms": 5}, "max_turns": 6,
                "turn_max_tokens": 16, "trajectory_max_tokens": 120, "turn_stop_texts": ["="]},
        "train": {"iterations": 3, "eval_every": 2, "num_workers": 1, "lr": 2e-4, "loss": "ppo_clip"},
        "tail": {"enabled": True, "prompt_ratio": 1.5, "responses_launched": 5},
        "reward": {"max_workers": 1},
        "storage": {"uri": str(storage), "dump_rounds": True},
    } | ({"rollout": {"n": 4, "num_slots": 24, "elastic": False, "async_ratio": 1, "partial": True,
                      "async_steps_per_train": 6},
          "train": {"iterations": 3, "eval_every": 2, "num_workers": 1, "lr": 2e-4, "loss": "decoupled_ppo",
                    "advantage": "gae"},
          "tail": {"enabled": True, "prompt_ratio": 1.5, "responses_launched": 5, "continue_deferred": True}}
         if asynchronous else {})


def test_a_sigkilled_agentic_run_resumes_to_exactly_the_uninterrupted_result(tmp_path, cli_env):
    """Costs ~2.5-4.5 min here (4 min 32 s with two other jobs running): three CLI runs (the clean one, one SIGKILLed in iteration 1's train phase, its
    resume), each starting Ray, the rollout, trainer, reward and environment actors and the Prefect flow. A
    SIGKILL needs a process of its own, and only a whole run shows that the resumed trajectories match. Then
    ~15 s for `tailflow replay` of the clean run's last iteration (Ray and one trainer rank): its dumped round
    (storage.dump_rounds) trained again must give the run's weights, and a whole run is what writes the dumps.

    The run is asynchronous with partial rollouts and tail.continue_deferred, the modes with the most to resume:
    trajectories stopped at a weight sync and continued (their turns replayed into fresh environments), deferred
    prompts' trajectories carried to their long round, and at the kill the ones in flight, committed with the
    run and continued by the resumed one. It trains with a critic (train.advantage gae), whose own weights and
    optimizer are committed beside the policy's and must resume exactly too. The synchronous agentic path, with
    GRPO's group advantages on trajectories, runs in the vLLM test below and in configs/agentic.yaml; a second
    resume test for it would cost another ~3 min."""
    clean_dir, killed_dir = tmp_path / "clean", tmp_path / "killed"
    for storage in (clean_dir, killed_dir):
        storage.mkdir()
        (storage / "run.yaml").write_text(yaml.safe_dump(agentic_config(storage, asynchronous=True)))

    result = run_cli(["train", "-c", str(clean_dir / "run.yaml"), "--run-id", "agent"], cli_env)
    assert result.returncode == 0, result.stdout[-4000:]
    check_reports(clean_dir / "agent", result.stdout, prompts=4, trajectories=4)
    clean_state, clean_rows = outcome(clean_dir, "agent")
    assert clean_state.iteration == 3 and len(clean_rows) == 3
    assert 0 < clean_rows[0]["reward/mean"] <= 1  # trajectories were paid by their environment
    # trajectories were stopped at a weight sync and trained after continuing under newer weights
    assert sum(row["async/requests_stopped_at_sync"] for row in clean_rows) > 0
    assert sum(row["async/mixed_version_responses"] for row in clean_rows) > 0
    assert sum(row["tail/continued_responses"] for row in clean_rows) > 0  # deferred trajectories continued
    check_critic(clean_rows)
    replayed = run_cli(["replay", "agent", "--iteration", "2", "-c", str(clean_dir / "run.yaml")], cli_env)
    assert replayed.returncode == 0, replayed.stdout[-3000:]
    check_replay(replayed.stdout, clean_dir / "agent", iteration=2)

    train = ["train", "-c", str(killed_dir / "run.yaml"), "--run-id", "agent"]
    result = run_cli(train, cli_env, "crash-train@1")
    assert result.returncode == -signal.SIGKILL, result.stdout[-3000:]
    committed = read_committed_state(LocalStore(killed_dir), "agent")
    assert committed.iteration == 1
    in_flight = committed.pipeline.in_flight  # what the resumed run continues: trajectories, with their turns
    assert any(c.token_ids for c in in_flight) and all(c.outcome.stop_reason is StopReason.ABORT for c in in_flight)
    assert all(len(c.response_mask) == len(c.token_ids) for c in in_flight)
    result = run_cli(train, cli_env)
    assert result.returncode == 0, result.stdout[-4000:]

    state, rows = outcome(killed_dir, "agent")
    assert rows == clean_rows
    assert state.weights_sha256 == clean_state.weights_sha256 and state.tail == clean_state.tail
    critic = [weights_sha256(storage / state.latest_checkpoint / CRITIC_DIR) for storage in (clean_dir, killed_dir)]
    assert critic[0] == critic[1]  # the critic resumed exactly too


def check_critic(rows: list[dict]) -> None:
    """PPO with a critic reports veRL's and ROLL's critic metrics, and its critic learns: it starts valuing every
    state 0 (a zero head), so its first step explains none of the returns' spread, and later ones some."""
    for row in rows:
        assert {"critic/vf_loss", "critic/vpred_mean", "critic/values_explained_variance", "critic/vf_clipfrac"} <= \
            row.keys()
        assert row["critic/vf_loss"] > 0 and 0 <= row["critic/vf_clipfrac"] <= 1
    assert rows[0]["critic/vpred_mean"] == 0.0 and rows[0]["critic/values_explained_variance"] == 0.0
    assert rows[-1]["critic/vpred_mean"] != 0.0


def check_replay(stdout: str, run_dir, iteration: int) -> None:
    """`tailflow replay`: the dumped round, trained again from the checkpoint before it, gives the run's step: its
    printed metrics are the run's row's, and its weights are the run's checkpoint after it, bit for bit."""
    assert f"from {run_dir / 'checkpoints' / f'iter-{iteration - 1:04d}'}" in stdout
    printed = {line.split()[0]: line.split()[1:] for line in stdout.splitlines()
               if line.strip().startswith(("actor/", "critic/"))}
    assert {"actor/pg_loss", "actor/grad_norm", "actor/clip_fraction", "critic/vf_loss"} <= printed.keys()
    assert all(len(values) == 2 and values[0] == values[1] for values in printed.values()), printed
    assert f"weights against {run_dir / 'checkpoints' / f'iter-{iteration:04d}'}: equal" in stdout


def check_reports(run_dir, stdout: str, prompts: int, trajectories: int) -> None:
    """What an agentic run shows of itself: every metrics row against its round's rollout trace (stop counts,
    turns, model and observation tokens), and the closing summary's environment line."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trace = [json.loads(line) for line in (run_dir / "rollout_trace.jsonl").read_text().splitlines()]
    assert len(rows) == len(trace)
    for row, round_ in zip(rows, trace):
        kept = [r for p in round_["prompts"] for r in p["responses"] if r["outcome"] == "kept"]
        ended = [r for p in round_["prompts"] for r in p["responses"]]
        assert len(kept) == prompts * trajectories
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
        assert row["time/env_step_s_mean"] > 0 and row["env/failures"] >= 0 and row["env/dropped"] >= 0
    assert "turns per trajectory" in stdout  # the closing summary's environment line


@pytest.mark.vllm
def test_an_agentic_run_on_the_vllm_engine_trains_on_its_trajectories(tmp_path, cli_env):
    """An agentic run with `rollout.engine: vllm` (vLLM's CPU build, in the vLLM CI run): each model turn is a vLLM
    request over the whole conversation (its prefix cache, not kept slots, reuses the shared part), and the
    trajectories train. It is also the run of a dataset with a verifier: arithmetic problems from files, the
    calculator as a tool only (`task: false`), `env.reward: sum` (the math reward scores each trajectory's last
    turn against the file's answer). Costs ~1-2 min here: one CLI run of 2 iterations, most of it Ray, the actors
    and the vLLM engine starting; only a whole run shows the vLLM worker, the environment workers and the
    verifier meeting."""
    import json
    import random

    from tailflow.engines.data.arith import ArithmeticTask

    task = ArithmeticTask(min_terms=2, max_terms=4, max_term_value=99)
    for split, count in (("train", 32), ("eval", 8)):
        draw = random.Random(split)
        lines = [json.dumps({"id": p.problem_id, "prompt": p.prompt, "answer": p.answer})
                 for p in (task.sample(draw, f"{split}-{i}") for i in range(count))]
        (tmp_path / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    config = agentic_config(tmp_path)
    config["rollout"]["engine"] = "vllm"
    config["train"]["iterations"] = 2
    config["data"] |= {"train_path": str(tmp_path / "train.jsonl"), "eval_path": str(tmp_path / "eval.jsonl"),
                       "id_field": "id"}
    config["env"] |= {"settings": {"task": False}, "reward": "sum"}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    result = run_cli(["train", "-c", str(tmp_path / "run.yaml"), "--run-id", "agent-vllm"], cli_env, hang_s=900)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "vLLM engine: vLLM 0.32.0 on cpu" in result.stdout
    state, rows = outcome(tmp_path, "agent-vllm")
    assert state.iteration == 2 and len(rows) == 2
    assert 0 < rows[0]["reward/mean"] <= 1  # the verifier paid: the tool-only calculator pays nothing
    trace = [json.loads(line) for line in (tmp_path / "agent-vllm" / "rollout_trace.jsonl").read_text().splitlines()]
    assert all(p["prompt_tokens"] > 0 for p in trace[0]["prompts"])  # the files' prompts, not the environment's
