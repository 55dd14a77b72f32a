"""The `bwrap` backend: bubblewrap builds the namespaces; the default wherever `bwrap` works.

What the program sees: `/` read-only; empty tmpfs over /tmp, /root, /home and
$HOME (the host's secrets and scratch space), with only the interpreter's
prefix bound back read-only; a private writable directory `/tmp/sandbox`
(its cwd: a fresh tmpfs of `SCRATCH_FILES` x max_file_bytes, gone with the
run, holding the program read-only as `main.py`); no network (new net namespace, loopback
down); its own pid namespace (it cannot see or signal host processes, and
when the namespace's init dies every process in it dies, so a setsid daemon
cannot outlive the run); a scrubbed environment; uid 65534.

Limits: `prlimit` sets CPU time, address space, process count, file size
and no core dumps; `setpriv` then drops to uid/gid 65534 with no
supplementary groups and no_new_privs. As root the uid drop is a real one
(RLIMIT_NPROC then counts uid 65534's processes, shared by concurrent
runs). Without root, bubblewrap needs unprivileged user namespaces: the uid
is 65534 only inside the user namespace, and RLIMIT_NPROC counts the
caller's own processes; that path is written but not tested here (the
tests run as root).
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tailflow.engines.reward.sandbox.process import clean_env, interpreter, kill_everything
from tailflow.engines.reward.sandbox.records import Launched, SandboxLimits

ISOLATION = ("rlimits", "session", "clean-env", "net-ns", "pid-ns", "mount-ns", "uid-nobody", "ro-root")
SANDBOX_DIR = "/tmp/sandbox"
NOBODY = "65534"
SCRATCH_FILES = 4


def limits_command(limits: SandboxLimits) -> list[str]:
    cpu = limits.cpu_time_s
    return ["prlimit", f"--cpu={cpu}:{cpu + 1}", f"--as={limits.memory_bytes}", f"--nproc={limits.max_processes}",
            f"--fsize={limits.max_file_bytes}", "--core=0"]


def scratch_bytes(limits: SandboxLimits) -> int:
    """Size of the private writable dir: a few files of the largest size one file may have."""
    return SCRATCH_FILES * limits.max_file_bytes


def bwrap_command(workdir: str, limits: SandboxLimits) -> list[str]:
    prefix = os.path.realpath(sys.base_prefix)
    home = os.environ.get("HOME", "/root")
    hidden = ["/tmp", "/root", "/home", *([home] if home not in ("", "/") else [])]
    is_root = os.geteuid() == 0
    namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup"]
    if not is_root:
        namespaces += ["--unshare-user", "--uid", NOBODY, "--gid", NOBODY]
    mounts = ["--ro-bind", "/", "/"]
    for path in dict.fromkeys(hidden):
        if os.path.isdir(path):
            mounts += ["--tmpfs", path]
    for parent in reversed(Path(prefix).parents):  # inside a hidden dir, bwrap would create them 0700
        if any(parent != Path(h) and parent.is_relative_to(h) for h in hidden):
            mounts += ["--perms", "0755", "--dir", str(parent)]
    # The program's own dir is a size-bounded tmpfs (not host disk): many files cannot fill the host's /tmp.
    mounts += ["--ro-bind", prefix, prefix, "--proc", "/proc", "--dev", "/dev",
               "--perms", "1777", "--size", str(scratch_bytes(limits)), "--tmpfs", SANDBOX_DIR,
               "--ro-bind", str(Path(workdir) / "main.py"), f"{SANDBOX_DIR}/main.py", "--chdir", SANDBOX_DIR]
    env = [arg for key, value in clean_env(SANDBOX_DIR).items() for arg in ("--setenv", key, value)]
    drop = (["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs"]
            if is_root else [])
    return ["bwrap", *namespaces, "--die-with-parent", "--new-session", *mounts, "--clearenv", *env,
            *limits_command(limits), *drop, interpreter(), "-I", "-S", "main.py"]


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None and shutil.which("prlimit") is not None


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


def launch_bwrap(workdir: str, limits: SandboxLimits) -> Launched:
    """Start `workdir/main.py` under bubblewrap (`--die-with-parent`: it dies with the calling thread)."""
    if not bwrap_available():
        raise RuntimeError("sandbox backend 'bwrap' needs bubblewrap and prlimit on PATH "
                           "(apt-get install bubblewrap util-linux)")
    proc = subprocess.Popen(bwrap_command(workdir, limits), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    return Launched(proc, functools.partial(kill_everything, proc), ISOLATION)

