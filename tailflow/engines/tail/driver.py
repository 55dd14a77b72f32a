"""Drive one round on the rollout workers under its completion rule.

The loop is the whole mechanism of tail batching: step the engines a little,
show the rule what finished, abort what it says at once. Finish order is
the engines' step order, never wall-clock time, so a round on one worker is
reproducible bit for bit.

A round that waits for every response (long rounds, the synchronous
baseline) has nothing to abort, so it runs as one batch call per worker:
streaming it would only add a round trip every few engine steps.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from tailflow.engines.rollout.protocol import Completion, Request
from tailflow.engines.tail.completion import CompletionRule, RoundResult, WaitForAllRule


class StreamingRollout(Protocol):
    def generate(self, requests: Sequence[Request]) -> list[Completion]: ...
    def submit(self, requests: Sequence[Request]) -> None: ...
    def poll(self, max_steps: int) -> list[Completion]: ...
    def abort(self, request_ids: Sequence[str]) -> list[Completion]: ...


def run_round(rollout: StreamingRollout, requests: Sequence[Request], rule: CompletionRule,
              steps_per_poll: int) -> RoundResult:
    if isinstance(rule, WaitForAllRule):
        rule.observe(rollout.generate(requests))
        return rule.result()
    rollout.submit(requests)
    aborted_partials: list[Completion] = []
    while not rule.is_done:
        to_abort = rule.observe(rollout.poll(steps_per_poll))
        if to_abort:
            aborted_partials += rollout.abort(to_abort)
    return rule.result(aborted_partials)
