"""What a sandbox test left running: one scan of /proc shared by the sandbox and code-reward tests."""
from __future__ import annotations

import os
from pathlib import Path

SANDBOX_PROGRAMS = ("bwrap", "unshare", "prlimit", "setpriv")
LAUNCHER_TEXT = "The first code that runs inside a sandbox"
"""In the command line of the in-sandbox launcher (`sandbox/inner.py`, passed as source): the jail and the program
it forks (both backends run the program in the launcher's interpreter)."""


def sandbox_leftovers(marker: str) -> list[str]:
    """Live sandbox processes descended from this test process (bwrap, unshare, prlimit, setpriv, the jail, the
    program), or anything with `marker` in its command line (an escaped daemon). Ray's and Prefect's own
    children, and sandboxes of other test sessions running at the same time, are not counted."""
    parents, cmdlines = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            parents[int(entry.name)], cmdlines[int(entry.name)] = int(fields[1]), cmdline

    def is_sandbox_descendant(pid: int) -> bool:
        argv = cmdlines[pid].split()
        if not argv or not (os.path.basename(argv[0]) in SANDBOX_PROGRAMS or "tailflow-sandbox-" in cmdlines[pid]
                            or LAUNCHER_TEXT in cmdlines[pid]
                            or any(arg == "main.py" or arg.endswith(("/main.py", "/sandbox/jail.py"))
                                   for arg in argv[1:4])):
            return False
        while pid in parents and pid > 1:
            pid = parents[pid]
            if pid == os.getpid():
                return True
        return False

    return [f"{pid}: {cmdline[:120]}" for pid, cmdline in cmdlines.items()
            if pid != os.getpid() and (marker in cmdline or is_sandbox_descendant(pid))]
