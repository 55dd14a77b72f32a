"""The rollout pipeline driving one synchronous round (alpha 0) against fake rollouts: a stalled rollout is an
error naming the requests it lost, never an endless loop; polls that return nothing while an engine works are
normal; an unwatched wait-for-all round is one batch call, a watched one streams."""
import pytest

from one_round import Watching, take_one_round
from tailflow.engines.rollout.protocol import FinishReason, Request
from tailflow.engines.tail.pipeline import RolloutStalled
from tailflow.engines.tail.planner import RoundKind

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
        self.requests: dict[str, Request] = {}
        self.generated = 0

    def submit(self, requests):
        self.requests.update((request.request_id, request) for request in requests)

    def poll(self, max_steps):
        self.num_polls += 1
        assert self.num_polls <= MAX_POLLS, "the driver kept polling a stalled rollout"
        finished = self.script[self.num_polls - 1] if self.num_polls <= len(self.script) else []
        return [self.requests[rid].completion((2, 3), (0.0, 0.0), FinishReason.EOS, 0) for rid in finished]

    def abort(self, request_ids):
        self.aborted += request_ids
        return [self.requests[rid].completion((2,), (0.0,), FinishReason.ABORT, 0) for rid in request_ids]

    def has_unfinished(self):
        return self.num_polls < self.busy_until_poll

    def generate(self, requests):
        self.generated += 1
        return [request.completion((2,), (0.0,), FinishReason.EOS, 0) for request in requests]

    def stats(self):
        return []


def requests_for(problem_ids: str, per_prompt: int) -> list[Request]:
    return [Request.for_problem(p, k, (1,)) for p in problem_ids for k in range(per_prompt)]


def test_a_rollout_that_loses_requests_raises_naming_them():
    requests = requests_for("ab", 2)
    rollout = ScriptedRollout([["a#0"], ["a#1", "b#0"]], busy_until_poll=2)
    with pytest.raises(RolloutStalled) as error:
        take_one_round(rollout, requests, RoundKind.SYNC, 2, 2, Watching())
    assert str(error.value).endswith("1 requests in flight but no engine has unfinished work (lost by an engine?): "
                                     "b#1")
    assert rollout.num_polls == 3  # the first empty poll with idle engines


def test_a_short_round_stalled_names_every_request_still_owed():
    requests = requests_for("abc", 2)
    rollout = ScriptedRollout([["a#0"]], busy_until_poll=0)
    with pytest.raises(RolloutStalled, match=r" 4 requests in flight .*: b#0, b#1, c#0, c#1$"):
        take_one_round(rollout, requests, RoundKind.SHORT, 1, 2)
    assert rollout.aborted == ["a#1"]  # a completed at R0 = 1: its sibling was aborted before the stall


def test_empty_polls_while_an_engine_is_busy_are_waited_out():
    requests = requests_for("ab", 1)
    rollout = ScriptedRollout([[], [], ["b#0"], [], ["a#0"]], busy_until_poll=5)
    watching = Watching()
    taken = take_one_round(rollout, requests, RoundKind.SYNC, 1, 2, watching)
    assert [problem_id for problem_id, _ in taken.result.completed] == ["b", "a"]
    assert rollout.num_polls == 5 and rollout.generated == 0
    assert watching.seen == ["b#0", "a#0"]  # each response shown as it finished


def test_an_unwatched_wait_for_all_round_is_one_batch_call_and_a_short_round_never_is():
    requests = requests_for("ab", 2)
    rollout = ScriptedRollout([], busy_until_poll=0)
    taken = take_one_round(rollout, requests, RoundKind.SYNC, 2, 2)
    assert rollout.generated == 1 and rollout.num_polls == 0
    assert [c.request_id for c in taken.completions] == ["a#0", "a#1", "b#0", "b#1"]
    short = ScriptedRollout([["a#0", "b#0", "a#1"]], busy_until_poll=1)
    taken = take_one_round(short, requests_for("abc", 2), RoundKind.SHORT, 1, 2)
    assert short.generated == 0 and taken.result.deferred_problem_ids == ["c"]
    # a#1 finished in the poll that ended the round, after its prompt had completed: shown to the rule as waste
    assert [c.request_id for c in taken.finished] == ["a#0", "b#0", "a#1"]
