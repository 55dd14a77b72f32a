"""Run untrusted, model-written Python and get back a `SandboxResult`; the backend is chosen by name.

`process` (default) works wherever we are root with `unshare`, and degrades to
rlimits-only elsewhere (see `SandboxResult.isolation`). `bwrap` needs
bubblewrap on PATH. `docker` is not implemented.
"""
from __future__ import annotations

from tailflow.engines.reward.sandbox.records import SandboxLimits, SandboxResult

BACKENDS = ("process", "bwrap", "docker")


class SandboxError(ValueError):
    """A backend that does not exist or cannot run here (a user error, one line)."""


def run_python(code: str, stdin: str = "", limits: SandboxLimits = SandboxLimits(),
               backend: str = "process") -> SandboxResult:
    if backend == "process":
        from tailflow.engines.reward.sandbox.process import run_process

        return run_process(code, stdin, limits)
    if backend == "bwrap":
        from tailflow.engines.reward.sandbox.bwrap import bwrap_available, run_bwrap

        if not bwrap_available():
            raise SandboxError("sandbox backend 'bwrap' needs bubblewrap on PATH (apt-get install bubblewrap)")
        return run_bwrap(code, stdin, limits)
    if backend == "docker":
        raise SandboxError("sandbox backend 'docker' is not implemented (it would need a docker engine and the "
                           "docker extra); use 'process' or 'bwrap'")
    raise SandboxError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "SandboxError", "SandboxLimits", "SandboxResult", "run_python"]
