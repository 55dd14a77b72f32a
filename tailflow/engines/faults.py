"""Crash points for the durability tests: deterministic failures at named places in an iteration.

`TAILFLOW_FAULT="<what>@<iteration>[,...]"` arms them; unset (always, outside
tests), every call is a dictionary lookup that does nothing. What:

- `crash-<phase>`: SIGKILL this (driver) process at `<phase>` of that iteration:
  the whole run dies as on a lost node, with no chance to clean up.
- `raise-<phase>`: raise `InjectedFault` there: the flow fails like any bug or
  outage in the driver, and Prefect's flow retry takes over.
- `kill-rollout` / `kill-trainer` / `kill-reward`: SIGKILL the process of
  rollout worker 0 / trainer rank 0 / reward worker 0 at the first phase that
  can reach it (a dead actor inside a live run).

Phases: `rollout`, `reward`, `train`, `sync`, `checkpoint` (checkpoint stored,
state not yet), `commit` (state stored, `latest` not yet). Each armed fault
fires once per process, so a retried iteration does not fail again; with
`TAILFLOW_FAULT_RECORD=<dir>` once per directory (a file per fault fired), so a
Retried flow run, a new process with the same environment, does not either.
"""
from __future__ import annotations

import os
import signal
from typing import Callable

ENV = "TAILFLOW_FAULT"
RECORD_ENV = "TAILFLOW_FAULT_RECORD"


class InjectedFault(RuntimeError):
    """What `raise-<phase>` raises."""


def armed(name: str) -> bool:
    """Whether `name` (`crash-train@3`, `kill-rollout@1`) is in the spec; if so it is disarmed (taken out of
    TAILFLOW_FAULT in this process's environment: the record of what fired, no state of this module's own)."""
    wanted = [item.strip() for item in os.environ.get(ENV, "").split(",") if item.strip()]
    if name not in wanted:
        return False
    os.environ[ENV] = ",".join(item for item in wanted if item != name)
    record = os.environ.get(RECORD_ENV)
    if record:
        try:  # the file is the record across processes; creating it is the test-and-set
            os.makedirs(record, exist_ok=True)
            open(os.path.join(record, name), "x").close()
        except FileExistsError:
            return False
    return True


def fault_point(phase: str, iteration: int, kill_actor: dict[str, Callable[[], int]] | None = None) -> None:
    """Fire what is armed for `phase` of `iteration`. `kill_actor` maps `kill-rollout` / `kill-trainer` to a
    function returning that actor's pid, for the phases where the actor is busy."""
    if not os.environ.get(ENV):
        return
    if armed(f"crash-{phase}@{iteration}"):
        print(f"[tailflow] fault injection: SIGKILL at {phase} of iteration {iteration}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if armed(f"raise-{phase}@{iteration}"):
        raise InjectedFault(f"fault injection: raised at {phase} of iteration {iteration}")
    for kind, pid_of in (kill_actor or {}).items():
        if armed(f"{kind}@{iteration}"):
            pid = pid_of()
            print(f"[tailflow] fault injection: {kind} (pid {pid}) at {phase} of iteration {iteration}", flush=True)
            os.kill(pid, signal.SIGKILL)
