"""What operating tailflow from Prefect relies on, checked without a server of its own: no flow or task whose
result Prefect could serve instead of running it, a finished run's resume that starts nothing, lease warnings in
the run's logs, links a browser opens, the worker's log level, dry runs outside the checkout."""
from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
import threading
import urllib.request

import pytest
import yaml

import tailflow.flows
import tailflow.tasks
from tailflow.config import RunConfig, config_to_yaml
from tailflow.engines.run_state import RunState
from tailflow.engines.runs.commit import commit_state
from tailflow.engines.runs.layout import config_key, metrics_key
from tailflow.engines.store import LocalStore


def flows_and_tasks():
    from prefect import Flow, Task

    for package in (tailflow.flows, tailflow.tasks):
        for module_info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{module_info.name}")
            for name, value in vars(module).items():
                if isinstance(value, (Flow, Task)) and value.fn.__module__ == module.__name__:
                    yield f"{module.__name__}.{name}", value


def test_every_flow_and_task_opts_out_of_result_persistence_and_caching():
    """Whether an iteration ran comes from the run's store: a retried parent flow must run every subflow and task
    again, whatever PREFECT_RESULTS_PERSIST_BY_DEFAULT or a cache policy would say."""
    from prefect import Task
    from prefect.cache_policies import NO_CACHE

    found = dict(flows_and_tasks())
    assert {"tailflow.flows.training.rl_training", "tailflow.flows.iteration.iteration",
            "tailflow.tasks.commit.commit", "tailflow.tasks.rollout.take_round"} <= set(found)
    for name, runnable in found.items():
        assert runnable.persist_result is False, name
        if isinstance(runnable, Task):
            assert runnable.cache_policy is NO_CACHE, name


def finished_run(storage, run_id: str, iterations: int) -> RunConfig:
    """A run whose `iterations` are all committed (what its files say; no training needed to read them)."""
    config = RunConfig.model_validate({"train": {"iterations": iterations}, "storage": {"uri": str(storage)}})
    store = LocalStore(storage)
    store.write_text(config_key(run_id), config_to_yaml(config))
    store.write_text(metrics_key(run_id), "".join(
        f'{{"iteration": {i}, "time/step_total": 2.0}}\n' for i in range(iterations)))
    commit_state(store, RunState(run_id=run_id, iteration=iterations, initial_eval_accuracy=0.25,
                                 last_eval_accuracy=0.5))
    return config


@pytest.mark.slow
def test_resuming_a_finished_run_returns_before_anything_starts(prefect_api, tmp_path, monkeypatch):
    """A scheduled resume of a run that has ended: no preflight, no Ray, no workers; the summary of the run.

    Marked slow because it needs the session's Prefect server (`prefect_api`, 15-35 s to start here, paid by the
    first test on each xdist worker that asks for it): the fast subset starts no server; this test's own part is
    ~2 s."""
    import tailflow.flows.training as training
    from tailflow.flows.training import rl_training

    def refuse(*args, **kwargs):
        raise AssertionError("a finished run started work")

    monkeypatch.setattr(training, "check_inputs", refuse)
    monkeypatch.setattr(training, "build_context", refuse)
    monkeypatch.setattr(training, "run_writer", refuse)
    config = finished_run(tmp_path, "done", iterations=3)
    (tmp_path / "run.yaml").write_text(config_to_yaml(config))
    summary = rl_training(config_path=str(tmp_path / "run.yaml"), run_id="done")
    assert summary.iterations == 3 and summary.final_accuracy == 0.5 and summary.mean_step_seconds == 2.0
    resumed = rl_training(config_path=str(tmp_path / "run.yaml"), run_id="done", resume=True)
    assert resumed.iterations == 3
    # more iterations asked for: not finished, so the run goes on (here: into the refused preflight)
    with pytest.raises(AssertionError, match="started work"):
        rl_training(config_path=str(tmp_path / "run.yaml"), run_id="done", overrides=["train.iterations=4"],
                    allow_change=["train.iterations"])


