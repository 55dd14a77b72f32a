"""The `bwrap` backend: bubblewrap builds the namespaces; the default wherever `bwrap` works.

What the program sees is what `mount_arguments` lists, in new pid, net, IPC,
UTS and cgroup namespaces, with a scrubbed environment, as uid 65534: an
empty read-only root holding only the allowlisted paths (`allowlist.py`),
read-only at their host paths; a fresh `/proc`, bubblewrap's minimal `/dev`,
and its private scratch tmpfs `/tmp/sandbox` (its cwd, gone with the run)
holding the program read-only as `main.py`. docs/rewards.md, "What the
sandbox enforces", says what each of these stops.

The sandbox's command is the stdlib launcher `inner.py`, passed as source
(its docstring says what it does before the program). Without root,
bubblewrap needs unprivileged user namespaces: the uid is 65534 only inside
the user namespace, and RLIMIT_NPROC counts the caller's own processes; that
path is written but not tested here (the tests run as root).
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from tailflow.engines.reward.sandbox.allowlist import SANDBOX_DIR, interpreter, read_only_view, scratch_bytes
from tailflow.engines.reward.sandbox.cgroup import Cgroup
from tailflow.engines.reward.sandbox.inner import NOBODY, encode_spec
from tailflow.engines.reward.sandbox.process import (NAMESPACE_ISOLATION, child_setup, clean_env, kill_everything,
                                                     launch_spec)
from tailflow.engines.reward.sandbox.records import Launched, SandboxLimits

LAUNCHER_SOURCE = Path(__file__).with_name("inner.py").read_text()


def mount_arguments(workdir: str, limits: SandboxLimits) -> list[str]:
    """The sandbox's whole file tree: allowlisted paths read-only, /proc, /dev, and the scratch dir."""
    view = read_only_view()
    parents = dict.fromkeys(str(parent) for _, target in view.binds for parent in reversed(Path(target).parents))
    mounts = [arg for parent in parents if parent != "/" for arg in ("--perms", "0755", "--dir", parent)]
    mounts += [arg for source, target in view.binds for arg in ("--ro-bind", source, target)]
    for path in view.masked:
        mounts += ["--perms", "0755", "--size", "4096", "--tmpfs", path, "--remount-ro", path]
    # The program's own dir is a size-bounded tmpfs (not host disk): many files cannot fill the host's memory.
    mounts += ["--proc", "/proc", "--dev", "/dev",
               "--perms", "1777", "--size", str(scratch_bytes(limits.max_file_bytes)), "--tmpfs", SANDBOX_DIR,
               "--ro-bind", str(Path(workdir) / "main.py"), f"{SANDBOX_DIR}/main.py", "--remount-ro", "/",
               "--chdir", SANDBOX_DIR]
    return mounts


def bwrap_command(workdir: str, limits: SandboxLimits, cgroup: Cgroup | None = None) -> list[str]:
    namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup"]
    if os.geteuid() != 0:
        namespaces += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    env = [arg for key, value in clean_env(SANDBOX_DIR).items() for arg in ("--setenv", key, value)]
    launcher = [interpreter(), "-I", "-S", "-c", LAUNCHER_SOURCE, "--launch",
                encode_spec(launch_spec(limits, cgroup))]
    return ["bwrap", *namespaces, "--die-with-parent", "--new-session", *mount_arguments(workdir, limits),
            "--clearenv", *env, *launcher]


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


@functools.cache
def bwrap_works() -> bool:
    """bwrap is installed and can build its sandbox here (containers may forbid namespaces); probed once."""
    if not bwrap_available():
        return False
    try:
        from tailflow.engines.reward.sandbox import run_python

        result = run_python("print(6 * 7)", "", SandboxLimits(timeout_s=20, cpu_time_s=10), backend="bwrap")
    except OSError:
        return False
    return result.status == "ok" and result.stdout == "42\n"


def launch_bwrap(workdir: str, limits: SandboxLimits, cgroup: Cgroup | None = None) -> Launched:
    """Start `workdir/main.py` under bubblewrap (`--die-with-parent`: it dies with the calling thread)."""
    proc = subprocess.Popen(bwrap_command(workdir, limits, cgroup), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=child_setup(cgroup, False))
    return Launched(proc, functools.partial(kill_everything, proc), NAMESPACE_ISOLATION, cgroup)

