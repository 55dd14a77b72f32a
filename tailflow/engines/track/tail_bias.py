"""What a round's completion rule did to the sample it trains: tail batching's length (and reward) bias.

A short round keeps, for each completed prompt, the first R0 of its R launched
responses to finish (its shortest) and aborts the rest, and defers the prompts
that did not complete (the long ones) to a later long round
(`tail/completion.py`). So the trained responses are shorter than the policy's
on the same prompts. Three means over one round say by how much:

- `tail/kept_length_mean`: the responses trained on.
- `tail/completed_length_mean`: every response launched for the completed
  prompts, an aborted one counted at the tokens it had: what the within-prompt
  selection (keep the first R0 of R) removed. Equal to the kept mean when
  R = R0 (`tail.responses_launched` = `rollout.n`), which keeps every response.
- `tail/launched_length_mean`: every response the round launched, deferred
  prompts included. Aborted responses count their tokens so far, so this is a
  lower bound of the policy's mean length on the round's prompts.

Between prompts, a fourth mean, present when the round deferred any:

- `tail/deferred_length_mean`: every response of the deferred prompts, at the
  tokens it had (a lower bound). Far above the kept mean, it shows the round
  kept the prompts whose draws happened to be short. That selection biases
  the trained sample only if those draws are then thrown away: by default
  they are (the long round draws again), and the waste they leave is
  `tail/wasted_tokens_deferred`; with `tail.continue_deferred` the long round
  continues them (`tail/continued_tokens`), so every launched prompt trains
  its first R0 draws and the selection only decides when; the long round's
  `token/response_length/mean` is then the deferred draws' final lengths, the
  part of the policy's sample the short rounds' kept means left out. With R = R0 the
  kept and completed means are equal by construction, so only this one can
  show the between-prompt selection; a run-level check is the trained mean
  over many rounds against the policy's (tests/test_tail_continue.py does it
  on a simulated LogNormal: continuing trains the policy's mean, discarding
  trains a shorter one).

Reward, where known: the finished responses the round did not keep were scored
only if scoring streamed (`reward.streaming`, the default, scores each response
as it finishes); `tail/unkept_reward_mean` is their mean reward (absent when none
were scored), to read against `reward/mean` of the kept ones. They are not
scored on purpose otherwise: the reward workers' time (a sandbox for code) would
go to responses nothing trains on. Aborted responses have no reward, so no
bound on the policy's reward follows from one round; bench/tail_batching.py
compares whole runs against the synchronous baseline and R = R0.

A long or synchronous round keeps everything it launched: all three means are
equal and nothing is unkept. Pure: a function of the round's `RoundResult`.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from tailflow.engines.tail.completion import RoundResult


@dataclass(frozen=True)
class TailBias:
    kept_length_mean: float
    completed_length_mean: float
    launched_length_mean: float
    unkept_reward_mean: float | None
    """Mean reward of the finished responses scored but not kept; None: none were scored."""
    deferred_length_mean: float | None = None
    """Mean tokens (so far) of the deferred prompts' responses; None: the round deferred none."""

    def metrics(self) -> dict[str, float]:
        row = {"tail/kept_length_mean": self.kept_length_mean,
               "tail/completed_length_mean": self.completed_length_mean,
               "tail/launched_length_mean": self.launched_length_mean}
        if self.deferred_length_mean is not None:
            row["tail/deferred_length_mean"] = self.deferred_length_mean
        if self.unkept_reward_mean is not None:
            row["tail/unkept_reward_mean"] = self.unkept_reward_mean
        return row


def tail_bias(result: RoundResult, unkept_reward_sum: float = 0.0, num_unkept_scored: int = 0) -> TailBias:
    """The round's three length means (tokens; 0.0 for a round that kept nothing) and, when `num_unkept_scored`
    > 0, the mean reward of the unkept responses that were scored (`ScoringStats.unused_reward_sum` / `num_unused`)."""
    kept = [len(c.token_ids) for _, completions in result.completed for c in completions]
    siblings = [n for problem_id, _ in result.completed for n in result.unkept_lengths.get(problem_id, ())]
    deferred = [n for problem_id in result.deferred_problem_ids for n in result.unkept_lengths.get(problem_id, ())]
    return TailBias(
        kept_length_mean=fmean(kept) if kept else 0.0,
        completed_length_mean=fmean(kept + siblings) if kept + siblings else 0.0,
        launched_length_mean=fmean(kept + siblings + deferred) if kept + siblings + deferred else 0.0,
        unkept_reward_mean=unkept_reward_sum / num_unkept_scored if num_unkept_scored > 0 else None,
        deferred_length_mean=fmean(deferred) if deferred else None,
    )
