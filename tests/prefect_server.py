"""A real `tailflow server` (Prefect's own server) on a free loopback port, for the tests that need one."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
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


SCHEDULER_LOOP_S = 10
"""How often the server's scheduler makes the runs of schedules (Prefect's default: 60 s). It makes only runs
due after the moment it looks, so a test's schedule due 30 s ahead was skipped to its next slot, an hour later,
whenever the default loop looked more than 30 s after the schedule was made."""


class PrefectServer:
    """`tailflow server` on a fixed loopback port and home: it can be stopped and started again, as an operator
    restarts or upgrades a server under running flows (same URL, same database)."""

    def __init__(self, home: Path, startup_timeout_s: float = 300) -> None:
        self.home, self.startup_timeout_s = home, startup_timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
                        PREFECT_API_URL=self.url, PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS=str(SCHEDULER_LOOP_S))
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> "PrefectServer":
        """Start it and wait until /health answers; RuntimeError with the server's log if it never does. Each
        start's log goes to server.log (the first) or server-N.log."""
        self.starts += 1
        log = self.home / ("server.log" if self.starts == 1 else f"server-{self.starts}.log")
        self.process = start([sys.executable, "-m", "tailflow.cli", "server", "--port", str(self.port)], self.env,
                             log)
        deadline = time.time() + self.startup_timeout_s
        while not answers(f"{self.url}/health"):
            if time.time() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"prefect server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
            self.process = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def info(self) -> dict:
        return {"url": self.url, "ui": self.url.removesuffix("/api"), "env": self.env, "home": self.home,
                "server": self}


@contextmanager
def running_server(home: Path, startup_timeout_s: float = 300):
    """Yields {"url", "ui", "env", "home", "server"}; raises RuntimeError with the server's log if it never
    answers."""
    server = PrefectServer(home, startup_timeout_s)
    try:
        yield server.start().info()
    finally:
        server.stop()


from tailflow.driver.prefect_outage import answers  # noqa: E402 - the run's own health check, shared


def api(server: dict):
    """Prefect settings pointing this process's client at `server`."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings(updates={PREFECT_API_URL: server["url"]})


# ---- operated as an operator does: server, `tailflow deploy`, `tailflow worker` ------------------------------

def worker_env(server_env: dict) -> dict:
    """The worker's environment: the server's, at Prefect's own log level (what `tailflow worker` shows by
    default), and without AWS credentials (a deployment must bring its own, in its job variables)."""
    env = {name: value for name, value in server_env.items()
           if name != "PREFECT_LOGGING_LEVEL" and not name.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true")
    return env


@contextmanager
def operated_server(home: Path):
    """`tailflow server`, `tailflow deploy` and `tailflow worker`: yields running_server's dict with the worker's
    log path under "worker_log"; raises RuntimeError with the logs if a step fails."""
    with running_server(home) as server:
        deployed = subprocess.run([sys.executable, "-m", "tailflow.cli", "deploy"], env=server["env"], cwd=REPO,
                                  capture_output=True, text=True, timeout=600)
        if deployed.returncode != 0:
            raise RuntimeError(f"tailflow deploy failed:\n{deployed.stdout[-2000:]}{deployed.stderr[-2000:]}")
        worker = start([sys.executable, "-m", "tailflow.cli", "worker"], worker_env(server["env"]),
                       home / "worker.log")
        try:
            yield {**server, "worker_log": home / "worker.log"}
        finally:
            stop(worker)


def trigger(server: dict, parameters: dict, job_variables: dict | None = None,
            deployment: str = "rl_training/rl-training"):
    """A flow run of `deployment`, as the UI's Run or `prefect deployment run` creates it (not waited for)."""
    from prefect.deployments import run_deployment

    with api(server):
        return run_deployment(deployment, parameters=parameters, job_variables=job_variables, timeout=0)


def wait_until(server: dict, done, what: str, timeout_s: float):
    """Poll `done(client)` every 2 s until it returns something truthy; fail with the worker's log after
    `timeout_s` (a bound for a stuck run, far above what a run takes)."""
    import pytest
    from prefect.client.orchestration import get_client

    deadline = time.time() + timeout_s
    with api(server), get_client(sync_client=True) as client:
        while True:
            found = done(client)
            if found:
                return found
            if time.time() > deadline:
                log = Path(server["worker_log"]).read_text()[-6000:] if "worker_log" in server else ""
                pytest.fail(f"{what}: not within {timeout_s:.0f} s\nworker log:\n{log}")
            time.sleep(2)


def wait_final(server: dict, flow_run_ids, timeout_s: float = 900):
    def final(client):
        runs = [client.read_flow_run(run_id) for run_id in flow_run_ids]
        return runs if all(run.state.is_final() for run in runs) else None
    return wait_until(server, final, f"flow runs {list(flow_run_ids)} final", timeout_s)


def subflow_runs(server: dict, flow_run_id) -> list:
    """The flow run's subflow runs (its iterations), oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort

    with api(server), get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])), sort=FlowRunSort.START_TIME_ASC)


def run_logs(server: dict, flow_run_id) -> list:
    """The flow run's log records (its Logs tab), oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    with api(server), get_client(sync_client=True) as client:
        return client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                sort=LogSort.TIMESTAMP_ASC)


def tiny_run(storage_uri: str, iterations: int) -> list[str]:
    """Overrides for a run that takes seconds an iteration on 2 cores: the shipped warm start, 4 prompts x 4
    responses of at most 24 tokens, tail batching (its long-prompt queue crosses commits), one trainer rank and
    one rollout worker (bit for bit), one reward worker, asynchronous as configs/default.yaml."""
    from tailflow.driver.inputs import shipped_warmstart_dir

    return [f"model.path={shipped_warmstart_dir()}", f"train.iterations={iterations}", "train.eval_every=1000",
            "train.num_workers=1", "train.lr=1e-3", "data.num_train=64", "data.num_eval=4", "data.prompts_per_step=4",
            "rollout.n=4", "rollout.max_new_tokens=24", "rollout.num_slots=16", "tail.prompt_ratio=1.5",
            "tail.responses_launched=5", "reward.max_workers=1", f"storage.uri={storage_uri}"]
