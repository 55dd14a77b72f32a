"""Who rolled out, and what moved: the log of an elastic rollout group's joins, leaves and migrations.

The group's `Membership` (`membership.py`) records each join and leave here as
it happens, and the group each migration, pause and resume, and the tokens
each worker generated; the flow takes the log once per iteration (`take`) for
the iteration artifact and the metrics. Plain data: nothing here decides
anything.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum


class EventKind(str, Enum):
    JOIN = "join"          # a worker loaded the current weights and takes requests
    LEAVE = "leave"        # a worker left with notice (remove, preemption signal): its requests handed over whole
    LOST = "lost"          # a worker died without notice: its requests continue from the tokens streamed so far
    MIGRATE = "migrate"    # requests resubmitted to the other workers with their tokens so far
    PAUSE = "pause"        # no worker left: requests wait for one to join
    RESUME = "resume"      # a worker joined after a pause


@dataclass(frozen=True)
class MembershipEvent:
    kind: EventKind
    worker_id: int
    """The stable id of the worker (0, 1, ... in join order, never reused); -1 for pause/resume."""
    at_s: float
    """Seconds since the group started."""
    num_requests: int = 0
    """Requests the worker handed over or lost (leave, lost, migrate)."""
    num_tokens: int = 0
    """Response tokens the migrated requests carried over (re-prefilled by their new workers)."""
    weight_version: int | None = None
    """The weights a joining worker loaded before it got work."""
    request_ids: tuple[str, ...] = ()
    """The migrated requests (migrate)."""
    detail: str = ""

    def line(self) -> str:
        what = {EventKind.JOIN: f"joined with weights v{self.weight_version}",
                EventKind.LEAVE: f"left with notice, handing over {self.num_requests} requests",
                EventKind.LOST: f"lost ({self.detail}), {self.num_requests} requests recovered",
                EventKind.MIGRATE: f"{self.num_requests} requests migrated, {self.num_tokens} tokens re-prefilled",
                EventKind.PAUSE: f"rollout paused: no worker left, {self.num_requests} requests wait",
                EventKind.RESUME: "rollout resumed"}[self.kind]
        who = f"worker {self.worker_id}" if self.worker_id >= 0 else "group"
        return f"{self.at_s:8.2f}s  {who}: {what}"


@dataclass(frozen=True)
class MembershipChanges:
    """What changed since the last `take`, and the counters the metrics row reads."""

    events: tuple[MembershipEvent, ...]
    num_workers: int
    migrated_requests: int
    migrated_tokens: int
    tokens_per_s: dict[int, float] = field(default_factory=dict)
    """Per live or departed worker id: tokens it generated / seconds its polls took, since the last take."""

    def metrics(self) -> dict[str, float]:
        row = {"rollout/num_workers": self.num_workers, "rollout/migrated_requests": self.migrated_requests,
               "rollout/migrated_tokens": self.migrated_tokens}
        row.update({f"time/rollout_tokens_per_s/worker_{wid}": rate for wid, rate in self.tokens_per_s.items()})
        return row


class MembershipLog:
    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.events: list[MembershipEvent] = []
        self.tokens: dict[int, int] = {}
        self.busy_s: dict[int, float] = {}

    def record(self, kind: EventKind, worker_id: int = -1, **fields) -> None:
        self.events.append(MembershipEvent(kind, worker_id, time.perf_counter() - self.started, **fields))

    def count_work(self, worker_id: int, num_tokens: int, seconds: float) -> None:
        self.tokens[worker_id] = self.tokens.get(worker_id, 0) + num_tokens
        self.busy_s[worker_id] = self.busy_s.get(worker_id, 0.0) + seconds

    def take(self, num_workers: int) -> MembershipChanges:
        """The events and counters since the last take (which they are then cleared of)."""
        rates = {wid: self.tokens[wid] / self.busy_s[wid] for wid in sorted(self.tokens) if self.busy_s[wid] > 0}
        migrations = [event for event in self.events if event.kind is EventKind.MIGRATE]
        changes = MembershipChanges(tuple(self.events), num_workers, sum(event.num_requests for event in migrations),
                                  sum(event.num_tokens for event in migrations), rates)
        self.events, self.tokens, self.busy_s = [], {}, {}
        return changes
