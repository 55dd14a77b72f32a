"""The round driver (engines/tail/driver.py) against fake rollouts: a stalled rollout is an error naming the
requests it lost, never an endless loop; polls that return nothing while an engine works are normal."""
import pytest

from tailflow.engines.rollout.protocol import Completion, FinishReason, Request
from tailflow.engines.tail.completion import CompletionRule, WaitForAllRule
from tailflow.engines.tail.driver import RolloutStalled, run_round

MAX_POLLS = 100
"""A fake that is polled more often than this fails the test instead of hanging it."""


class ScriptedRollout:
    """Finishes requests per a script of poll results; after the script, every poll returns nothing.

    `busy_until_poll`: `has_unfinished` says True up to this poll count (an engine still decoding), False after
    (the engine has nothing: whatever the driver still waits for was lost)."""

    def __init__(self, script: list[list[str]], busy_until_poll: int) -> None:
        self.script, self.busy_until_poll = script, busy_until_poll
        self.num_polls = 0
        self.aborted: list[str] = []

    def submit(self, requests):
        self.submitted = [request.request_id for request in requests]

    def poll(self, max_steps):
        self.num_polls += 1
        assert self.num_polls <= MAX_POLLS, "the driver kept polling a stalled rollout"
        finished = self.script[self.num_polls - 1] if self.num_polls <= len(self.script) else []
        return [Completion(rid, (1,), (2, 3), (0.0, 0.0), FinishReason.EOS, 0) for rid in finished]

    def abort(self, request_ids):
        self.aborted += request_ids
        return [Completion(rid, (1,), (2,), (0.0,), FinishReason.ABORT, 0) for rid in request_ids]

    def has_unfinished(self):
        return self.num_polls < self.busy_until_poll

    def generate(self, requests):
        raise AssertionError("streamed rounds never call generate")


def requests_for(problem_ids: str, per_prompt: int) -> list[Request]:
    return [Request(f"{p}#{k}", (1,)) for p in problem_ids for k in range(per_prompt)]


def test_a_rollout_that_loses_requests_raises_naming_them():
    requests = requests_for("ab", 2)
    rollout = ScriptedRollout([["a#0"], ["a#1", "b#0"]], busy_until_poll=2)
    with pytest.raises(RolloutStalled) as error:
        run_round(rollout, requests, WaitForAllRule(requests, 2), steps_per_poll=2, on_finished=lambda _: None)
    assert str(error.value).endswith("1 requests in flight but no engine has unfinished work (lost by an engine?): "
                                     "b#1")
    assert rollout.num_polls == 3  # the first empty poll with idle engines


def test_a_short_round_stalled_names_every_request_still_owed():
    requests = requests_for("abc", 2)
    rollout = ScriptedRollout([["a#0"]], busy_until_poll=0)
    with pytest.raises(RolloutStalled, match=r" 4 requests in flight .*: b#0, b#1, c#0, c#1$"):
        run_round(rollout, requests, CompletionRule(requests, 1, 2), steps_per_poll=1)
    assert rollout.aborted == ["a#1"]  # a completed at R0 = 1: its sibling was aborted before the stall


def test_empty_polls_while_an_engine_is_busy_are_waited_out():
    requests = requests_for("ab", 1)
    rollout = ScriptedRollout([[], [], ["b#0"], [], ["a#0"]], busy_until_poll=5)
    result = run_round(rollout, requests, WaitForAllRule(requests, 1), steps_per_poll=1, on_finished=lambda _: None)
    assert [problem_id for problem_id, _ in result.completed] == ["b", "a"]
    assert rollout.num_polls == 5
