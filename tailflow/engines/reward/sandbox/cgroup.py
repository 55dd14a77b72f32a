"""An aggregate memory and process limit for one sandbox: a cgroup of its own, where the kernel lets us make one.

Why: RLIMIT_AS bounds one process and RLIMIT_NPROC counts every process of
uid 65534 on the host, so without a cgroup one answer can hold
`max_processes x memory_bytes` and its fork bomb takes the process slots of
every sandbox beside it. With one, everything the sandbox starts (its tmpfs
pages included) shares one `memory_bytes` and one `max_processes`; the
kernel's OOM killer ends the sandbox's own processes past it. Where one can
be made: docs/rewards.md, "A cgroup per sandbox" (as root, cgroup v1 here, v2
written but not run).
Each sandbox gets `tailflow-sandbox-<owner pid>-<token>`; the launched process
joins it before exec, and it is removed once the sandbox is gone
(`remove_owned_by` sweeps after an owner that was killed). Where no cgroup
can be made, `create` returns None and `SandboxResult.isolation` lacks
"cgroup".
"""
from __future__ import annotations

import functools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "tailflow-sandbox-"
V1_FILES = {"memory": ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"), "pids": ("pids.max",)}
V2_FILES = ("memory.max", "memory.swap.max", "pids.max")
OVERHEAD_PROCESSES = 2
"""The sandbox's own processes in its cgroup besides the program's (bwrap and its init; unshare and the jail)."""
REMOVE_TRIES = 12
"""rmdir attempts, 1 ms apart and doubling (~4 s in all): the killed processes' exit can lag the wait by a moment."""


@dataclass(frozen=True)
class Cgroup:
    """One sandbox's cgroup: a directory per hierarchy (v1: memory and pids; v2: one)."""

    dirs: tuple[str, ...]
    version: int

    def join(self) -> None:
        """Move the calling process into it (a preexec_fn: runs in the child before exec)."""
        pid = str(os.getpid()).encode()
        for directory in self.dirs:
            fd = os.open(os.path.join(directory, "cgroup.procs"), os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def remove(self) -> bool:
        """Kill whatever is left in it and remove it; False if it could not be removed (left for a later sweep)."""
        return all(remove_dir(directory) for directory in self.dirs)


def remove_dir(directory: str) -> bool:
    for attempt in range(REMOVE_TRIES):
        try:
            os.rmdir(directory)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            kill_members(directory)
            time.sleep(0.001 * 2 ** attempt)
    return False


def kill_members(directory: str) -> None:
    try:
        pids = Path(directory, "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def own_paths() -> dict[str, str]:
    """This process's cgroup per hierarchy, from /proc/self/cgroup: {"memory": "/a/b", "pids": "/", "": v2 path}."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def mounts() -> dict[str, str]:
    """Where each hierarchy is mounted: {"memory": mountpoint, "pids": ..., "": the cgroup2 mountpoint}."""
    found = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, target, fstype, options = line.split()[:4]
        if fstype == "cgroup2":
            found.setdefault("", target)
        elif fstype == "cgroup":
            for controller in ("memory", "pids"):
                if controller in options.split(","):
                    found.setdefault(controller, target)
    return found


@functools.cache
def parents() -> tuple[int, tuple[str, ...]] | None:
    """(version, directories to create sandbox cgroups under), or None where we cannot make them."""
    if os.geteuid() != 0:
        return None
    try:
        where, own = mounts(), own_paths()
    except OSError:
        return None
    if "memory" in where and "pids" in where:
        dirs = tuple(os.path.join(where[c], own.get(c, "/").lstrip("/")) for c in ("memory", "pids"))
        return (1, dirs) if all(os.access(d, os.W_OK) for d in dirs) else None
    if "" in where:
        parent = os.path.join(where[""], own.get("", "/").lstrip("/"))
        try:
            if not {"memory", "pids"} <= set(Path(parent, "cgroup.subtree_control").read_text().split()):
                Path(parent, "cgroup.subtree_control").write_text("+memory +pids")
        except OSError:
            return None
        return 2, (parent,)
    return None


def create(memory_bytes: int, max_processes: int) -> Cgroup | None:
    """A fresh cgroup with these limits (`max_processes` for the program, plus the sandbox's own), or None where
    cgroups are not available to us."""
    found = parents()
    if found is None:
        return None
    version, parent_dirs = found
    name = f"{PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
    group = Cgroup(tuple(os.path.join(parent, name) for parent in parent_dirs), version)
    try:
        for directory in group.dirs:
            os.mkdir(directory)
        for directory, filename, value in limit_writes(group, memory_bytes, max_processes + OVERHEAD_PROCESSES):
            write_limit(directory, filename, value)
    except OSError:
        group.remove()
        return None
    return group


def limit_writes(group: Cgroup, memory_bytes: int, max_processes: int) -> list[tuple[str, str, int]]:
    if group.version == 2:
        (directory,) = group.dirs
        return [(directory, name, value) for name, value in zip(V2_FILES, (memory_bytes, 0, max_processes))]
    memory_dir, pids_dir = group.dirs
    return [(memory_dir, name, memory_bytes) for name in V1_FILES["memory"]] + [(pids_dir, "pids.max", max_processes)]


def write_limit(directory: str, filename: str, value: int) -> None:
    """Swap limits are optional (no swap accounting: no file, or a refused write); the others are not."""
    try:
        Path(directory, filename).write_text(str(value))
    except OSError:
        if "swap" not in filename and "memsw" not in filename:
            raise


def remove_owned_by(owner_pid: int | None = None) -> None:
    """Remove sandbox cgroups left by `owner_pid` (a killed test runner), or by every owner no longer alive."""
    found = parents()
    if found is None:
        return
    for parent in found[1]:
        for entry in Path(parent).glob(f"{PREFIX}*"):
            owner = entry.name[len(PREFIX):].split("-")[0]
            if owner.isdigit() and (int(owner) == owner_pid if owner_pid is not None else not pid_alive(int(owner))):
                remove_dir(str(entry))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
