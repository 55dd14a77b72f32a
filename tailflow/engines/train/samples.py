"""Scored groups -> training samples: where rewards become advantages.

Groups whose responses all got the same reward carry no GRPO signal (every
advantage is exactly 0.0, `advantages.has_equal_rewards`); they are kept so
token counts match the paper's token-level aggregation, counted in
`num_zero_signal_groups` by the same test, and left out of the forward and
backward by `samples_with_signal` (train.skip_zero_advantage).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import torch

from tailflow.engines.env.trajectory import Trajectory, TrainingRule
from tailflow.engines.reward.scoring import ScoredGroup, ScoredResponse
from tailflow.engines.rollout.protocol import Completion
from tailflow.engines.train.advantages import compute_advantages, has_equal_rewards
from tailflow.engines.train.batch import TrainSample
from tailflow.engines.train.gae import model_token_rewards, whitened, with_gae

if TYPE_CHECKING:
    from tailflow.config import CriticConfig


def samples_from_groups(groups: Sequence[ScoredGroup], estimator: str, *, weight_version: int,
                        max_staleness: int | None = 0, rollout_temperature: float | None = None) -> list[TrainSample]:
    """One TrainSample per response (a multi-turn trajectory: unless `is_trained` says dropped, and then its group
    baseline leaves it out too); groups must all have the same size (R0) and every completion must come
    from weights no older than `weight_version - max_staleness` and no newer than `weight_version`, the
    weights being trained (`check_weight_version`; 0: exactly those weights; None: no lower bound).
    `rollout_temperature`: the
    temperature the completions were sampled at (rollout.temperature), which their log-probs are of; None: not
    known (the off-policy losses then refuse the samples)."""
    if not groups:
        return []
    check_weight_version(groups, weight_version, max_staleness)
    sizes = {len(group.responses) for group in groups}
    if len(sizes) != 1:
        raise ValueError(f"every group must hold the same number of responses, got sizes {sorted(sizes)}")
    if any(not is_trained(response.completion) for group in groups for response in group.responses):
        return trained_trajectory_samples(groups, estimator, rollout_temperature)
    rewards = torch.tensor([group.rewards for group in groups], dtype=torch.float32)  # [G, R]
    advantages = compute_advantages(rewards, estimator)  # [G, R]
    samples = []
    for group, group_advantages in zip(groups, advantages.tolist()):
        for response, advantage in zip(group.responses, group_advantages):
            samples.append(sample_of(response, advantage, rollout_temperature))
    return samples


def gae_samples(groups: Sequence[ScoredGroup], values_of: Callable[[list[TrainSample]], list[tuple[float, ...]]],
                critic: CriticConfig, *, weight_version: int, max_staleness: int | None = 0,
                rollout_temperature: float | None = None, per_turn: bool = True) -> list[TrainSample]:
    """train.advantage gae: one TrainSample per trained response (`is_trained`; no group is needed, and a group
    of one is trained), with per-token advantages, values and returns from the critic's `values_of` (gae.py),
    whitened over the step's model tokens if `critic.whiten_advantages`. `per_turn`: a trajectory's turn
    rewards land at its turns' ends (False: env.reward verifier, its whole reward at the end)."""
    if not groups:
        return []
    check_weight_version(groups, weight_version, max_staleness)
    trained = [response for group in groups for response in group.responses if is_trained(response.completion)]
    plain = [sample_of(response, 0.0, rollout_temperature) for response in trained]
    values = values_of(plain) if plain else []
    samples = [with_gae(sample, model_token_rewards(response, per_turn), sample_values, critic.gamma, critic.lam)
               for sample, response, sample_values in zip(plain, trained, values)]
    return whitened(samples) if critic.whiten_advantages else samples


def sample_of(response: ScoredResponse, advantage: float, rollout_temperature: float | None) -> TrainSample:
    completion = response.completion
    return TrainSample(
        prompt_token_ids=tuple(completion.prompt_token_ids),
        response_token_ids=tuple(completion.token_ids),
        advantage=float(advantage),
        rollout_logprobs=tuple(completion.logprobs),
        reward=float(response.reward),
        rollout_temperature=rollout_temperature,
        response_mask=tuple(completion.response_mask) or None,
    )


def is_trained(completion: Completion) -> bool:
    """A single-turn response always is; a trajectory unless `TRAINING_RULE` drops its stop (the environment
    failed, or it was aborted) or it holds no model token (it ended before the model's first turn)."""
    if completion.outcome is None:
        return True
    return completion.outcome.rule is TrainingRule.TRAINED and any(completion.response_mask)


