"""The stream trainer (train.stream): groups trained while the round rolls out give the step the non-streamed
one takes on the same groups (weights within 1e-6), on one process and on two FSDP2 ranks; what is sent when;
the non-blocking train step the asynchronous trainer uses."""
import json
import random

import pytest
import torch

from random_samples import make_samples
from tailflow.config import ConfigError, TrainConfig, load_config
from tailflow.engines.cluster.trainer_group import TrainerGroup
from tailflow.engines.data.problem import Problem
from tailflow.engines.reward.result import RewardResult
from tailflow.engines.reward.streaming import StreamingScorer
from tailflow.engines.reward.worker import ScoreOutcome
from tailflow.engines.rollout.protocol import Completion, FinishReason, Request
from tailflow.engines.tail.completion import CompletionRule
from tailflow.engines.round_work import RoundWork
from tailflow.engines.tail.pipeline import LiveRound
from tailflow.engines.train.batch import count_response_tokens
from tailflow.engines.train.samples import samples_from_groups
from tailflow.engines.train.stream import StreamedStep
from tailflow.engines.train.trainer import PolicyTrainer

torch.set_num_threads(1)


def max_weight_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def assert_same_step(streamed, whole):
    assert streamed.grad_norm == pytest.approx(whole.grad_norm, rel=1e-6)
    for name in ("pg_loss", "kl", "entropy", "approx_kl", "clip_fraction"):
        assert getattr(streamed, name) == pytest.approx(getattr(whole, name), rel=1e-5, abs=1e-7), name
    assert (streamed.num_tokens, streamed.logprob_diff_vs_rollout) == \
           (whole.num_tokens, pytest.approx(whole.logprob_diff_vs_rollout, rel=1e-6))


# ---- the trainer's two halves ---------------------------------------------------------------------


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_sum"])
def test_pieces_accumulated_then_one_step_equal_the_step_on_all_of_them(model_path, loss_agg):
    """Two steps (Adam's state matters on the second), a KL term, pieces of 1, 5 and 6 samples.

    lr 1e-5: Adam's step is ~lr * g / |g|, so the float noise of gradient entries near 0 (summation order) can
    move a weight by ~lr / 100; at 1e-5 that is far under the 1e-6 tolerance while every weight with a gradient
    moves by ~1e-5, ten times it. grad_norm (rel 1e-6) checks the gradient's scale, which Adam would hide."""
    kwargs = dict(train=TrainConfig(lr=1e-5, kl_coef=0.1, loss_agg=loss_agg, max_tokens_per_micro_batch=64))
    whole, streamed = PolicyTrainer(model_path, **kwargs), PolicyTrainer(model_path, **kwargs)
    initial = whole.full_state_dict()
    for seed in (1, 2):
        samples = make_samples(12, seed)
        whole_stats = whole.train_step(samples, count_response_tokens(samples), len(samples))
        for piece in (samples[:1], samples[1:6], samples[6:]):
            streamed.accumulate(piece)
        assert_same_step(streamed.finish_step(count_response_tokens(samples), len(samples)), whole_stats)
        assert max_weight_diff(whole.full_state_dict(), streamed.full_state_dict()) < 1e-6
    assert max_weight_diff(initial, streamed.full_state_dict()) > 1e-5  # it did train
    with pytest.raises(RuntimeError, match="no streamed step is open"):
        streamed.finish_step(10, 2)


# ---- the iteration's side: what is sent when ------------------------------------------------------


class HeldBackPool:
    """A reward pool whose outcomes arrive when the test lets them (reward by request id)."""

    peak_workers = 1

    def __init__(self, rewards: dict[str, float]) -> None:
        self.rewards, self.held, self.submitted, self.returned = rewards, set(), [], set()

    def submit(self, items):
        self.submitted += [item.request_id for item in items]

    def _outcome(self, request_id):
        reward = self.rewards[request_id]
        return ScoreOutcome(request_id, RewardResult(reward, reward > 0, True), 0.0, 0.0)

    def ready(self, request_ids):
        fresh = [r for r in self.submitted if r in request_ids and r not in self.held and r not in self.returned]
        self.returned.update(fresh)
        return [self._outcome(r) for r in fresh]

    def wait_for(self, request_ids):
        self.held.clear()
        return self.ready(request_ids)

    def shrink_to_recent_need(self):
        pass


