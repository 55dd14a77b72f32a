"""`tailflow workers add/remove` reaching a running run: command files in the run's store.

One object per command under `<run_id>/control/workers/`, named so they sort
in the order written; why a file in the run's store, and who writes and reads
it when: docs/operations.md, "How a command reaches a running run".
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, replace

CONTROL_DIR = "control/workers"


@dataclass(frozen=True)
class WorkerCommand:
    add: int = 0
    """Workers to start (each loads the current weights before it gets work)."""
    remove: int | None = None
    """The id of a worker to remove with notice (its requests are handed over)."""
    issued_by: str = ""

    def __post_init__(self) -> None:
        if (self.add > 0) == (self.remove is not None) or self.add < 0:
            raise ValueError(f"a worker command adds N > 0 workers or removes one id, got add={self.add}, "
                             f"remove={self.remove}")


def control_dir(run_id: str) -> str:
    return f"{run_id}/{CONTROL_DIR}"


def send_worker_command(store, run_id: str, command: WorkerCommand) -> str:
    """Queue `command` for run `run_id`; the key written."""
    issued_by = command.issued_by or f"{os.environ.get('USER', '?')}@{socket.gethostname()} pid {os.getpid()}"
    key = f"{control_dir(run_id)}/{time.time_ns():020d}-{os.getpid()}.json"
    store.write_text(key, json.dumps(asdict(replace(command, issued_by=issued_by))))
    return key


def pending_worker_commands(store, run_id: str) -> list[str]:
    """The command files not yet applied, oldest first."""
    return [name for name in store.list_dir(control_dir(run_id)) if name.endswith(".json")]


class WorkerControl:
    """The run's side: `take` returns the commands written since the last take (and deletes them)."""

    def __init__(self, store, run_id: str, interval_s: float = 1.0) -> None:
        self.store, self.run_id, self.interval_s = store, run_id, interval_s
        self.last_read = float("-inf")

    def take(self) -> list[WorkerCommand]:
        now = time.monotonic()
        if now - self.last_read < self.interval_s:
            return []
        self.last_read = now
        commands = []
        for name in pending_worker_commands(self.store, self.run_id):
            key = f"{control_dir(self.run_id)}/{name}"
            read = self.store.read_versioned(key)
            if read is None or not self.store.delete_if(key, read.tag):
                continue  # taken by another reader, or being written
            commands.append(WorkerCommand(**json.loads(read.data)))
        return commands
