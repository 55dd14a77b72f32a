"""The records that cross the sandbox boundary: what a run may use, and what came back."""
from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tailflow.engines.reward.sandbox.cgroup import Cgroup


@dataclass(frozen=True)
class SandboxLimits:
    """Bounds on one run of untrusted code; every one is enforced by the kernel, not by trust.

    `max_output_bytes` bounds stdout and stderr each: the reader stops there and
    kills the run, so printing 1 GB costs at most that much parent memory.
    """

    timeout_s: float = 10.0
    cpu_time_s: int = 10
    memory_bytes: int = 1 << 30
    max_processes: int = 32
    max_file_bytes: int = 16 << 20
    max_output_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in (limit.name for limit in fields(self)):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class SandboxResult:
    """One run's outcome.

    status: "ok" (exit 0), "error" (non-zero exit, e.g. an uncaught exception),
    "timeout" (wall clock ran out; everything was killed), "killed" (a signal:
    CPU or output limit, or the code killed itself). `isolation` names the
    protections that were actually in force, so a weaker fallback is visible.
    """

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    isolation: tuple[str, ...] = field(default_factory=tuple)
    detail: str = ""


@dataclass(frozen=True)
class Launched:
    """A sandboxed process just started: its handle, how to kill everything it started, the protections in
    force (see `SandboxResult.isolation`) and its cgroup (None where there is none: the rlimits fallback)."""

    proc: subprocess.Popen
    kill: Callable[[], None]
    isolation: tuple[str, ...]
    cgroup: Cgroup | None = None

    def end(self) -> None:
        """Kill everything it started, wait for it, remove its cgroup (nothing is left in it) and close its stdin
        and stdout (stderr is the caller's: a session drains it in a thread)."""
        self.kill()
        self.proc.wait()
        if self.cgroup is not None:
            self.cgroup.remove()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:  # unflushed input to a dead program: a broken pipe, nothing to keep
                pass
