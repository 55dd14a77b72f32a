"""The spine end to end: a 2-iteration run through Prefect on real Ray actors."""
from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from tailflow.engines.runs.checkpoint import weights_sha256
from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.store import LocalStore
from tailflow.engines.track.metrics import without_timing
from tailflow.driver.inputs import shipped_warmstart_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model_dir():
    """The shipped warm start: a random model would earn no reward, hence no gradient."""
    return shipped_warmstart_dir()


def committed_state(storage, run_id):
    return read_committed_state(LocalStore(storage), run_id)


def tiny_run_config(model_dir, storage) -> dict:
    return {
        "model": {"path": str(model_dir)},
        "data": {"num_train": 64, "num_eval": 8, "prompts_per_step": 4},
        "rollout": {"n": 4, "max_new_tokens": 48, "num_slots": 16},
        "train": {"iterations": 2, "eval_every": 1, "num_workers": 2, "lr": 1e-3},
        "reward": {"max_workers": 1},  # one reward actor to start (the pool's growth: tests/test_reward_scheduler.py)
        "storage": {"uri": str(storage)},
        "tail": {"enabled": False},
    }


@pytest.fixture(scope="module")
def spine_run(prefect_api, tiny_model_dir, tmp_path_factory):
    """One 2-iteration run, (storage, summary): the spine test checks it, the bit-for-bit test repeats it."""
    from tailflow.flows.training import rl_training

    storage = tmp_path_factory.mktemp("spine")
    return storage, rl_training(config=tiny_run_config(tiny_model_dir, storage), run_id="spine-test")


def untimed_rows_and_weights(storage, run_id: str) -> tuple[list[dict], str]:
    """A run's metrics rows without time/* and the sha256 of its last checkpoint's weights file."""
    import hashlib

    rows = [json.loads(line) for line in (storage / run_id / "metrics.jsonl").read_text().splitlines()]
    weights = (storage / run_id / "checkpoints" / "iter-0001" / "model.safetensors").read_bytes()
    return [without_timing(row) for row in rows], hashlib.sha256(weights).hexdigest()