@pytest.mark.slow
def test_lease_and_store_warnings_reach_the_flow_runs_logs(prefect_api, tmp_path):
    """They are logged off the flow's thread (the lease heartbeat), where Prefect's run logger cannot file them.

    Marked slow because it needs the session's Prefect server (`prefect_api`, 15-35 s to start here, paid by the
    first test on each xdist worker that asks for it): the fast subset starts no server; this test's own part is
    ~1.5 s."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.runtime import flow_run

    from tailflow.driver.run_log import warnings_in_run_logs

    @flow(persist_result=False)
    def holder() -> str:
        with warnings_in_run_logs(str(flow_run.id)):
            heartbeat = threading.Thread(target=lambda: logging.getLogger("tailflow.lease").warning(
                "run r: lease heartbeat failed: %s", "s3://b/x: Could not connect"))
            heartbeat.start()
            heartbeat.join()
            logging.getLogger("tailflow.store").warning("s3://b/k: sha256 mismatch; reading it again")
            logging.getLogger("tailflow.lease").info("below WARNING: not filed")
        return str(flow_run.id)

    flow_run_id = holder()
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    messages = [log.message for log in logs]
    assert "[tailflow] run r: lease heartbeat failed: s3://b/x: Could not connect" in messages
    assert "[tailflow] s3://b/k: sha256 mismatch; reading it again" in messages
    assert not any("below WARNING" in message for message in messages)


@pytest.mark.slow
def test_a_local_run_gets_paths_to_copy_not_file_links(prefect_api, tmp_path):
    """A browser does not open file:// links from the UI: a local store's report and checkpoint artifacts show
    the path instead.

    Marked slow because it needs the session's Prefect server (`prefect_api`, 15-35 s to start here, paid by the
    first test on each xdist worker that asks for it): the fast subset starts no server; this test's own part is
    ~1.5 s."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    from tailflow.driver.links import StoredFile, checkpoint_file, publish_file_link

    store = LocalStore(tmp_path)

    @flow(persist_result=False)
    def publish() -> tuple[str, str]:
        page = publish_file_link(store, StoredFile("r1/report.html", "report of run r1", "plots"), "local-report", 60)
        checkpoint = publish_file_link(store, checkpoint_file(store, "r1/checkpoints/iter-0001", "r1", 1),
                                       "local-checkpoint", 60)
        return page, checkpoint

    page, checkpoint = publish()
    assert page == str(tmp_path / "r1" / "report.html")
    assert checkpoint == str(tmp_path / "r1" / "checkpoints" / "iter-0001")
    with get_client(sync_client=True) as client:
        artifacts = {a.key: a for a in client.read_latest_artifacts() if a.key in ("local-report", "local-checkpoint")}
    assert artifacts["local-report"].type == "markdown" and f"```\n{page}\n```" in artifacts["local-report"].data
    assert "file://" not in artifacts["local-checkpoint"].data and checkpoint in artifacts["local-checkpoint"].data


def test_s3_links_are_presigned_for_the_configured_lifetime_and_open(monkeypatch, tmp_path):
    """On S3 the link is a signature v4 URL to the object, valid for `storage.link_expiry_s`, fetched here from a
    local S3 server (which does not check the signature; tests/test_prefect_operations.py shows the plain URL
    refused on a private bucket)."""
    import boto3
    from moto.server import ThreadedMotoServer

    from tailflow.engines.store import S3Store
    from tailflow.driver.links import checkpoint_file

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        for name, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1",
                            "AWS_ENDPOINT_URL": "http://%s:%d" % server.get_host_and_port()}.items():
            monkeypatch.setenv(name, value)
        boto3.client("s3").create_bucket(Bucket="links")
        store = S3Store("links", "team", cache_dir=tmp_path)
        store.write_text("r1/report.html", "<html>report</html>")
        store.put_dir("r1/checkpoints/iter-0002", make_checkpoint(tmp_path / "ckpt"))
        url = store.presigned_url("r1/report.html", 3600)
        assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url and "X-Amz-Expires=3600" in url
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.read() == b"<html>report</html>" and response.headers["Content-Type"] == "text/html"
        manifest = checkpoint_file(store, "r1/checkpoints/iter-0002", "r1", 2)
        assert manifest.key == "r1/checkpoints/iter-0002/.manifest.json"  # an object, not the checkpoint's prefix
        with urllib.request.urlopen(store.presigned_url(manifest.key, 60), timeout=30) as response:
            assert b"model.safetensors" in response.read()
    finally:
        server.stop()


