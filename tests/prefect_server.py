"""A real `tailflow server` (Prefect's own server) on a free loopback port, for the tests that need one."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(command, env=env, cwd=REPO, start_new_session=True, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextmanager
def running_server(home: Path, startup_timeout_s: float = 150):
    """Yields {"url", "ui", "env", "home"}; raises RuntimeError with the server's log if it never answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_API_URL=url)
    server = start([sys.executable, "-m", "tailflow.cli", "server", "--port", str(port)], env, home / "server.log")
    try:
        deadline = time.time() + startup_timeout_s
        while not answers(f"{url}/health"):
            if time.time() > deadline or server.poll() is not None:
                raise RuntimeError(f"prefect server did not start:\n{(home / 'server.log').read_text()[-3000:]}")
            time.sleep(1)
        yield {"url": url, "ui": f"http://127.0.0.1:{port}", "env": env, "home": home}
    finally:
        stop(server)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def api(server: dict):
    """Prefect settings pointing this process's client at `server`."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings(updates={PREFECT_API_URL: server["url"]})
