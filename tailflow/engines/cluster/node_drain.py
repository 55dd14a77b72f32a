"""Ray node drains as preemption notices for the rollout workers on those nodes.

Ray's autoscaler (and `ray drain-node`, or a cloud integration reacting to a
spot interruption) drains a node before it goes: the GCS marks it draining,
with the deadline after which it will be killed, and schedules nothing new
on it. The actors on it keep running until then, so a rollout worker there
can still hand its requests over whole. `DrainWatch` asks the GCS which
nodes are draining (at most every `interval_s`: one small RPC) and names the
workers on them; the group treats each as told it will be preempted
(`RolloutGroup._hand_over`), and its replacement lands elsewhere because Ray
places nothing on a draining node.

Ray has no public Python call for this list; `GcsClient.get_draining_nodes`
is the one Ray Serve itself uses to move replicas off draining nodes. If a
Ray version lacks it, the watch says so once and stops asking (workers are
then still moved when their node dies, from the tokens streamed so far).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

DRAIN_CHECK_S = 1.0
"""How often the group asks the GCS for draining nodes (a drain's deadline is typically tens of seconds)."""


@dataclass(frozen=True)
class DrainNotice:
    """A live worker whose node is draining; `deadline_ms` is Ray's (Unix ms, 0: none given)."""

    worker_id: int
    node_id: str
    deadline_ms: int

    def detail(self, now_s: float) -> str:
        """How the leave is recorded: the node and the time left before it is killed."""
        left = f"{max(0.0, self.deadline_ms / 1000 - now_s):.0f} s before it goes" if self.deadline_ms else "no deadline"
        return f"node {self.node_id[:8]} draining ({left})"


def notices_for(node_of: Mapping[int, str], draining: Mapping[str, int]) -> list[DrainNotice]:
    """The workers (id -> node id) on draining nodes (node id -> deadline ms), in worker-id order."""
    return [DrainNotice(worker_id, node_id, int(draining[node_id]))
            for worker_id, node_id in sorted(node_of.items()) if node_id in draining]


def gcs_draining_nodes() -> dict[str, int]:
    """Node id (hex) -> drain deadline (Unix ms, 0: none) of every node the GCS is draining now."""
    import ray

    client = ray._raylet.GcsClient(address=ray.get_runtime_context().gcs_address)
    return dict(client.get_draining_nodes(timeout=5))


class DrainWatch:
    """Asks `query` (the GCS, by default) which nodes drain, at most every `interval_s`."""

    def __init__(self, interval_s: float = DRAIN_CHECK_S, query: Callable[[], dict[str, int]] = gcs_draining_nodes,
                 clock: Callable[[], float] = time.monotonic, say: Callable[[str], Any] = print):
        self.interval_s = interval_s
        self.query = query
        self.clock = clock
        self.say = say
        self.last_asked: float | None = None
        self.is_enabled = True
        self.last_failure = ""

    def notices(self, node_of: Mapping[int, str]) -> list[DrainNotice]:
        """The workers in `node_of` whose node drains; empty between checks and when no worker is placed."""
        if not self.is_enabled or not node_of:
            return []
        now = self.clock()
        if self.last_asked is not None and now - self.last_asked < self.interval_s:
            return []
        self.last_asked = now
        try:
            draining = self.query()
        except AttributeError as error:  # this Ray has no such call: say so once, stop asking
            self.is_enabled = False
            self.say(f"[tailflow] cannot watch Ray node drains ({error}); rollout workers on a drained node "
                     f"are moved only when the node dies")
            return []
        except Exception as error:  # the GCS did not answer in time: ask again at the next check
            failure = f"{type(error).__name__}: {error}"
            if failure != self.last_failure:
                self.say(f"[tailflow] could not ask Ray which nodes drain ({failure}); asking again")
            self.last_failure = failure
            return []
        self.last_failure = ""
        return notices_for(node_of, draining)