def make_checkpoint(folder):
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def test_s3_without_or_with_refused_credentials_is_one_line_and_not_retried(monkeypatch, tmp_path):
    from tailflow.engines.store import S3Store, StoreAccessError
    from tailflow.driver.retry_policy import USER_ERRORS

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached: signing fails first
    with pytest.raises(StoreAccessError) as missing:
        S3Store("bucket", "team", cache_dir=tmp_path).exists("r1/latest.json")
    message = str(missing.value)
    assert "\n" not in message and message.startswith("s3://bucket/team/r1/latest.json: no usable AWS credentials")
    assert "job variables `env`" in message
    assert issubclass(StoreAccessError, USER_ERRORS)  # the flow cancels its retries for it


def test_the_worker_logs_at_info_unless_told_otherwise(monkeypatch):
    from tailflow.cli import quiet_prefect_defaults

    monkeypatch.delenv("PREFECT_LOGGING_LEVEL", raising=False)
    quiet_prefect_defaults("worker")
    import os

    assert "PREFECT_LOGGING_LEVEL" not in os.environ  # Prefect's INFO: flow run submitted, started, finished
    quiet_prefect_defaults("train")
    assert os.environ["PREFECT_LOGGING_LEVEL"] == "WARNING"  # a run's terminal shows its own lines
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", "DEBUG")
    quiet_prefect_defaults("train")
    assert os.environ["PREFECT_LOGGING_LEVEL"] == "DEBUG"  # the user's setting wins


def test_a_dry_run_of_the_gpu_evidence_kit_writes_outside_the_checkout(monkeypatch):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "gpu_evidence.py"
    spec = importlib.util.spec_from_file_location("gpu_evidence", path)
    kit = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_evidence", kit)  # its dataclasses look their module up
    spec.loader.exec_module(kit)
    out = kit.results_dir(dry_run=True)
    assert out.is_dir() and path.parents[1] not in out.parents and not any(out.iterdir())
    out.rmdir()
    assert kit.results_dir(dry_run=False) == path.parent / "results"


def test_the_docs_name_the_deployments_and_tasks_the_code_has():
    """Every deployment of deployments/prefect.yaml in docs/operations.md's table and deployments/README.md, with
    the right count; the iteration's tasks as README.md lists them."""
    import re
    from pathlib import Path

    from prefect import Task

    repo = Path(__file__).resolve().parents[1]
    definitions = yaml.safe_load((repo / "deployments" / "prefect.yaml").read_text())["deployments"]
    deployments = [definition["name"] for definition in definitions]
    operations = (repo / "docs" / "operations.md").read_text()
    table = set(re.findall(r"^\| `([a-z0-9-]+)` \| `", operations, flags=re.M))
    assert table == set(deployments)
    numbers = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
    for text in (operations, (repo / "deployments" / "README.md").read_text(),
                 (repo / "deployments" / "prefect.yaml").read_text()):
        for count, word in numbers.items():
            assert count == len(deployments) or f"{word} deployments" not in text, word
        for name in deployments:
            assert f"`{name}`" in text or f"name: {name}" in text, name
    from tailflow.flows import iteration

    listed = re.search(r"tasks — ([a-z_, ]+) —", (repo / "README.md").read_text().replace("\n", " "))
    assert listed, "README.md lists the iteration's tasks as `tasks — a, b, ... —`"
    iteration_tasks = {name for name, value in vars(iteration).items() if isinstance(value, Task)}
    assert {name.strip() for name in listed.group(1).split(",")} == iteration_tasks