class RecordingTrainer:
    """The streamed half of TrainerGroup over one real PolicyTrainer, recording what it is sent."""

    def __init__(self, trainer: PolicyTrainer) -> None:
        self.trainer, self.pieces, self.finished = trainer, [], []

    def accumulate(self, samples):
        self.pieces.append(samples)
        self.trainer.accumulate(samples)

    def finish_step(self, num_tokens_total, num_sequences_total, num_metric_tokens):
        self.finished.append((num_tokens_total, num_sequences_total, num_metric_tokens))
        return self.trainer.finish_step(num_tokens_total, num_sequences_total, num_metric_tokens)


class Tokenizer:
    def decode(self, token_ids, skip_special_tokens=True):
        return " ".join(map(str, token_ids))


def request(name: str) -> Request:
    """"a#1": response 1 of prompt a."""
    problem_id, _, index = name.partition("#")
    return Request.for_problem(problem_id, int(index), (5, 6, 7))


def completion(request_id: str, rng: random.Random) -> Completion:
    response = tuple(rng.randrange(3, 22) for _ in range(rng.randint(2, 12)))
    return request(request_id).completion(response, tuple(-2.0 for _ in response), FinishReason.EOS, 0)


def test_groups_go_to_the_trainer_once_completed_and_scored_and_the_step_equals_the_unstreamed(model_path):
    """Prompts a, b, c, d with 2 responses each; b's rewards are equal (zero advantage: never sent). c's second
    score arrives late: c goes with d's completion; d's second score is late past the end of the round: d is sent
    by `finish`. The step equals train_step on all the groups at once, zero-advantage samples skipped."""
    rng = random.Random(0)
    rewards = {"a#0": 1.0, "a#1": 0.0, "b#0": 1.0, "b#1": 1.0, "c#0": 0.0, "c#1": 1.0, "d#0": 1.0, "d#1": 0.25}
    done = {request_id: completion(request_id, rng) for request_id in rewards}
    problems = [Problem(p, "1+0", "1") for p in "abcd"]
    pool = HeldBackPool(rewards)
    scorer = StreamingScorer(pool, Tokenizer(), problems, lambda problem: None, streaming=True)
    kwargs = dict(train=TrainConfig(lr=1e-5, max_tokens_per_micro_batch=64))  # lr: see the test above
    trainer = RecordingTrainer(PolicyTrainer(model_path, **kwargs))
    step = StreamedStep(trainer, scorer, "grpo", weight_version=0, skip_zero_advantage=True)
    rule = CompletionRule([request(r) for r in rewards], responses_kept=2, prompts_to_complete=4)
    live = LiveRound(None, {}, rule, 0, RoundWork(scorer, step))  # the pipeline's view of this round

    def finish(*request_ids):  # what the pipeline does with each batch of finished responses
        batch = [done[r] for r in request_ids]
        rule.observe(batch)
        live.show(batch)

    finish("a#0", "b#0")
    assert trainer.pieces == []
    finish("a#1", "b#1")
    assert [[s.response_token_ids for s in piece] for piece in trainer.pieces] == \
           [[done["a#0"].token_ids, done["a#1"].token_ids]]  # b: all advantages 0, nothing sent
    pool.held.add("c#1")
    finish("c#0", "d#0")
    finish("c#1")
    assert len(trainer.pieces) == 1  # c completed, its second score has not arrived
    pool.held = {"d#1"}
    finish("d#1")
    assert [len(piece) for piece in trainer.pieces] == [2, 2] and trainer.pieces[1][0].advantage < 0  # c

    scored = scorer.score_round(problems, [c for p in problems for c in rule.kept(p.problem_id)])
    stats = step.finish(scored)
    samples = samples_from_groups(scored.groups, "grpo", weight_version=0)
    trained = [s for s in samples if s.advantage != 0.0]
    assert [len(piece) for piece in trainer.pieces] == [2, 2, 2]  # d after the round
    assert trainer.finished == [(count_response_tokens(samples), 8, count_response_tokens(trained))]
    assert (stats.streamed_groups, stats.num_samples, stats.skipped_samples) == (2, 8, 2)
    assert stats.metrics()["time/stream_overlap_groups"] == 2

    whole = PolicyTrainer(model_path, **kwargs)
    whole_stats = whole.train_step(trained, count_response_tokens(samples), len(samples),
                                   count_response_tokens(trained))
    assert_same_step(stats, whole_stats)
    assert max_weight_diff(whole.full_state_dict(), trainer.trainer.full_state_dict()) < 1e-6


