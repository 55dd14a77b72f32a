"""Operated from Prefect: a real `prefect server`, `tailflow deploy`, a worker, runs triggered through the API,
and the flow run's page in headless Chromium.

One module-scoped server and worker serve every test here; the tests run in file order (the UI test reads the
flow run the concurrency test made). Marked `e2e` (~2.5 min; also `slow`): the whole suite runs it, the fast
subset leaves it out; `./scripts/test.sh -m e2e` runs only it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect_server import REPO, api, running_server, start, stop

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

OUTPUT_DIR = Path(os.environ.get("TAILFLOW_TEST_OUTPUT", REPO / "test-output"))
from tailflow.flows.setup import shipped_warmstart_dir  # noqa: E402

TINY = [f"model.path={shipped_warmstart_dir()}", "train.iterations=2", "train.eval_every=1", "data.num_train=64", "data.num_eval=8", "data.prompts_per_step=4",
        "rollout.n=4", "rollout.max_new_tokens=24", "rollout.num_slots=16", "tail.prompt_ratio=1.5",
        "tail.responses_launched=5"]


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """`tailflow server` on a free loopback port, its own PREFECT_HOME (database), and a worker on the pool."""
    home = tmp_path_factory.mktemp("prefect-server")
    try:
        with running_server(home) as server:
            deployed = subprocess.run([sys.executable, "-m", "tailflow.cli", "deploy"], env=server["env"], cwd=REPO,
                                      capture_output=True, text=True, timeout=300)
            assert deployed.returncode == 0, deployed.stdout[-2000:] + deployed.stderr[-2000:]
            worker = start([sys.executable, "-m", "tailflow.cli", "worker"], server["env"], home / "worker.log")
            try:
                yield server
            finally:
                stop(worker)
    except RuntimeError as error:
        pytest.fail(str(error))


def trigger(prefect_server, parameters: dict):
    from prefect.deployments import run_deployment

    with api(prefect_server):
        return run_deployment("rl_training/rl-training", parameters=parameters, timeout=0)


def wait_final(prefect_server, flow_run_ids, timeout_s: float = 480):
    from prefect.client.orchestration import get_client

    deadline = time.time() + timeout_s
    with api(prefect_server), get_client(sync_client=True) as client:
        while True:
            runs = [client.read_flow_run(run_id) for run_id in flow_run_ids]
            if all(run.state.is_final() for run in runs):
                return runs
            if time.time() > deadline:
                log = (prefect_server["home"] / "worker.log").read_text()[-4000:]
                pytest.fail(f"flow runs not finished: {[r.state.name for r in runs]}\nworker log:\n{log}")
            time.sleep(3)


def test_deployments_are_registered_with_schedule_and_schema(prefect_server):
    """Costs ~25 s here, nearly all of it the module's `prefect_server` fixture, which this first test pays for
    (a `tailflow server`, `tailflow deploy` and a worker); its own checks are API reads. The deployments must
    come from the real `tailflow deploy` against a real server, which is what it checks."""
    from prefect.client.orchestration import get_client

    with api(prefect_server), get_client(sync_client=True) as client:
        from prefect.client.schemas.sorting import DeploymentSort

        names = {(d.name, d.work_pool_name) for d in client.read_deployments(limit=50, sort=DeploymentSort.NAME_ASC)}
        assert {("rl-training", "tailflow"), ("resume-every-6h", "tailflow"), ("warm-start", "tailflow"),
                ("evaluate", "tailflow")} <= names
        training = client.read_deployment_by_name("rl_training/rl-training")
        schema = training.parameter_openapi_schema["properties"]
        assert {"config_path", "overrides", "run_id", "resume", "allow_change"} <= set(schema)
        assert training.enforce_parameter_schema
        scheduled = client.read_deployment_by_name("rl_training/resume-every-6h")
        assert scheduled.parameters == {"run_id": "long-run", "resume": True}
        assert [s.active for s in scheduled.schedules] == [False]  # created paused: an example
        assert scheduled.schedules[0].schedule.interval.total_seconds() == 6 * 3600
        assert scheduled.global_concurrency_limit.limit == 1
        assert scheduled.concurrency_options.collision_strategy == "CANCEL_NEW"


def test_invalid_parameters_are_rejected_with_the_field_named(prefect_server, tmp_path):
    """Costs ~13 s here (two triggers the API refuses at once, then one flow run the worker starts as a process
    of its own and fails on the unknown key before any work): the unknown key can only be refused by the flow
    run, so one must start."""
    from prefect.exceptions import PrefectHTTPStatusError

    with pytest.raises(Exception, match="overrides") as refused:  # the API checks the parameter schema
        trigger(prefect_server, {"overrides": 5, "run_id": "bad-type"})
    assert isinstance(refused.value, (PrefectHTTPStatusError, ValueError)) or "schema" in str(refused.value).lower()
    with pytest.raises(Exception, match="lrr"):  # the config parameter's schema is the pydantic config's own
        trigger(prefect_server, {"config": {"train": {"lrr": 1}}, "run_id": "bad-config"})
    storage = tmp_path / "runs"
    bad_key = trigger(prefect_server, {"overrides": [*TINY, f"storage.uri={storage}", "train.lrr=1"],
                                       "run_id": "bad-key"})
    (run,) = wait_final(prefect_server, [bad_key.id], timeout_s=240)
    assert run.state.is_failed() and "train.lrr: unknown key" in (run.state.message or "")
    assert not (storage / "bad-key").exists()  # refused before any work started
    assert run.run_count == 1  # a user error cancels Prefect's retries


def test_two_triggers_for_one_run_id_never_both_write(prefect_server, tmp_path_factory):
    """Costs ~70 s here (two flow runs started by the worker at once, one doing a 2-iteration run with Ray and
    its actors, the other refused by the lease): two real flow-run processes racing for one run id is what it
    checks."""
    storage = tmp_path_factory.mktemp("ui-runs")
    parameters = {"overrides": [*TINY, f"storage.uri={storage}"], "run_id": "ui-run"}
    first, second = trigger(prefect_server, parameters), trigger(prefect_server, parameters)
    runs = wait_final(prefect_server, [first.id, second.id])
    completed = [run for run in runs if run.state.is_completed()]
    refused = [run for run in runs if not run.state.is_completed()]
    assert completed, [r.state.message for r in runs]
    for run in refused:  # refused at once by the run's lease, the holder named
        assert "run ui-run is being written by" in (run.state.message or "") and run.run_count == 1
    rows = [json.loads(line) for line in (storage / "ui-run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1]  # each iteration exactly once: no second writer
    # the flow run that did the work is the one with iteration subflows (a trigger that started after the
    # first finished completes too, having nothing left to do)
    (worker_run,) = [run for run in completed if subflow_names(prefect_server, run.id)]
    assert subflow_names(prefect_server, worker_run.id) == {"iter-0000", "iter-0001"}
    prefect_server["ui_run"] = worker_run.id


def subflow_names(prefect_server, flow_run_id) -> set[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with api(prefect_server), get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))
    return {run.name for run in runs}


def test_flow_run_page_shows_subflows_and_artifacts_in_chromium(prefect_server):
    """Costs ~20 s here (headless Chromium starting and loading the Prefect UI's flow run page, three tabs each
    waited for): it reads the run the concurrency test made, so it pays for no run of its own; the page is drawn
    by the UI's JavaScript, so only a browser can check it."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("Debian chromium and chromium-driver are not installed (scripts/test.sh installs them as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    flow_run_id = prefect_server.get("ui_run")
    assert flow_run_id, "the concurrency test did not leave a completed run"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-dev-shm-usage", "--window-size=1400,1000",
                     f"--user-data-dir={prefect_server['home'] / 'chromium-profile'}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    try:
        page = f"{prefect_server['ui']}/runs/flow-run/{flow_run_id}"
        body = lambda: driver.find_element("tag name", "body").text  # noqa: E731

        def wait_for(texts: tuple[str, ...], screenshot: str) -> None:
            try:
                WebDriverWait(driver, 60).until(lambda _: all(text in body() for text in texts))
            except TimeoutException:
                pass
            finally:
                driver.save_screenshot(str(OUTPUT_DIR / screenshot))
            assert all(text in body() for text in texts), body()[:3000]

        def open_tab(name: str) -> None:
            tab = f"(//*[normalize-space(.)='{name}'])[last()]"  # the innermost element holding the tab's label
            WebDriverWait(driver, 60).until(lambda _: driver.find_elements("xpath", tab))
            driver.execute_script("arguments[0].click();", driver.find_element("xpath", tab))

        driver.get(page)
        open_tab("Subflow Runs")
        wait_for(("iter-0000", "iter-0001"), "flow-run-subflows.png")
        open_tab("Artifacts")
        wait_for(("ui-run-metrics", "ui-run-progress", "ui-run-checkpoint", "ui-run-report"), "flow-run-artifacts.png")
        open_tab("Logs")
        wait_for(("[tailflow] iter 0000", "[tailflow] iter 0001"), "flow-run-logs.png")
    finally:
        driver.quit()
    print(f"screenshots: {OUTPUT_DIR / 'flow-run-subflows.png'}, {OUTPUT_DIR / 'flow-run-artifacts.png'}")
    assert (OUTPUT_DIR / "flow-run-subflows.png").stat().st_size > 10_000
