"""The reward scheduler: adaptive timeout, the Ray reward pool, streamed scoring, the judge."""
from __future__ import annotations

import math
import os
import signal

import pytest

from tailflow.engines.data.problem import CodeTests, Problem
from tailflow.engines.reward.math import MathReward
from tailflow.engines.reward.spec import RewardSpec
from tailflow.engines.reward.timeouts import TimeoutAnchors, TimeoutPolicy
from tailflow.engines.reward.worker import ScoreItem

MATH = RewardSpec("math", {"format_reward": 0.0, "answer_marker": "####", "literal_answers_only": True})


def problem(pid: str, reference_time_s: float | None = None) -> Problem:
    return Problem(pid, "x", "", tests=CodeTests(asserts=("assert True",), reference_time_s=reference_time_s))


# ---- adaptive timeout ------------------------------------------------------------------------

def test_timeout_formula_clamps_lambda_times_anchor():
    policy = TimeoutPolicy(adaptive=True, scale=1.5, min_s=2.0, max_s=30.0, scope="task")
    p = problem("a")
    assert policy.timeout_s(p, TimeoutAnchors()) == 30.0  # no anchor yet: the fixed timeout
    assert policy.timeout_s(p, TimeoutAnchors(task_s=0.4)) == 2.0  # 0.6 s, raised to T_min
    assert policy.timeout_s(p, TimeoutAnchors(task_s=4.0)) == 6.0
    assert policy.timeout_s(p, TimeoutAnchors(task_s=100.0)) == 30.0
    fixed = TimeoutPolicy(adaptive=False, scale=1.5, min_s=2.0, max_s=30.0, scope="task")
    assert fixed.timeout_s(p, TimeoutAnchors(task_s=4.0)) == 30.0


def test_anchor_is_a_high_quantile_of_recent_correct_executions_per_scope():
    task = TimeoutPolicy(True, 1.5, 2.0, 30.0, "task")
    observed = [(problem("a"), True, 3.0), (problem("b"), False, 20.0), (problem("b"), True, None),
                (problem("c"), True, 5.0)]
    # a window of three correct times: its 0.9 quantile is the slowest (tests/test_reward_red_team.py has the rest)
    assert task.updated(TimeoutAnchors(task_s=1.0), observed) == TimeoutAnchors(task_s=5.0, task_recent=[1.0, 3.0, 5.0])
    per_problem = TimeoutPolicy(True, 1.5, 2.0, 30.0, "problem")
    anchors = per_problem.updated(TimeoutAnchors(), observed)
    assert anchors.problem_s == {"a": 3.0, "c": 5.0}  # b: the 20 s run was wrong, the right one has no time
    assert per_problem.timeout_s(problem("a"), anchors) == 4.5
    assert per_problem.timeout_s(problem("b", reference_time_s=10.0), anchors) == 15.0  # the dataset's reference
    assert per_problem.timeout_s(problem("d"), anchors) == 30.0


def test_anchors_round_trip_through_the_run_state():
    from tailflow.engines.run_state import RunState

    state = RunState(run_id="r", reward_anchors=TimeoutAnchors(task_s=1.25, problem_s={"a": 0.5}))
    assert RunState.model_validate_json(state.model_dump_json()) == state
    assert RunState.model_validate_json('{"run_id": "old"}').reward_anchors == TimeoutAnchors()  # older commits


# ---- the pool --------------------------------------------------------------------------------

def math_items(count: int) -> list[ScoreItem]:
    texts = ["23+45=68\n#### 68", "#### 69", "68", "#### 23+45"]
    return [ScoreItem(f"p{i}#0", texts[i % 4], Problem(f"p{i}", "23+45\n", "68")) for i in range(count)]


def test_pool_scores_like_the_function_in_process_and_sizes_with_the_backlog(ray_session):
    from tailflow.engines.cluster.reward_pool import RewardPool

    pool = RewardPool(MATH, min_workers=1, max_workers=3, backlog_per_worker=4)
    try:
        assert len(pool.workers) == 1
        items = math_items(20)
        outcomes = pool.score_all(items)
        local = MathReward()
        assert [o.result for o in outcomes] == [local.score(i.text, i.problem.answer) for i in items]
        assert pool.peak_workers == 3  # 20 outstanding > 4 per worker: grew to max_workers
        assert all(o.finished_at >= o.started_at for o in outcomes)
        pool.shrink_to_recent_need()
        assert len(pool.workers) == 3  # that round needed 3
        for expected in (2, 1, 1):  # quick rounds give them back one per round, down to min_workers
            pool.score_all(math_items(2))
            pool.shrink_to_recent_need()
            assert len(pool.workers) == expected
    finally:
        pool.shutdown()


def test_a_dead_reward_worker_is_an_actor_failure(ray_session):
    import ray

    from tailflow.engines.cluster.reward_pool import RewardPool

    pool = RewardPool(MATH, min_workers=1, max_workers=1)
    try:
        os.kill(pool.worker_pid(0), signal.SIGKILL)
        with pytest.raises((ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)):
            pool.score_all(math_items(3))  # the iteration retry catches exactly these
    finally:
        pool.shutdown()