def test_a_round_without_signal_still_takes_a_step_on_one_sample():
    class Scores:
        def scored_group(self, problem_id, kept):
            return None

    class Trainer:
        pieces = []

        def accumulate(self, samples):
            self.pieces.append(samples)

        def finish_step(self, *counts):
            from tailflow.engines.train.trainer import TrainStepStats
            return TrainStepStats(0, 0, 0, 0, 0, 0, 0, counts[0], 0)

    from tailflow.engines.reward.scoring import ScoredGroup, ScoredResponse, ScoredRound
    rng = random.Random(1)
    group = ScoredGroup(Problem("a", "1+0", "1"), tuple(
        ScoredResponse(completion(f"a#{k}", rng), "", 1.0, True) for k in range(2)))
    trainer = Trainer()
    stats = StreamedStep(trainer, Scores(), "grpo", weight_version=0, skip_zero_advantage=True).finish(
        ScoredRound([group], None, 0.0))
    assert [len(piece) for piece in trainer.pieces] == [1] and stats.skipped_samples == 1


def test_config_refuses_streaming_where_it_cannot_be_exact():
    assert load_config(overrides=["train.stream=true", "train.kl_coef=0.1"]).train.stream  # KL: a sum too
    for field in ("ppo_epochs", "mini_batches"):
        with pytest.raises(ConfigError, match=f"train.stream cannot be exact with .*train.{field}"):
            load_config(overrides=["train.stream=true", f"train.{field}=2"])
    with pytest.raises(ConfigError, match="train.stream needs reward.streaming"):
        load_config(overrides=["train.stream=true", "reward.streaming=false"])


# ---- FSDP2 on Ray ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_ranks_streamed_and_started_steps_match_one_process(model_path, ray_cluster):
    """A streamed step on 2 FSDP2 ranks (one piece of a single sample: rank 1 runs a filler) == one process's
    train_step; then a step started without waiting: `ready` turns True, `result` is train_step's.
    Costs ~13 s here (a TrainerGroup of two Ray FSDP2 actors taking a streamed and a started step, beside one in-
    process trainer taking both steps): rank 1's filler only exists with two ranks, which is what the streamed step
    must survive."""
    kwargs = dict(train=TrainConfig(lr=1e-4, kl_coef=0.1, max_grad_norm=0.5, max_tokens_per_micro_batch=64))
    first, second = make_samples(13, seed=3), make_samples(9, seed=4)
    single = PolicyTrainer(model_path, **kwargs)
    single_first = single.train_step(first, count_response_tokens(first), len(first))
    single_second = single.train_step(second, count_response_tokens(second), len(second))

    group = TrainerGroup(model_path, world_size=2, trainer_kwargs=kwargs)
    try:
        for piece in (first[:1], first[1:8], first[8:]):
            group.accumulate(piece)  # returns at once
        streamed = group.finish_step(count_response_tokens(first), len(first), count_response_tokens(first))
        pending = group.start_train_step(second)
        while not pending.ready():
            pass
        started = pending.result()
        weights = group.state_dict()
    finally:
        group.shutdown()
    assert_same_step(streamed, single_first)
    assert started.grad_norm == pytest.approx(single_second.grad_norm, rel=1e-5)
    assert (started.num_samples, started.seconds > 0) == (9, True)
    assert max_weight_diff(weights, single.full_state_dict()) < 1e-5


# ---- end to end -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.long
def test_a_streamed_run_with_tail_batching(prefect_api, tmp_path):
    """Costs ~36 s here (a 2-iteration in-process run through Prefect with Ray, 2 trainer ranks and a rollout
    worker, train.stream on): the overlap of training with rollout is a property of a whole iteration, so it
    needs a real run."""
    from tailflow.engines.runs.commit import read_committed_state
    from tailflow.engines.store import LocalStore
    from tailflow.driver.inputs import shipped_warmstart_dir
    from tailflow.flows.training import rl_training

    config = {
        "model": {"path": str(shipped_warmstart_dir())},
        "data": {"num_train": 64, "num_eval": 8, "prompts_per_step": 4},
        "rollout": {"n": 4, "max_new_tokens": 48, "num_slots": 16},
        "train": {"iterations": 2, "eval_every": 2, "num_workers": 2, "lr": 1e-3, "stream": True},
        "storage": {"uri": str(tmp_path)},
    }
    rl_training(config=config, run_id="stream-test")
    rows = [json.loads(line) for line in (tmp_path / "stream-test" / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1]
    for row in rows:
        assert 0 <= row["time/stream_overlap_groups"] <= 4
        assert row["time/train_exposed"] == row["time/step_train"] and row["actor/optimizer_steps"] == 1
    assert read_committed_state(LocalStore(tmp_path), "stream-test").weight_version == 2