def test_a_fault_with_a_record_fires_once_across_processes(monkeypatch, tmp_path):
    """A Retried flow run is a new process with the same job variables: TAILFLOW_FAULT_RECORD keeps the fault it
    fired from firing again (without it, each process fires it once)."""
    from tailflow.engines import faults

    monkeypatch.setenv(faults.ENV, "crash-train@2,raise-sync@1")
    assert faults.armed("crash-train@2") and not faults.armed("crash-train@2")  # once in this process
    monkeypatch.setenv(faults.ENV, "crash-train@2")  # a new process, without a record: fires again
    assert faults.armed("crash-train@2")
    monkeypatch.setenv(faults.RECORD_ENV, str(tmp_path / "fired"))
    for _ in range(2):  # two new processes sharing the record: the first fires, the second does not
        monkeypatch.setenv(faults.ENV, "crash-train@2")
        assert faults.armed("crash-train@2") is (_ == 0)
    assert sorted(p.name for p in (tmp_path / "fired").iterdir()) == ["crash-train@2"]


@pytest.mark.slow
def test_a_task_a_cancel_stops_ends_completed_and_its_caller_gets_run_cancelled(prefect_api, monkeypatch):
    """Prefect logs every end of a task run but Completed as an error, and a Cancel's signal most often lands in a
    task's body (inside Ray's C code it arrives as a SystemError): such a task ends Completed and calling it
    raises RunCancelled, which the iteration turns into Cancelled states. Without a Cancel the same error fails
    the task and reaches its caller as before.

    Marked slow because it needs the session's Prefect server (`prefect_api`, 15-35 s to start here, paid by the
    first test on each xdist worker that asks for it): the fast subset starts no server; this test's own part is
    ~3 s."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from tailflow.tasks import cancellable

    @cancellable.run_task
    def interrupted() -> int:
        raise SystemError("<built-in method __new__> returned a result with an exception set")

    @flow(persist_result=False)
    def calls_it() -> str:
        try:
            interrupted()
        except cancellable.RunCancelled:
            return "cancelled"
        return "went on"

    monkeypatch.setattr(cancellable, "cancel_requested", lambda: True)
    state = calls_it(return_state=True)
    assert state.result() == "cancelled"
    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    assert [run.state.type.value for run in task_runs] == ["COMPLETED"]

    monkeypatch.setattr(cancellable, "cancel_requested", lambda: False)
    with pytest.raises(SystemError):
        calls_it()


def test_a_sigterm_while_asking_about_a_cancel_waits_for_the_answer(monkeypatch):
    """The Cancel test left an iteration Running now and then: a SIGTERM landing while the run asked the API about
    the error at hand escaped the handling that ends the run Cancelled. While `cancel_requested` asks, SIGTERM is
    recorded; a Cancel then drops it (the run winds down, SIGTERM ignored from then on), anything else hands it to
    the handler it replaced, as if it had come just then. A real signal, sent while the question is asked."""
    import os
    import signal

    from tailflow.tasks import cancellable

    landed = []

    def previous(signum, frame):
        landed.append(signum)

    def asked_during_a_sigterm(answer: bool):
        def ask() -> bool:
            os.kill(os.getpid(), signal.SIGTERM)
            assert not landed  # not handled while asking
            return answer
        return ask

    before = signal.signal(signal.SIGTERM, previous)
    try:
        monkeypatch.setattr(cancellable, "run_is_cancelling", asked_during_a_sigterm(False))
        assert cancellable.cancel_requested() is False
        assert landed == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is previous

        landed.clear()
        monkeypatch.setattr(cancellable, "run_is_cancelling", asked_during_a_sigterm(True))
        assert cancellable.cancel_requested() is True
        os.kill(os.getpid(), signal.SIGTERM)  # a second one, the runner's or Prefect's: ignored too
        assert not landed and signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.slow
def test_a_sigterm_after_a_subflows_commit_stops_the_parent_not_the_subflows_end(prefect_api):
    """The Cancel test failed 1 of 10 repeats on "Crash detected!" at ERROR: the Cancel's SIGTERM landed after an
    iteration's commit, while Prefect's engine ended its subflow under its own handler. From the commit
    (`deferred_to_return`) the signal is recorded; the subflow ends Completed and the parent's handler gets the
    signal when the call returns. Without the deferral the same signal, at the same place, crashes the subflow:
    the control case. Real subflows and real signals, to this process.

    Marked slow because it needs the session's Prefect server (`prefect_api`, 15-35 s to start here, paid by the
    first test on each xdist worker that asks for it); this test's own part is ~2 s."""
    import logging
    import os
    import signal

    from prefect import flow
    from prefect.client.orchestration import get_client

    from tailflow.tasks import cancellable

    @flow(name="tailflow-committed-iteration", persist_result=False)
    def committed_iteration(defers: bool) -> str:
        with cancellable.exits_on_sigterm():  # as an iteration's code runs
            if defers:
                cancellable.deferred_to_return()  # committed
        os.kill(os.getpid(), signal.SIGTERM)  # where Prefect's engine ends the run, under its own handler
        return "kept"

    def rays_handler(signum, frame):  # what `ray.init` installs in the run's flow
        raise SystemExit(signum)

    @flow(name="tailflow-run", persist_result=False)
    def run(defers: bool) -> str:
        before = signal.signal(signal.SIGTERM, rays_handler)
        try:
            with cancellable.subflow_end_deferred():
                committed_iteration(defers, return_state=True)
            return "went on"
        except SystemExit:
            return "stopped after the iteration"
        finally:
            signal.signal(signal.SIGTERM, before)

    def subflow_state(parent_state):
        with get_client(sync_client=True) as client:
            parent = client.read_flow_run(parent_state.state_details.flow_run_id)
            (child,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent.id])))
        return child.state.type.value

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    class Errors(logging.Handler):  # Prefect's run loggers do not reach pytest's capture
        def __init__(self):
            super().__init__(logging.ERROR)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    errors = Errors()
    logging.getLogger("prefect").addHandler(errors)
    try:
        state = run(True, return_state=True)
        assert state.result() == "stopped after the iteration"
        assert subflow_state(state) == "COMPLETED" and errors.messages == []
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, rays_handler)

        control = run(False, return_state=True)
        assert control.result() == "stopped after the iteration"
        assert subflow_state(control) == "CRASHED"
        assert any(message.startswith("Crash detected! Execution was aborted by a termination signal")
                   for message in errors.messages), errors.messages
    finally:
        logging.getLogger("prefect").removeHandler(errors)


