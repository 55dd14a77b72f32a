"""The `process` backend: `unshare` namespaces and our own jail as root; rlimits only where namespaces cannot be had.

With root and `unshare`, the program runs behind `jail.py` in new net, pid,
ipc, uts, cgroup and mount namespaces: no network, no host process or SysV/
POSIX IPC object in sight, and an empty root holding only the allowlisted
paths (`allowlist.py`), as uid 65534. Otherwise it falls back to rlimits plus
its own session, and the result's `isolation` says so. That fallback cannot
stop a daemon that setsid()s out of the process group, nor a read of files
the parent's user can read: it is for trusted-ish code only.
"""
from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import subprocess
from dataclasses import asdict
from pathlib import Path

from tailflow.engines.reward.sandbox import inner
from tailflow.engines.reward.sandbox.allowlist import SANDBOX_DIR, interpreter, read_only_view, scratch_bytes
from tailflow.engines.reward.sandbox.cgroup import Cgroup
from tailflow.engines.reward.sandbox.records import Launched, SandboxLimits, SandboxResult
from tailflow.engines.reward.sandbox.supervise import Outcome, supervise

UNSHARE = ["unshare", "--net", "--pid", "--ipc", "--uts", "--cgroup", "--fork", "--kill-child", "--mount-proc",
           "--mount"]
NAMESPACE_ISOLATION = ("rlimits", "session", "clean-env", "net-ns", "pid-ns", "ipc-ns", "mount-ns", "uid-nobody",
                       "allowlist-root")
FALLBACK_ISOLATION = ("rlimits", "session", "clean-env")
JAIL_SOURCE = "\n".join(Path(__file__).with_name(name).read_text() for name in ("inner.py", "jail.py"))
"""What PID 1 of the process sandbox runs: the in-sandbox launcher, then the jail."""
PR_SET_PDEATHSIG = 1
LIBC = ctypes.CDLL(None, use_errno=True)
"""Loaded here, not in a child between fork and exec (a dlopen there could wait on a lock another thread held)."""
NPROC_BACKSTOP = 4096
"""RLIMIT_NPROC where a cgroup bounds the sandbox's processes: the per-uid count is shared by every sandbox on the
host, so the sandbox's own limit is the cgroup's, and this only stops a runaway that escaped it."""


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
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", "PYTHONUTF8": "1", "PYTHONHASHSEED": "0"}


def inside_limits(limits: SandboxLimits, cgroup: Cgroup | None) -> dict:
    """The rlimits the in-sandbox launcher applies (`inner.apply_limits`)."""
    return dict(asdict(limits), nproc=limits.max_processes if cgroup is None else NPROC_BACKSTOP)


def launch_spec(limits: SandboxLimits, cgroup: Cgroup | None) -> dict:
    """What the in-sandbox launcher needs, for both namespace backends."""
    return {"scratch": SANDBOX_DIR, "limits": inside_limits(limits, cgroup)}


def jail_command(workdir: str, limits: SandboxLimits, cgroup: Cgroup | None) -> list[str]:
    view = read_only_view()
    spec = dict(launch_spec(limits, cgroup), code_path=str(Path(workdir) / "main.py"), root=workdir,
                binds=[list(bind) for bind in view.binds], masked=list(view.masked),
                scratch_bytes=scratch_bytes(limits.max_file_bytes))
    return [*UNSHARE, "--", interpreter(), "-I", "-S", "-c", JAIL_SOURCE, inner.encode_spec(spec)]


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


def launch_process(workdir: str, limits: SandboxLimits, die_with_parent: bool = False,
                   cgroup: Cgroup | None = None) -> Launched:
    """Start `workdir/main.py` in the jail (or, without namespaces, under rlimits in its own session).

    `die_with_parent`: the kernel kills the sandbox when the calling thread dies (PR_SET_PDEATHSIG), for a
    long-lived session whose owner may itself be killed; not for one-shot runs from a thread pool, whose
    threads come and go.
    """
    in_namespace = namespaces_available()
    if in_namespace:
        command, isolation, limit = jail_command(workdir, limits, cgroup), NAMESPACE_ISOLATION, None
        env = clean_env(SANDBOX_DIR)
    else:
        command = [interpreter(), "-I", "-S", str(Path(workdir) / "main.py")]
        isolation, env = FALLBACK_ISOLATION, clean_env(workdir)
        limit = functools.partial(inner.apply_limits, inside_limits(limits, cgroup))
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=workdir, env=env, start_new_session=True,
                            preexec_fn=child_setup(cgroup, die_with_parent, limit))
    return Launched(proc, functools.partial(kill_everything, proc, in_namespace), isolation, cgroup)


def child_setup(cgroup: Cgroup | None, die_with_parent: bool, limit=None):
    """The preexec_fn of a sandbox's first process (None when it has nothing to do): join the sandbox's cgroup
    (so everything it starts is counted there), the parent-death signal, rlimits (the no-namespace fallback)."""
    if cgroup is None and not die_with_parent and limit is None:
        return None

    def setup() -> None:
        if cgroup is not None:
            cgroup.join()
        if die_with_parent:
            LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if limit is not None:
            limit()
    return setup


def supervised(launched: Launched, stdin: bytes, timeout_s: float, max_output_bytes: int) -> Outcome:
    """Feed stdin, collect the output within the bounds, kill what is left and release it: a process's whole
    life once launched."""
    try:
        return supervise(launched.proc, stdin, timeout_s, max_output_bytes, launched.kill)
    finally:
        launched.end()
        launched.proc.stderr.close()
