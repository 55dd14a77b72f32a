"""The `process` backend: a scrubbed `python3 -I -S`, kernel rlimits, and Linux namespaces when we may.

With root and `unshare`, the program runs behind `jail.py` in new net, pid and
mount namespaces (no network, cannot see or signal the host, host /tmp, /root
and $HOME hidden, uid 65534). Otherwise it falls back to rlimits plus its own
session, and the result's `isolation` says so. That fallback cannot stop a
daemon that setsid()s out of the process group, nor a read of files the
parent's user can read: it is for trusted-ish code only.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from tailflow.engines.reward.sandbox import jail
from tailflow.engines.reward.sandbox.records import Launched, SandboxLimits, SandboxResult
from tailflow.engines.reward.sandbox.supervise import Outcome, supervise

UNSHARE = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount"]
NAMESPACE_ISOLATION = ("rlimits", "session", "clean-env", "net-ns", "pid-ns", "mount-ns", "uid-nobody")
FALLBACK_ISOLATION = ("rlimits", "session", "clean-env")
HIDDEN_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/root", "/home")


def interpreter() -> str:
    return os.path.realpath(sys.executable)


@functools.cache
def namespaces_available() -> bool:
    """Root and a working `unshare` (checked once: containers often forbid it)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=10)
    return probe.returncode == 0


def clean_env(home: str) -> dict[str, str]:
    """Nothing of the parent's environment (credentials live there) except a plain PATH."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home,
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", "PYTHONHASHSEED": "0"}


def jail_command(workdir: str, limits: SandboxLimits) -> list[str]:
    home = os.environ.get("HOME", "")
    masks = [*HIDDEN_DIRS, *([home] if home not in ("", "/") else [])]
    spec = {"code_path": str(Path(workdir) / "main.py"), "workdir": workdir, "interpreter": interpreter(),
            "expose": [os.path.realpath(sys.base_prefix)], "masks": masks,
            "tmpfs_bytes": limits.max_file_bytes, "limits": asdict(limits)}
    return [*UNSHARE, "--", interpreter(), "-I", "-S", jail.__file__, json.dumps(spec)]


def namespace_init(pid: int) -> list[int]:
    """unshare's child: PID 1 of the sandbox's pid namespace; killing it kills the whole namespace."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def kill_everything(proc: subprocess.Popen, in_namespace: bool = True) -> None:
    """SIGKILL the namespace's init (the kernel then kills every process in it), then the process group.

    Waiting for unshare between the two means that, on return, the namespace is
    empty: unshare only exits once its child, PID 1, is fully gone, and PID 1 only
    finishes exiting after the kernel has reaped everything else in the namespace.
    """
    inits = namespace_init(proc.pid) if in_namespace else []
    for pid in inits:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if inits:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session made its pid the group id
    except ProcessLookupError:
        pass


def to_result(outcome: Outcome, isolation: tuple[str, ...], limits: SandboxLimits) -> SandboxResult:
    code = outcome.returncode
    if outcome.timed_out:
        status, detail = "timeout", f"wall clock {limits.timeout_s}s exceeded; all processes killed"
    elif outcome.overflowed:
        status, detail = "killed", f"output over {limits.max_output_bytes} bytes; killed"
    elif code is not None and (code < 0 or code > 128):
        sig = -code if code < 0 else code - 128
        status, detail = "killed", f"killed by signal {signal.Signals(sig).name if sig < 65 else sig}"
    else:
        status, detail = ("ok" if code == 0 else "error"), ""
    decode = lambda data: data.decode("utf-8", errors="replace")  # noqa: E731
    return SandboxResult(status, code, decode(outcome.stdout), decode(outcome.stderr), round(outcome.duration_s, 3),
                         outcome.stdout_truncated, outcome.stderr_truncated, isolation, detail)


def launch_process(workdir: str, limits: SandboxLimits, die_with_parent: bool = False) -> Launched:
    """Start `workdir/main.py` in the jail (or, without namespaces, under rlimits in its own session).

    `die_with_parent`: the kernel kills the sandbox when the calling thread dies (PR_SET_PDEATHSIG), for a
    long-lived session whose owner may itself be killed; not for one-shot runs from a thread pool, whose
    threads come and go.
    """
    in_namespace = namespaces_available()
    if in_namespace:
        command, isolation = jail_command(workdir, limits), NAMESPACE_ISOLATION
        limit = None
    else:
        command = [interpreter(), "-I", "-S", str(Path(workdir) / "main.py")]
        isolation, limit = FALLBACK_ISOLATION, functools.partial(jail.apply_limits, asdict(limits))
    preexec = functools.partial(prepare_child, limit, die_with_parent) if limit or die_with_parent else None
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=workdir, env=clean_env(workdir), start_new_session=True, preexec_fn=preexec)
    return Launched(proc, functools.partial(kill_everything, proc, in_namespace), isolation)


def prepare_child(limit, die_with_parent: bool) -> None:
    """In the child before exec: rlimits (fallback only) and the parent-death signal."""
    if die_with_parent:
        jail.libc.prctl(jail.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if limit is not None:
        limit()


def finish(launched: Launched, stdin: str, limits: SandboxLimits) -> SandboxResult:
    """Feed stdin, collect the output under the limits, kill what is left: a one-shot run's whole life."""
    proc = launched.proc
    try:
        outcome = supervise(proc, stdin.encode(), limits.timeout_s, limits.max_output_bytes, launched.kill)
    finally:
        launched.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
    return to_result(outcome, launched.isolation, limits)