def test_a_sigterm_while_prefects_engine_starts_or_ends_a_task_waits_for_the_flows_code():
    """The Cancel test once failed on "Crash detected!" at ERROR: the Cancel's SIGTERM landed as `train_policy`'s
    task run began, in Prefect's engine, outside the task's body whose stop a Cancel turns into Completed. Around a
    task run the signal is recorded; it is handed to the flow's handler at the body's start (one that came while
    the run started) or when the call returns (one that came while it ended), and inside the body at once; once the
    body knows of the Cancel (SIGTERM ignored) nothing is handed on. Real signals, to this process."""
    import os
    import signal

    from tailflow.tasks import cancellable

    landed, ran = [], []

    def flows_handler(signum, frame):  # as an iteration's code has it (exits_on_sigterm)
        landed.append(signum)
        raise SystemExit(signum)

    before = signal.signal(signal.SIGTERM, flows_handler)
    try:
        with pytest.raises(SystemExit):  # while the engine starts the run: raised as the body starts
            with cancellable.engine_sigterm_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                assert not landed
                with cancellable.flow_sigterm_inside():
                    ran.append("started")
        assert landed == [signal.SIGTERM] and ran == []
        assert signal.getsignal(signal.SIGTERM) == flows_handler

        landed.clear()
        with pytest.raises(SystemExit):  # while the engine ends it: raised when the call returns
            with cancellable.engine_sigterm_deferred():
                with cancellable.flow_sigterm_inside():
                    ran.append("ended")
                os.kill(os.getpid(), signal.SIGTERM)
                assert not landed
        assert landed == [signal.SIGTERM] and ran == ["ended"]

        landed.clear()
        with pytest.raises(SystemExit):  # in the body: at once
            with cancellable.engine_sigterm_deferred(), cancellable.flow_sigterm_inside():
                os.kill(os.getpid(), signal.SIGTERM)
                ran.append("not reached")
        assert landed == [signal.SIGTERM] and ran == ["ended"]

        landed.clear()
        with cancellable.engine_sigterm_deferred():  # the body learnt of the Cancel: the run winds down
            with cancellable.flow_sigterm_inside():
                cancellable.hold_off_termination()
            os.kill(os.getpid(), signal.SIGTERM)
        assert not landed and signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
