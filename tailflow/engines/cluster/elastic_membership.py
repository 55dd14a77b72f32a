"""How rollout workers join and leave a `RolloutGroup` (issue 17): the membership half of the group.

A started worker loads the current weights and only then takes requests
(`_admit_joiners`); a worker removed, told it will be preempted (SIGUSR1, or
Ray draining its node: `node_drain.py`) or found dead is retired, its
requests resubmitted to the others from the tokens streamed so far
(`_migrate`), and, unless the group was asked for fewer, a replacement is
started. With no worker left the rollout pauses until one joins. Every change
is an event in `membership.py`'s log.

`ElasticMembership` holds no state of its own: `RolloutGroup.__init__` sets
every attribute it uses (workers, worker_ids, joining, node_of, num_wanted,
...), and it calls the group's `_place` and `_each`. It is a separate class so
that each file reads as one idea: this one who is in the group, the other what
they run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tailflow.engines.cluster import ACTOR_FAILURES
from tailflow.engines.cluster.membership import EventKind, MembershipReport
from tailflow.engines.cluster.node_drain import node_of_actor

PAUSED_WAIT_S = 1.0
"""With no worker left, how long one `poll` waits for a join before returning nothing."""


@dataclass
class Joining:
    """A started worker loading the current weights; `ready` resolves when it holds them."""

    worker_id: int
    worker: Any
    ready: Any


class ElasticMembership:
    """Joins, leaves, replacement and migration for `RolloutGroup` (which sets the attributes used here)."""

    def _spawn(self, options: dict) -> int:
        """Start a worker and have it load the current weights; it joins (`_admit_joiners`) once it has them."""
        model_path, num_slots, max_seq_len, seed, num_threads, device, engine, sleep_mode = self.worker_args
        worker_id, self.next_id = self.next_id, self.next_id + 1
        if not options and self.free_seats:  # a replacement takes the seat (placement-group bundle) left free
            options = self.free_seats.pop(0)
        if "scheduling_strategy" in options:  # a reserved seat; other options (a node's resource) are not seats
            self.seat_of[worker_id] = options
        worker = self.actor_class.options(**options).remote(model_path, num_slots, max_seq_len,
                                                            seed + worker_id * 1_000_003, num_threads, device,
                                                            engine, sleep_mode)
        self.joining.append(Joining(worker_id, worker, self._load_current(worker)))
        return worker_id

    def _load_current(self, worker) -> Any:
        """A ref that is ready once `worker` holds the current weights (those it was built with, if none)."""
        return worker.load_weights.remote(*self.weights) if self.weights is not None else worker.weight_version.remote()

    def _admit_joiners(self, wait: bool = False, announce: bool = True) -> None:
        """Started workers that now hold the current weights take requests (`wait`: all of them, and a worker
        that fails to start raises). One that dies before it joins is not replaced (a bad model path would
        respawn forever)."""
        import ray

        if not self.joining:
            return
        refs = [joining.ready for joining in self.joining]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=None if wait else 0)
        ready = set(ready)
        admitted = [j for j in self.joining if j.ready in ready]
        self.joining = [j for j in self.joining if j.ready not in ready]
        for joining in sorted(admitted, key=lambda j: j.worker_id):
            try:
                ray.get(joining.ready)
                node_id = ray.get(node_of_actor(joining.worker))
            except ACTOR_FAILURES as error:
                if wait:
                    raise
                self.num_wanted -= 1
                self._free_seat(joining.worker_id)
                self.membership.record(EventKind.LOST, joining.worker_id, detail=f"before joining: {error}")
                self.say(f"[tailflow] rollout worker {joining.worker_id} died before joining: {error}")
                continue
            version = self.weights[1] if self.weights is not None else 0
            self.workers.append(joining.worker)
            self.worker_ids.append(joining.worker_id)
            self.node_of[joining.worker_id] = node_id
            if announce:
                self.membership.record(EventKind.JOIN, joining.worker_id, weight_version=version)
                self.say(f"[tailflow] rollout worker {joining.worker_id} joined with weights v{version}; "
                         f"{len(self.workers)} rolling out")
        if self.workers and self.is_paused:
            waiting, self.orphans, self.is_paused = self.orphans, [], False
            self.membership.record(EventKind.RESUME)
            self.say(f"[tailflow] rollout resumed: {len(waiting)} requests go to {len(self.workers)} workers")
            self._place(waiting)

    def _top_up(self) -> None:
        while self.is_elastic and len(self.workers) + len(self.joining) < self.num_wanted:
            self._spawn({})

    def add_workers(self, count: int, wait: bool = False) -> list[int]:
        """`count` more workers; each takes requests once it holds the current weights (`wait`: return only
        then). Their ids."""
        self.num_wanted += count
        added = [self._spawn({}) for _ in range(count)]
        self._admit_joiners(wait)
        return added

    def workers_added(self) -> int:
        """Workers added since the group was built minus those removed (a lost or preempted one is replaced, so
        it does not count): what a run commits so that a resume keeps them (`keep_added`)."""
        return self.num_wanted - self.num_started

    def keep_added(self, added: int) -> None:
        """Start `added` more workers than the group was built with (fewer if negative, removing the newest):
        a resumed or restarted run keeps the workers added or removed while it ran. New ones take requests once
        Ray places them and they hold the current weights."""
        change = max(added, -self.num_started) - self.workers_added()
        if change > 0:
            self.add_workers(change)
        newest_first = sorted([*self.worker_ids, *(j.worker_id for j in self.joining)], reverse=True)
        for worker_id in newest_first[:max(0, -change)]:
            self.remove_worker(worker_id)

    def wait_for_joins(self) -> None:
        """Block until every started worker holds the current weights and takes requests."""
        self._admit_joiners(wait=True)

    def remove_worker(self, worker_id: int) -> None:
        """Worker `worker_id` leaves with notice and is not replaced: its requests are aborted (every token
        kept) and resubmitted to the others, then it is stopped. A worker still joining is stopped at once."""
        import ray

        joining = [j for j in self.joining if j.worker_id == worker_id]
        if joining:
            self.joining.remove(joining[0])
            ray.kill(joining[0].worker)
            self._free_seat(worker_id)
            self.num_wanted -= 1
            self.membership.record(EventKind.LEAVE, worker_id, detail="removed before joining")
            return
        if worker_id not in self.worker_ids:
            raise ValueError(f"no live or joining rollout worker {worker_id}; live: {self.worker_ids}")
        self.num_wanted -= 1
        self._hand_over(worker_id, "removed")

    def _hand_over(self, worker_id: int, detail: str, node_leaves: bool = False) -> None:
        """`node_leaves`: the worker goes because its node does (preemption notice, drain), so its seat there is
        not given to the next worker."""
        import ray

        if worker_id not in self.worker_ids:
            raise ValueError(f"no live rollout worker {worker_id}; live: {self.worker_ids}")
        rank = self.worker_ids.index(worker_id)
        try:
            partials = ray.get(self.workers[rank].abort_all.remote())
        except ACTOR_FAILURES as error:
            self._retire(rank, EventKind.LOST, type(error).__name__, node_leaves)
            return
        self.in_flight.hand_over(partials)
        self._retire(rank, EventKind.LEAVE, detail, node_leaves)

    def _retire(self, rank: int, kind: EventKind, detail: str, node_leaves: bool = False) -> None:
        """Drop worker `rank`, move its requests to the others (from the tokens streamed so far), and start a
        replacement unless the group was asked for fewer workers."""
        import ray

        worker, worker_id = self.workers.pop(rank), self.worker_ids.pop(rank)
        self.node_of.pop(worker_id, None)
        moved = [rid for rid, r in self.worker_of.items() if r == rank]
        self.worker_of = {rid: (r - 1 if r > rank else r) for rid, r in self.worker_of.items() if r != rank}
        ray.kill(worker)
        self._free_seat(worker_id, reusable=not node_leaves)
        self.membership.record(kind, worker_id, num_requests=len(moved), detail=detail)
        self.say(f"[tailflow] rollout worker {worker_id} {'left' if kind is EventKind.LEAVE else 'was lost'} "
                 f"({detail}); {len(moved)} requests move to the {len(self.workers)} others")
        self._top_up()
        self._migrate(worker_id, moved)

    def _free_seat(self, worker_id: int, reusable: bool = True) -> None:
        """A gone worker's placement-group seat (on GPUs: its share of a reserved GPU) goes to the next worker
        started, unless not `reusable` (its node is leaving); a worker started outside any placement group
        leaves none. (A lost worker's seat is reused too: if its node died, Ray moves the bundle to another
        node and the replacement waits for it there.)"""
        seat = self.seat_of.pop(worker_id, None)
        if seat and reusable:
            self.free_seats.append(seat)

    def _migrate(self, worker_id: int, request_ids: list[str]) -> None:
        continued = self.in_flight.continued(request_ids)
        if continued:
            self.membership.record(EventKind.MIGRATE, worker_id, num_requests=len(continued),
                                   num_tokens=sum(len(r.prefix.token_ids) for r in continued if r.prefix),
                                   request_ids=tuple(r.request_id for r in continued))
            self._place(continued)

    def _say_paused(self, num_waiting: int) -> None:
        self.is_paused = True
        self.membership.record(EventKind.PAUSE, num_requests=num_waiting)
        starting = (f"{len(self.joining)} starting (they join once Ray can place them)" if self.joining
                    else "none starting: `tailflow workers add RUN_ID N`")
        self.say(f"[tailflow] rollout paused: no rollout worker left, {num_waiting} requests wait for one to join; "
                 f"{starting}")

    def apply_control(self) -> None:
        """Apply the `tailflow workers add/remove` commands waiting in the run's control channel, if any."""
        if self.control is None:
            return
        for command in self.control.take():
            if command.add:
                self.add_workers(command.add)
            elif command.remove is not None:
                if command.remove in self.worker_ids or any(j.worker_id == command.remove for j in self.joining):
                    self.remove_worker(command.remove)
                else:
                    self.say(f"[tailflow] workers remove {command.remove}: no such live worker ({self.worker_ids})")

    def take_membership(self) -> MembershipReport:
        """Joins, leaves and migrations since the last take, and their counters (once per iteration)."""
        return self.membership.take(len(self.workers))

    def _leave_draining_nodes(self) -> None:
        """Workers on a node Ray is draining hand their requests over and leave, as with a preemption notice;
        their replacements go where Ray places them (never on a draining node)."""
        if not self.is_elastic:
            return
        for notice in self.drain_watch.notices(self.node_of):
            if notice.worker_id in self.worker_ids:
                self._hand_over(notice.worker_id, notice.detail(time.time()), node_leaves=True)

    def _wait_for_workers(self, num_waiting: int) -> None:
        """No worker: say so (once per pause), then wait up to PAUSED_WAIT_S for one to join."""
        if not self.is_paused:
            self._say_paused(num_waiting)
        deadline = time.perf_counter() + PAUSED_WAIT_S
        while not self.workers and time.perf_counter() < deadline:
            time.sleep(0.1)
            self.apply_control()
            self._admit_joiners()
        if self.workers:
            self.is_paused = False