def trained_trajectory_samples(groups: Sequence[ScoredGroup], estimator: str,
                               rollout_temperature: float | None) -> list[TrainSample]:
    """Groups with dropped trajectories: each group's advantages over its trained members only (a dropped one is
    neither trained nor in its group's baseline: its reward is the environment's doing, not the model's), one
    group at a time; a group with fewer than two trained members gives no sample (one response has no baseline
    to be measured against: every estimator's advantage would be 0 or undefined)."""
    samples = []
    for group in groups:
        kept = [response for response in group.responses if is_trained(response.completion)]
        if len(kept) < 2:
            continue
        advantages = compute_advantages(torch.tensor([[r.reward for r in kept]], dtype=torch.float32), estimator)
        samples += [sample_of(response, advantage, rollout_temperature)
                    for response, advantage in zip(kept, advantages[0].tolist())]
    return samples


def sample_of_trajectory(trajectory: Trajectory, advantage: float, temperature: float | None) -> TrainSample:
    """One multi-turn trajectory as one TrainSample: the prompt, then every action and observation token, with
    the trajectory's mask (True on the model's tokens) so the environment's tokens are read as context and never
    trained. `advantage` comes from its group's rewards (the caller's estimator, over the group's TRAINED
    trajectories only); `temperature` is the one its actions were sampled at (their log-probs are of it).

    A DROPPED trajectory (`TRAINING_RULE`: the environment or an outside stop decided its outcome) is refused:
    training it would credit the model with the environment's failure. One with no model token is refused by
    `TrainSample` itself."""
    if trajectory.rule is not TrainingRule.TRAINED:
        raise ValueError(f"trajectory {trajectory.problem_id}#{trajectory.index} stopped by "
                         f"{trajectory.stop_reason.value}, which TRAINING_RULE drops: it must not be trained")
    return TrainSample(
        prompt_token_ids=trajectory.prompt_token_ids,
        response_token_ids=trajectory.response_token_ids,
        advantage=float(advantage),
        rollout_logprobs=trajectory.rollout_logprobs,
        reward=float(trajectory.reward),
        rollout_temperature=temperature,
        response_mask=trajectory.response_mask,
    )


def samples_with_signal(samples: list[TrainSample], skip_zero_advantage: bool) -> list[TrainSample]:
    """The samples a step backpropagates: all of them, or (`train.skip_zero_advantage` without a KL term) those
    with a non-zero advantage (`has_signal`), which alone have a policy gradient. The one place the filter is
    written: the whole step (`TrainerGroup.start_train_step`) and the streamed one (`StreamedStep`) both use it."""
    return [sample for sample in samples if sample.has_signal] if skip_zero_advantage else samples


def num_zero_signal_groups(groups: Sequence[ScoredGroup]) -> int:
    """Groups whose rewards are all equal: exactly those whose every advantage is 0.0 (the same float32 test)."""
    return sum(1 for group in groups if bool(has_equal_rewards(torch.tensor([group.rewards]))[0]))


def check_weight_version(groups: Sequence[ScoredGroup], weight_version: int, max_staleness: int | None = 0) -> None:
    """Refuse completions generated by weights the step may not train on.

    Synchronous training (max_staleness 0): only the weights being trained. The trainer uses its own weights
    as the proximal policy, so a response sampled from other weights would enter the PPO ratio as if it were
    on-policy: silently off-policy by an unknown number of steps. Every synchronous round runs on freshly
    synced weights, so a mismatch means a lost or repeated weight sync.

    Asynchronous training (max_staleness k > 0): every token must come from weights at most k versions old
    (`Completion.oldest_weight_version` >= weight_version - k, a response continued across updates counts
    from its oldest token) and none from weights newer than the ones trained (a version from the future
    means the trainer and the rollout disagree on which weights they hold).

    No lower bound (max_staleness None): `tail.continue_deferred`, whose long rounds continue responses a short
    round began as many versions back as their prompt waited in the queue (the off-policy loss corrects each
    token by its own behaviour log-prob); versions from the future are still refused.
    """
    if max_staleness is not None and max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    oldest = weight_version - max_staleness if max_staleness is not None else 0
    refused = [response.completion for group in groups for response in group.responses
               if response.completion.oldest_weight_version < oldest
               or response.completion.weight_version > weight_version]
    if not refused:
        return
    listed = ", ".join(f"{completion.request_id} ({versions_of(completion)})" for completion in refused)
    if max_staleness == 0:
        raise ValueError(f"{len(refused)} completions were generated by other weights than the trained version "
                         f"{weight_version}: {listed}")
    raise ValueError(f"{len(refused)} completions fall outside the weight versions {oldest}..{weight_version} "
                     f"(trained version {weight_version}, max_staleness {max_staleness}): {listed}")


def versions_of(completion: Completion) -> str:
    """"version 3", or "versions 1..3" for a response continued across weight updates."""
    if completion.oldest_weight_version == completion.weight_version:
        return f"version {completion.weight_version}"
    return f"versions {completion.oldest_weight_version}..{completion.weight_version}"