def test_two_iterations_through_prefect(spine_run, tiny_model_dir):
    """Costs ~40 s here, nearly all of it the module's `spine_run` (one 2-iteration run through Prefect with Ray,
    2 trainer ranks and a rollout worker), which this first test pays for and the bit-for-bit test reuses: the
    spine is checked on a real run's files, checkpoint and flow runs."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    tmp_path, summary = spine_run
    run_dir = tmp_path / "spine-test"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1]
    for key in ("time/step_total", "time/step_generate", "reward/mean", "token/response_length/max",
                "eval/accuracy", "actor/grad_norm", "rollout/bubble_ratio"):
        assert all(row[key] is not None for row in rows), key
    assert rows[0]["eval/accuracy_initial"] == summary.initial_accuracy
    assert not [key for row in rows for key in row if key.startswith("env/") or key.startswith("token/observation")]
    assert summary.env is None  # single-turn: no environment in the rows or the closing summary
    assert any(row["reward/mean"] > 0 for row in rows)  # there was a learning signal
    assert (run_dir / "config.yaml").read_text().startswith("model:")
    state = committed_state(tmp_path, "spine-test")
    assert state.iteration == 2 and state.weight_version == 2
    assert state.latest_checkpoint == "spine-test/checkpoints/iter-0001"
    assert state.weights_sha256 == weights_sha256(run_dir / "checkpoints" / "iter-0001")

    # the checkpoint is a loadable HF directory whose weights moved away from the initial model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint = run_dir / "checkpoints" / "iter-0001"
    AutoModelForCausalLM.from_pretrained(checkpoint)
    AutoTokenizer.from_pretrained(checkpoint)
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(checkpoint / "model.safetensors")
    assert any((before[name] - after[name]).abs().max() > 0 for name in before)

    async def flow_run_names():
        async with get_client() as client:
            runs = await client.read_flow_runs(limit=200, sort=FlowRunSort.START_TIME_ASC)
            return {run.name: run for run in runs}

    runs = asyncio.run(flow_run_names())
    assert {"iter-0000", "iter-0001", "spine-test"} <= set(runs)
    assert runs["iter-0000"].parent_task_run_id is not None  # a subflow of the parent run
    assert all(runs[name].state.is_completed() for name in ("iter-0000", "iter-0001", "spine-test"))


def test_a_run_without_resumable_commits_is_not_overwritten(tiny_model_dir, tmp_path):
    """~0 s: no run, only `prepare_run_dir` on a temp directory (in this slow module by topic, not by cost)."""
    from tailflow.config import ConfigError, config_from_dict
    from tailflow.driver.context import prepare_run_dir

    config = config_from_dict(tiny_run_config(tiny_model_dir, tmp_path))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "state.json").write_text("{}")
    with pytest.raises(ConfigError, match="run taken .* without resumable commits"):
        prepare_run_dir(LocalStore(tmp_path), config, "taken")
    assert (tmp_path / "taken" / "state.json").read_text() == "{}"


@pytest.mark.long
def test_seeded_run_repeats_bit_for_bit(spine_run, tiny_model_dir, tmp_path):
    """One rollout worker, same seed: same rewards, lengths, losses and final weights as the spine run's (run
    once for both tests: the first of the two runs compared here).
    Costs ~79 s here (a second 2-iteration in-process run through Prefect with Ray and its actors; the first is the
    shared spine run): repeating bit for bit can only be shown by running again."""
    from tailflow.flows.training import rl_training

    storage, _ = spine_run
    rl_training(config=tiny_run_config(tiny_model_dir, tmp_path), run_id="seeded-b")
    first, second = untimed_rows_and_weights(storage, "spine-test"), untimed_rows_and_weights(tmp_path, "seeded-b")
    assert first == second
    assert first[0][0]["reward/mean"] is not None


def test_tail_batching_reaches_a_long_round(prefect_api, tiny_model_dir, tmp_path):
    """Short rounds defer the prompts that did not complete; a full queue runs a long round.

    P0 = 4 and 1.5x prompts: each short round launches 6 prompts and defers 2, so
    the queue holds 4 = P0 after two short rounds and iteration 2 is a long round.
    Costs ~35 s here (a 4-iteration in-process run through Prefect with Ray and its actors, 16 new tokens): 4
    iterations are the fewest with two short rounds filling the queue, the long round and a short round after it."""
    from tailflow.flows.training import rl_training

    config = tiny_run_config(tiny_model_dir, tmp_path)
    config["rollout"]["max_new_tokens"] = 16  # forced tiny: many responses end by length
    config["train"].update(iterations=4, eval_every=4)
    config["tail"] = {"enabled": True, "prompt_ratio": 1.5, "responses_launched": 5}
    rl_training(config=config, run_id="tail-test")

    rows = [json.loads(line) for line in (tmp_path / "tail-test" / "metrics.jsonl").read_text().splitlines()]
    assert [row["tail/round"] for row in rows] == [0, 0, 1, 0]
    assert [row["tail/long_queue_size"] for row in rows] == [2, 4, 0, 2]
    assert [row["tail/fresh_prompts"] for row in rows] == [6, 6, 0, 6]
    # each short round defers 2 prompts, each with at most R0 - 1 = 3 of its 5 responses finished: >= 2 aborted
    # requests apiece; the long round waits for every response and wastes nothing
    for short in (rows[0], rows[1], rows[3]):
        assert short["tail/aborted_requests"] >= 2 * 2 and short["tail/wasted_tokens"] > 0
    assert (rows[2]["tail/aborted_requests"], rows[2]["tail/wasted_tokens"]) == (0, 0)
    state = committed_state(tmp_path, "tail-test")
    assert state.tail.cursor.num_drawn == 18  # 3 short rounds x 6 fresh prompts
    assert len(state.tail.queue) == 2  # 18 drawn = 4 trained x 4 iterations + 2 queued
    assert state.round_history == [0, 0, 1, 0]

    # the rollout trace (what `tailflow plan --run` reads) agrees with the metrics, response by response
    from tailflow.engines.track.rollout_trace import RolloutTraceLog
    from tailflow.engines.store import LocalStore

    trace = RolloutTraceLog(LocalStore(tmp_path), "tail-test").rounds()
    assert [r.round for r in trace] == ["short", "short", "long", "short"]
    for trace_round, row in zip(trace, rows):
        outcomes = [response.outcome for prompt in trace_round.prompts for response in prompt.responses]
        assert outcomes.count("kept") == 4 * 4 and outcomes.count("aborted") == row["tail/aborted_requests"]
        assert len(trace_round.prompts) == (4 if trace_round.round == "long" else 6)
        # the length bias in the metrics row (from the completion rule) is the trace's, recorded apart
        responses = [response for prompt in trace_round.prompts for response in prompt.responses]
        kept = [response.length for response in responses if response.outcome == "kept"]
        assert row["tail/kept_length_mean"] == pytest.approx(sum(kept) / len(kept))
        assert row["tail/launched_length_mean"] == pytest.approx(sum(r.length for r in responses) / len(responses))
    assert rows[2]["tail/kept_length_mean"] == rows[2]["tail/completed_length_mean"] \
        == rows[2]["tail/launched_length_mean"]  # the long round keeps everything it launched

    # the run's report, drawn at its end, and the lease released
    for name in ("reward", "lengths", "step_times", "long_queue", "wasted_tokens"):
        assert (tmp_path / "tail-test" / "report" / f"{name}.png").stat().st_size > 5_000, name
    assert "report/lengths.png" in (tmp_path / "tail-test" / "index.html").read_text()
    assert not (tmp_path / ".leases" / "tail-test.json").exists()

    # progress lines in Prefect's logs: the run's (every iteration) and each iteration's own
    logs = flow_run_logs("tail-test")
    assert [line[len("[tailflow] iter "):][:4] for line in logs["tail-test"] if line.startswith("[tailflow] iter")] \
        == ["0000", "0001", "0002", "0003"]
    assert any(line.startswith("[tailflow] run tail-test: 64 train / 8 eval problems") for line in logs["tail-test"])
    assert any(line.startswith("[tailflow] iter 0002 |") for line in logs["iter-0002"])


def flow_run_logs(run_name: str) -> dict[str, list[str]]:
    """Log messages of the newest flow run named `run_name` and of its subflow runs, by flow run name."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterName, FlowRunFilterParentFlowRunId,
                                                LogFilter, LogFilterFlowRunId)
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        (parent,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_name])),
                                          sort=FlowRunSort.START_TIME_DESC, limit=1)
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent.id])))
        runs = {run.id: run.name for run in [parent, *children]}
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=list(runs))), limit=200)
    by_name: dict[str, list[str]] = {name: [] for name in runs.values()}
    for log in logs:
        by_name[runs[log.flow_run_id]].append(log.message)
    return by_name


