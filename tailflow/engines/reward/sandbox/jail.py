"""The inside of the `process` sandbox: run as a script, stdlib only, by `python3 -I -S jail.py SPEC`.

Started by `unshare --net --pid --fork --mount-proc --mount` as root, it is PID 1
of a fresh pid namespace. It hides the host's writable and secret directories
under empty tmpfs mounts, re-exposes the interpreter read-only, drops to
uid/gid 65534, and then forks the untrusted program as its child. Staying
PID 1 (instead of exec-ing the program) matters: the kernel protects PID 1 from
signals sent inside the namespace, and when PID 1 exits every process in the
namespace is killed, so a daemon that double-forks and setsid()s cannot
outlive the run. Its exit code is the program's, or 128+signal.

Without namespaces, `apply_limits` is also used from the parent's preexec_fn.
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

NOBODY = 65534
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
libc = ctypes.CDLL(None, use_errno=True)


def apply_limits(limits: dict) -> None:
    """Kernel rlimits for the untrusted process (inherited by everything it forks)."""
    cpu = int(limits["cpu_time_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["max_file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target}: {os.strerror(ctypes.get_errno())}")


def mount_tmpfs(path: str, size_bytes: int, mode: str) -> None:
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size_bytes},nr_inodes=4096,mode={mode}")


def hide_host_dirs(spec: dict) -> None:
    """Empty tmpfs over each writable or secret dir; the interpreter's prefix is bound back read-only."""
    exposed = [(path, os.open(path, os.O_PATH)) for path in spec["expose"]]
    for path in spec["masks"]:
        if os.path.isdir(path):
            mount_tmpfs(path, spec["tmpfs_bytes"], "1777" if path in ("/tmp", "/var/tmp", "/dev/shm") else "755")
    for path, fd in exposed:
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
        os.close(fd)
    os.makedirs(spec["workdir"], exist_ok=True)
    mount_tmpfs(spec["workdir"], spec["tmpfs_bytes"], "700")
    os.chown(spec["workdir"], NOBODY, NOBODY)


def drop_privileges() -> None:
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the uid change cleared unshare's --kill-child


def run_program(spec: dict, code: bytes) -> int:
    """Fork the program, reap every orphan (we are init), return its exit code or 128+signal."""
    program = os.path.join(spec["workdir"], "main.py")
    with open(program, "wb") as file:
        file.write(code)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.chdir(spec["workdir"])
        apply_limits(spec["limits"])
        os.execve(spec["interpreter"], [spec["interpreter"], "-I", "-S", program], os.environ)
    while True:
        reaped, status = os.waitpid(-1, 0)
        if reaped == pid:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main() -> int:
    spec = json.loads(sys.argv[1])
    with open(spec["code_path"], "rb") as file:
        code = file.read()
    os.umask(0o022)
    hide_host_dirs(spec)
    os.chdir(spec["workdir"])
    drop_privileges()
    return run_program(spec, code)


if __name__ == "__main__":
    sys.exit(main())
