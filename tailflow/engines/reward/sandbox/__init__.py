"""Run untrusted, model-written Python and get back a `SandboxResult`; the backend is chosen by name.

`auto` (the default) is `bwrap` wherever bubblewrap works, else `process`; each backend's module says what
it builds, and docs/rewards.md ("The sandbox") compares them. Every backend enforces the same `SandboxLimits`
and kills the whole process tree on timeout; `bwrap` and `process` also put the whole sandbox in a cgroup of
its own where one can be made (`cgroup.py`), so its memory and process limits are aggregate.
"""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from tailflow.engines.reward.sandbox.records import Launched, SandboxLimits, SandboxResult

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
            raise SandboxError("reward.sandbox: backend 'bwrap' needs bubblewrap on PATH (apt-get install bubblewrap)")
    if backend == "docker":
        from tailflow.engines.reward.sandbox.docker import docker_available

        problem = docker_available()
        if problem:
            raise SandboxError(f"reward.sandbox: backend 'docker' cannot run here: {problem}")
    return backend


def launch(backend: str, workdir: str, limits: SandboxLimits, die_with_parent: bool = False) -> Launched:
    """Start `workdir/main.py` under a resolved `backend`, with pipes on stdin, stdout and stderr: the one place
    a backend is chosen, for one-shot runs and code-test sessions alike. `die_with_parent`: `launch_process`'s
    (bwrap always dies with the calling thread)."""
    if backend == "docker":
        from tailflow.engines.reward.sandbox.docker import launch_docker

        return launch_docker(workdir, limits)  # docker's own --memory and --pids-limit are aggregate
    from tailflow.engines.reward.sandbox import cgroup

    group = cgroup.create(limits.memory_bytes, limits.max_processes)
    try:
        if backend == "process":
            from tailflow.engines.reward.sandbox.process import launch_process

            launched = launch_process(workdir, limits, die_with_parent, group)
        else:
            from tailflow.engines.reward.sandbox.bwrap import launch_bwrap

            launched = launch_bwrap(workdir, limits, group)
    except BaseException:
        if group is not None:
            group.remove()
        raise
    return replace(launched, isolation=(*launched.isolation, "cgroup")) if group is not None else launched


def run_python(code: str, stdin: str = "", limits: SandboxLimits = SandboxLimits(),
               backend: str = "auto", die_with_parent: bool = False) -> SandboxResult:
    """One run of `code` to its end (or its limits) in a fresh sandbox dir. `die_with_parent`: `launch`'s, for a
    caller that may be killed mid-run and calls from one long-lived thread (an environment process's tool call)."""
    from tailflow.engines.reward.sandbox.process import supervised, to_result

    backend = resolve_backend(backend)
    with tempfile.TemporaryDirectory(prefix="tailflow-sandbox-") as workdir:
        (Path(workdir) / "main.py").write_text(code)
        launched = launch(backend, workdir, limits, die_with_parent)
        return to_result(supervised(launched, stdin.encode(), limits.timeout_s, limits.max_output_bytes),
                         launched.isolation, limits)


__all__ = ["BACKENDS", "SandboxError", "SandboxLimits", "SandboxResult", "default_backend", "launch",
           "resolve_backend", "run_python"]
