"""Attaching to a Ray cluster started by `ray start --head` in another process (token auth on, as Ray 2.60's
`ray start` does when a token exists): without the token the run is refused in one line naming RAY_AUTH_MODE
and RAY_AUTH_TOKEN, before anything is written; with RAY_AUTH_TOKEN alone it attaches and trains."""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
from prefect_server import free_port

from tailflow.driver.inputs import shipped_warmstart_dir

pytestmark = pytest.mark.slow

TINY = [f"model.path={shipped_warmstart_dir()}", "train.iterations=1", "train.eval_every=1", "train.num_workers=1",
        "data.num_train=32", "data.num_eval=4", "data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=16",
        "rollout.num_slots=8", "tail.enabled=false", "reward.max_workers=1"]


def clean_env(home) -> dict:
    env = dict(os.environ, HOME=str(home))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "PREFECT_API_URL"):
        env.pop(name, None)
    return env


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    home = tmp_path_factory.mktemp("head-home")
    token = secrets.token_hex(16)
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(token)
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's unix socket paths have a length limit
    log = open(home / "head.log", "w")
    head = subprocess.Popen(["ray", "start", "--head", "--block", f"--port={port}", "--num-cpus=4",
                             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
                            env=clean_env(home), start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while not answers(port):
            if head.poll() is not None or time.time() > deadline:
                pytest.fail(f"ray start --head did not come up:\n{(home / 'head.log').read_text()[-3000:]}")
            time.sleep(1)
        yield {"address": f"127.0.0.1:{port}", "token": token}
    finally:
        stop_head(head, temp_dir)


def stop_head(head: subprocess.Popen, temp_dir: str) -> None:
    """SIGTERM to the `ray start --block` group (it shuts its node down), then SIGKILL whatever of that group,
    or of that temp dir, is left: only the processes this fixture started."""
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(head.pid, sig)
            head.wait(timeout=wait_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    leftovers = subprocess.run(["pgrep", "-f", temp_dir], capture_output=True, text=True).stdout.split()
    for pid in leftovers:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def train(address: str, storage, run_id: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailflow.cli", "train", *sum((["--set", s] for s in TINY), []),
                           "--set", f"cluster.address={address}", "--set", f"storage.uri={storage}", "--run-id", run_id],
                          env=env, capture_output=True, text=True, timeout=600)


def test_without_the_token_the_run_is_refused_in_one_line_before_writing(ray_head, tmp_path):
    """Costs ~30 s here, most of it the module's `ray_head` fixture that this first test pays for (a `ray start
    --head` with token auth, waited for), the rest a `tailflow train` process refused at once. The refusal must
    come from a real head that requires the token, so the head cannot be faked."""
    result = train(ray_head["address"], tmp_path / "runs", "no-token", clean_env(tmp_path))
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("tailflow: error:")]
    assert f"cluster.address {ray_head['address']}" in error
    assert "RAY_AUTH_MODE=token" in error and "RAY_AUTH_TOKEN" in error
    assert not (tmp_path / "runs").exists()


@pytest.mark.long
def test_with_the_token_the_run_attaches_and_trains(ray_head, tmp_path):
    """Costs ~72 s here (a `tailflow train` process attaching to the module's head as a job, starting its actors
    there and training 1 iteration, 1 trainer, 2 prompts x 2 responses): an attach is only shown by a run that
    really trains on the other cluster, and this is the smallest such run."""
    env = dict(clean_env(tmp_path), RAY_AUTH_TOKEN=ray_head["token"])  # no RAY_AUTH_MODE: tailflow turns it on
    result = train(ray_head["address"], tmp_path / "runs", "attached", env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "finished 1 iterations" in result.stdout
    rows = (tmp_path / "runs" / "attached" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["iteration"] for row in rows] == [0]
    # the driver was a job of the head's cluster, not a local Ray of its own
    probe = ("from ray._raylet import GcsClient; import sys; "
             f"print(len(GcsClient(address={ray_head['address']!r}).get_all_job_info()))")
    jobs = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env=dict(env, RAY_AUTH_MODE="token"))
    assert jobs.returncode == 0 and int(jobs.stdout.split()[-1]) >= 1, jobs.stderr[-2000:]
