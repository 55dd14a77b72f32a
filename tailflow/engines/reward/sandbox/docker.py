"""The `docker` backend: each run in a fresh container, for clusters whose nodes run a Docker engine.

Driven through the `docker` command-line client (`docker run -i`), so one-shot
runs and code-test sessions share the same pipes as the other backends, and
no SDK is needed. The image is built from `docker/Dockerfile.sandbox`
(`TAILFLOW_SANDBOX_IMAGE`, default `tailflow-sandbox:latest`).
UNTESTED HERE: no Docker engine runs on the development machine, so only the
"cannot run here" path is exercised.

The container: no network, read-only root filesystem, a size-bounded tmpfs
at /tmp, the program mounted read-only, uid 65534, every capability dropped,
no-new-privileges, a memory and a pids limit, CPU-time and file-size
ulimits. Killing it is `docker rm -f` (every process in it dies with it).
"""
from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess

from tailflow.engines.reward.sandbox.records import Launched, SandboxLimits

IMAGE_ENV = "TAILFLOW_SANDBOX_IMAGE"
DEFAULT_IMAGE = "tailflow-sandbox:latest"
ISOLATION = ("rlimits", "clean-env", "net-ns", "pid-ns", "mount-ns", "uid-nobody", "ro-root", "container")


def docker_available() -> str | None:
    """None when a Docker engine answers the `docker` client; else why not, in one line."""
    if shutil.which("docker") is None:
        return "the docker client is not on PATH"
    probe = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                           text=True, timeout=20)
    if probe.returncode != 0:
        return f"no Docker engine answers ({(probe.stderr.strip().splitlines() or ['no output'])[0][:160]})"
    return None


def docker_command(workdir: str, limits: SandboxLimits, name: str) -> list[str]:
    cpu, fsize = limits.cpu_time_s, limits.max_file_bytes
    return ["docker", "run", "-i", "--rm", "--name", name, "--network", "none", "--read-only",
            "--user", "65534:65534", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes),
            "--pids-limit", str(limits.max_processes), "--ulimit", f"cpu={cpu}:{cpu + 1}",
            "--ulimit", f"fsize={fsize}:{fsize}", "--tmpfs", f"/tmp:size={fsize},mode=1777",
            "-v", f"{workdir}:/program:ro", "-w", "/tmp", "-e", "PYTHONIOENCODING=utf-8",
            os.environ.get(IMAGE_ENV, DEFAULT_IMAGE), "python3", "-I", "-S", "/program/main.py"]


def kill_container(proc: subprocess.Popen, name: str) -> None:
    subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=30)
    proc.kill()


def launch_docker(workdir: str, limits: SandboxLimits) -> Launched:
    os.chmod(workdir, 0o755)
    name = f"tailflow-sandbox-{secrets.token_hex(6)}"
    proc = subprocess.Popen(docker_command(workdir, limits, name), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    return Launched(proc, functools.partial(kill_container, proc, name), ISOLATION)