def test_training_on_a_jsonl_dataset_with_custom_fields(prefect_api, tiny_model_dir, tmp_path):
    """Real data path: problems from JSONL with other field names, one bad row skipped and counted.
    Costs ~28 s here (a 1-iteration in-process run through Prefect with Ray and its actors, on 12 problems): the
    custom fields must reach the reward in a real run, and one iteration is the least that has one."""
    from tailflow.engines.data.arith import ArithmeticTask
    from tailflow.flows.training import rl_training

    problems = ArithmeticTask(max_terms=3).generate(12, seed=5, split="mine")
    data = tmp_path / "mine.jsonl"
    rows = [json.dumps({"question": p.prompt, "gold": p.answer, "uid": p.problem_id}) for p in problems]
    data.write_text("\n".join(rows + ['{"question": "", "gold": "1", "uid": "empty"}']) + "\n")
    config = tiny_run_config(tiny_model_dir, tmp_path)
    config["data"] = {"train_path": str(data), "eval_path": str(data), "prompt_field": "question",
                      "answer_field": "gold", "id_field": "uid", "on_invalid": "skip", "num_eval": 4,
                      "prompts_per_step": 4}
    config["train"].update(iterations=1)
    summary = rl_training(config=config, run_id="jsonl-run")
    assert summary.iterations == 1 and summary.final_accuracy is not None
    row = json.loads((tmp_path / "jsonl-run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["reward/mean"] > 0  # the shipped model solves some of these short sums
