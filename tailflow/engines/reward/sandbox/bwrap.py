"""The `bwrap` backend: bubblewrap does the namespaces, for hosts where we are not root.

Written against bubblewrap's documented CLI but NOT exercised by the tests
here (no bwrap on the development machine); only used when `bwrap` is on PATH.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tailflow.engines.reward.sandbox.process import clean_env, interpreter, kill_everything, to_result
from tailflow.engines.reward.sandbox.records import SandboxLimits, SandboxResult
from tailflow.engines.reward.sandbox.supervise import supervise

ISOLATION = ("rlimits", "session", "clean-env", "net-ns", "pid-ns", "mount-ns", "uid-nobody", "ro-root")
SANDBOX_DIR = "/sandbox"


def bwrap_command(workdir: str, limits: SandboxLimits) -> list[str]:
    cpu = limits.cpu_time_s
    rlimits = (f"ulimit -t {cpu} -v {limits.memory_bytes // 1024} -u {limits.max_processes} "
               f"-f {limits.max_file_bytes // 512} -c 0")
    env = [arg for key, value in clean_env(SANDBOX_DIR).items() for arg in ("--setenv", key, value)]
    return ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--uid", "65534", "--gid", "65534",
            "--ro-bind", "/", "/", "--tmpfs", "/tmp", "--tmpfs", "/root", "--tmpfs", "/home",
            "--tmpfs", os.environ.get("HOME", "/root"), "--ro-bind", os.path.realpath(sys.base_prefix),
            os.path.realpath(sys.base_prefix), "--proc", "/proc", "--dev", "/dev",
            "--bind", workdir, SANDBOX_DIR, "--chdir", SANDBOX_DIR, "--clearenv", *env,
            "/bin/sh", "-c", f'{rlimits} && exec "$0" -I -S main.py', interpreter()]


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


def run_bwrap(code: str, stdin: str, limits: SandboxLimits) -> SandboxResult:
    if not bwrap_available():
        raise RuntimeError("sandbox backend 'bwrap' needs bubblewrap on PATH (apt-get install bubblewrap)")
    with tempfile.TemporaryDirectory(prefix="tailflow-sandbox-") as workdir:
        (Path(workdir) / "main.py").write_text(code)
        os.chmod(workdir, 0o777)  # uid 65534 inside must be able to write its own cwd
        proc = subprocess.Popen(bwrap_command(workdir, limits), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            outcome = supervise(proc, stdin.encode(), limits.timeout_s, limits.max_output_bytes,
                                lambda: kill_everything(proc))
        finally:
            kill_everything(proc)
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()
    return to_result(outcome, ISOLATION, limits)