def test_a_judge_that_cannot_start_fails_the_pool_start_with_the_key(ray_session, random_tiny_model_dir):
    import ray

    from tailflow.engines.cluster.reward_pool import RewardPool

    spec = RewardSpec("judge", {"model_path": str(random_tiny_model_dir), "template": "{response}",
                                "yes_text": "1", "no_text": "1"})
    pool = RewardPool(spec, 1, 1)  # starts in the background, alongside the rollout and trainer actors
    try:
        with pytest.raises(ray.exceptions.RayActorError, match="reward.judge_yes"):
            pool.check_started()
    finally:
        pool.shutdown()


# ---- streamed scoring ------------------------------------------------------------------------

def round_inputs(tokenizer, count: int = 12):
    from tailflow.engines.data.arith import ArithmeticTask
    from tailflow.engines.rollout.protocol import SamplingParams
    from tailflow.engines.rollout.requests import sampling_requests

    problems = ArithmeticTask(max_terms=4).generate(count, 0, "train")
    params = SamplingParams(temperature=1.0, max_new_tokens=40)
    return problems, sampling_requests(problems, 3, params, tokenizer, 0, 0, "{prompt}")


@pytest.mark.parametrize("streaming", [True, False])
def test_streamed_scores_equal_batch_scores_and_run_during_rollout(ray_session, random_tiny_model_dir, streaming):
    from transformers import AutoTokenizer

    from tailflow.engines.cluster.reward_pool import RewardPool
    from one_round import Watching, take_one_round
    from tailflow.engines.reward.streaming import StreamingScorer
    from tailflow.engines.rollout.worker import LocalRollout, RolloutWorker
    from tailflow.engines.tail.planner import RoundKind

    tokenizer = AutoTokenizer.from_pretrained(random_tiny_model_dir)
    problems, requests = round_inputs(tokenizer)
    worker = RolloutWorker(str(random_tiny_model_dir), num_slots=8, max_seq_len=64, seed=0)
    pool = RewardPool(MATH, 1, 2, backlog_per_worker=4)
    try:
        scorer = StreamingScorer(pool, tokenizer, problems, lambda p: None, streaming=streaming)
        handed_during_rollout = []

        def on_finished(completions):
            handed_during_rollout.extend(completions)
            scorer.on_finished(completions)

        taken = take_one_round(LocalRollout(worker), requests, RoundKind.SHORT, 2, 8, Watching(on_finished) if streaming else None)
        result = taken.result
        trained, kept = result.trained_in_launch_order(problems)
        outcomes, stats = scorer.finish(kept)
    finally:
        pool.shutdown()
    by_id, math = {p.problem_id: p for p in trained}, MathReward()
    in_process = {c.request_id: math.score_problem(tokenizer.decode(c.token_ids, skip_special_tokens=True),
                                                   by_id[c.problem_id]) for c in kept}
    assert {rid: (r.reward, r.correct) for rid, r in in_process.items()} == \
        {rid: (o.result.reward, o.result.correct) for rid, o in outcomes.items()}
    assert len(outcomes) == 16
    # 12 prompts, 8 complete: 4 deferred, each with at most 1 of its 3 responses finished, so >= 2 aborted apiece
    assert len(result.deferred_problem_ids) == 4
    assert len(result.aborted_request_ids) >= 4 * 2 and result.wasted_tokens > 0
    if streaming:
        assert stats.num_scored > len(outcomes)  # responses of deferred prompts were scored too, and not used
        assert stats.num_unused == stats.num_scored - 16
        # counts, not the clock (how much scoring overlaps rollout is the machine's; bench/reward.py measures it):
        # every scored response was handed to the workers before the round ended
        assert len(handed_during_rollout) == stats.num_scored
        assert 0 <= stats.overlap_ratio <= 1
    else:
        assert stats.num_scored == 16 and stats.num_unused == 0
        assert stats.hidden_s == 0 and stats.overlap_ratio == 0  # nothing ran before rollout ended


# ---- the judge -------------------------------------------------------------------------------

def test_judge_reward_is_p_yes_over_p_yes_plus_p_no_from_the_model(random_tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tailflow.engines.reward.judge import JudgeReward

    judge = JudgeReward(str(random_tiny_model_dir), "{prompt}{response}?{reference}=", yes_text="1", no_text="0")
    tokenizer = AutoTokenizer.from_pretrained(random_tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(random_tiny_model_dir)
    p = Problem("a", "23+45\n", "68")
    for response in ("23+45=68\n#### 68", "#### 7"):
        result = judge.score_problem(response, p)
        ids = tokenizer.encode(f"23+45\n{response}?68=", add_special_tokens=False)
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)
        yes, no = logprobs[tokenizer.convert_tokens_to_ids("1")], logprobs[tokenizer.convert_tokens_to_ids("0")]
        assert result.reward == pytest.approx(float(torch.sigmoid(yes - no)), abs=1e-5)
        assert result.correct == (result.reward > 0.5)
        assert 0 < result.reward < 1 and not math.isnan(result.reward)


def test_judge_refuses_yes_and_no_it_cannot_tell_apart(random_tiny_model_dir):
    from tailflow.engines.reward.judge import JudgeError, JudgeReward

    with pytest.raises(JudgeError, match="reward.judge_yes"):
        JudgeReward(str(random_tiny_model_dir), "{response}", yes_text="Yes", no_text="0")  # letters: not in vocab
    with pytest.raises(JudgeError, match="same token"):
        JudgeReward(str(random_tiny_model_dir), "{response}", yes_text="12", no_text="13")
