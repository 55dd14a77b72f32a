"""The `docker` backend: each run in a fresh container, for clusters whose nodes run a Docker engine.

Written against the docker SDK (`pip install tailflow[docker]`) and the image
built from `docker/Dockerfile.sandbox` (`TAILFLOW_SANDBOX_IMAGE`, default
`tailflow-sandbox:latest`). UNTESTED HERE: no Docker engine runs on the
development machine, so only the "cannot run here" path is exercised.

The container: no network, read-only root filesystem, a size-bounded tmpfs
at /tmp, the program and its stdin mounted read-only, uid 65534, every
capability dropped, no-new-privileges, a memory and a pids limit, CPU-time
and file-size ulimits. On timeout the container is killed (every process in
it dies with it) and removed.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from tailflow.engines.reward.sandbox.records import SandboxLimits, SandboxResult

IMAGE_ENV = "TAILFLOW_SANDBOX_IMAGE"
DEFAULT_IMAGE = "tailflow-sandbox:latest"
ISOLATION = ("rlimits", "clean-env", "net-ns", "pid-ns", "mount-ns", "uid-nobody", "ro-root", "container")


def docker_available() -> str | None:
    """None when a Docker engine answers; else why not, in one line."""
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install 'tailflow[docker]')"
    try:
        docker.from_env().ping()
    except Exception as error:  # noqa: BLE001 - the SDK raises several types for a missing engine
        return f"no Docker engine answers ({type(error).__name__}: {str(error).splitlines()[0][:160]})"
    return None


def run_docker(code: str, stdin: str, limits: SandboxLimits) -> SandboxResult:
    import docker
    from docker.types import Ulimit

    client = docker.from_env()
    with tempfile.TemporaryDirectory(prefix="tailflow-sandbox-") as workdir:
        Path(workdir, "main.py").write_text(code)
        Path(workdir, "stdin.txt").write_text(stdin)
        os.chmod(workdir, 0o755)
        started = time.perf_counter()
        container = client.containers.run(
            os.environ.get(IMAGE_ENV, DEFAULT_IMAGE),
            ["sh", "-c", "exec python3 -I -S /program/main.py < /program/stdin.txt"],
            detach=True, network_disabled=True, read_only=True, user="65534:65534", working_dir="/tmp",
            volumes={workdir: {"bind": "/program", "mode": "ro"}},
            tmpfs={"/tmp": f"size={limits.max_file_bytes},mode=1777"},
            mem_limit=limits.memory_bytes, memswap_limit=limits.memory_bytes, pids_limit=limits.max_processes,
            cap_drop=["ALL"], security_opt=["no-new-privileges"], environment={"PYTHONIOENCODING": "utf-8"},
            ulimits=[Ulimit(name="cpu", soft=limits.cpu_time_s, hard=limits.cpu_time_s + 1),
                     Ulimit(name="fsize", soft=limits.max_file_bytes, hard=limits.max_file_bytes)],
        )
        try:
            try:
                exit_code = container.wait(timeout=limits.timeout_s)["StatusCode"]
                timed_out = False
            except Exception:  # noqa: BLE001 - requests' ReadTimeout: the run outlived its timeout
                container.kill()
                exit_code, timed_out = None, True
            duration = time.perf_counter() - started
            stdout = container.logs(stdout=True, stderr=False)
            stderr = container.logs(stdout=False, stderr=True)
        finally:
            container.remove(force=True)
    bound = limits.max_output_bytes
    decode = lambda data: data[:bound].decode("utf-8", errors="replace")  # noqa: E731
    if timed_out:
        status = "timeout"
    elif exit_code == 0:
        status = "ok"
    elif exit_code is not None and exit_code > 128:
        status = "killed"
    else:
        status = "error"
    return SandboxResult(status, exit_code, decode(stdout), decode(stderr), round(duration, 3),
                         len(stdout) > bound, len(stderr) > bound, ISOLATION)
