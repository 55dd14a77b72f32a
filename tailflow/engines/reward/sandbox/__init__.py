"""Run untrusted, model-written Python and get back a `SandboxResult`; the backend is chosen by name.

`auto` (the default) is `bwrap` wherever bubblewrap works, else `process`.
`bwrap`: bubblewrap namespaces, read-only root, private temp dir, uid 65534.
`process`: `unshare` namespaces and our own jail as root, degrading to
rlimits-only elsewhere (see `SandboxResult.isolation`). `docker`: for
clusters, through the `docker` client; no Docker engine runs here, so it is
untested. Every backend enforces the same `SandboxLimits` and kills the
whole process tree on timeout.
"""
from __future__ import annotations

from tailflow.engines.reward.sandbox.records import SandboxLimits, SandboxResult

BACKENDS = ("auto", "bwrap", "process", "docker")


class SandboxError(ValueError):
    """A backend that does not exist or cannot run here (a user error, one line)."""


def default_backend() -> str:
    """What `auto` means on this machine: bwrap if it can build its sandbox here, else process."""
    from tailflow.engines.reward.sandbox.bwrap import bwrap_works

    return "bwrap" if bwrap_works() else "process"


def resolve_backend(backend: str) -> str:
    """`auto` resolved; an unknown or unavailable backend is a one-line `SandboxError` naming it."""
    if backend == "auto":
        return default_backend()
    if backend not in BACKENDS:
        raise SandboxError(f"reward.sandbox: unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "bwrap":
        from tailflow.engines.reward.sandbox.bwrap import bwrap_available

        if not bwrap_available():
            raise SandboxError("reward.sandbox: backend 'bwrap' needs bubblewrap and prlimit on PATH "
                               "(apt-get install bubblewrap)")
    if backend == "docker":
        from tailflow.engines.reward.sandbox.docker import docker_available

        problem = docker_available()
        if problem:
            raise SandboxError(f"reward.sandbox: backend 'docker' cannot run here: {problem}")
    return backend


def run_python(code: str, stdin: str = "", limits: SandboxLimits = SandboxLimits(),
               backend: str = "auto") -> SandboxResult:
    backend = resolve_backend(backend)
    if backend == "process":
        from tailflow.engines.reward.sandbox.process import run_process

        return run_process(code, stdin, limits)
    if backend == "bwrap":
        from tailflow.engines.reward.sandbox.bwrap import run_bwrap

        return run_bwrap(code, stdin, limits)
    from tailflow.engines.reward.sandbox.docker import run_docker

    return run_docker(code, stdin, limits)


__all__ = ["BACKENDS", "SandboxError", "SandboxLimits", "SandboxResult", "default_backend", "resolve_backend",
           "run_python"]
