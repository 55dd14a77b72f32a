"""Drive one round on the rollout workers under its completion rule.

The loop is the whole mechanism of tail batching: step the engines a little,
show the rule what finished, abort what it says at once. Finish order is
the engines' step order, never wall-clock time, so a round on one worker is
reproducible bit for bit.

A round that waits for every response (long rounds, the synchronous
baseline) has nothing to abort, so it runs as one batch call per worker:
streaming it would only add a round trip every few engine steps. Unless
someone wants each response as it finishes (`on_finished`, streamed
scoring): then every round streams. On one worker the engine runs the same
steps either way, so the completions are identical.

A poll that returns nothing is normal while engines decode; one that returns
nothing while no engine has unfinished work, yet the rule still waits for
requests, would repeat forever (requests lost by an engine): the driver
raises `RolloutStalled` naming them instead.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

from tailflow.engines.rollout.protocol import Completion, EngineStats, Request
from tailflow.engines.tail.completion import CompletionRule, RoundResult, WaitForAllRule


class StreamingRollout(Protocol):
    def generate(self, requests: Sequence[Request]) -> list[Completion]: ...
    def submit(self, requests: Sequence[Request]) -> None: ...
    def poll(self, max_steps: int) -> list[Completion]: ...
    def abort(self, request_ids: Sequence[str]) -> list[Completion]: ...
    def has_unfinished(self) -> bool:
        """Any engine still holds a request (running or waiting)."""
    def stats(self) -> list[EngineStats]: ...


class RolloutStalled(RuntimeError):
    """Requests are in flight for the round but no engine is working on them."""


def run_round(rollout: StreamingRollout, requests: Sequence[Request], rule: CompletionRule,
              steps_per_poll: int, on_finished: Callable[[list[Completion]], None] | None = None) -> RoundResult:
    """`on_finished` sees every batch of finished requests (in finish order) right after the rule does."""
    if isinstance(rule, WaitForAllRule) and on_finished is None:
        rule.observe(rollout.generate(requests))
        return rule.result()
    rollout.submit(requests)
    aborted_partials: list[Completion] = []
    while not rule.is_done:
        finished = rollout.poll(steps_per_poll)
        if not finished and not rollout.has_unfinished():
            raise stalled_error(rule)
        to_abort = rule.observe(finished)
        if to_abort:
            aborted_partials += rollout.abort(to_abort)
        if on_finished is not None and finished:
            aborted = set(to_abort)
            on_finished([c for c in finished if c.request_id not in aborted])
    return rule.result(aborted_partials)


def stalled_error(rule: CompletionRule) -> RolloutStalled:
    in_flight = rule.in_flight_request_ids()
    return RolloutStalled(f"rollout stalled: {len(in_flight)} requests in flight but no engine has unfinished work "
                         f"(lost by an engine?): {', '.join(in_flight)}")
