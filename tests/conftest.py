"""Test-session setup: an isolated Prefect home before prefect is imported.

FACTS.md: the Prefect test harness does not isolate result storage, so the
whole session gets its own PREFECT_HOME; the harness itself is started once,
lazily, by the tests that need a Prefect API (`prefect_api` fixture).
"""
from __future__ import annotations

import os
import tempfile

_prefect_home = tempfile.mkdtemp(prefix="tailflow-prefect-")
os.environ["PREFECT_HOME"] = _prefect_home
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.pop("PREFECT_API_URL", None)
# A Ray started by a test with `ray start` (or a multi-node scenario) records itself as this machine's cluster, and
# ray.init() with no address joins the recorded one: with two test workers running at once, every run would join
# the other worker's cluster. "local" makes each ray.init() start its own; tests that attach give an address.
os.environ["RAY_ADDRESS"] = "local"

import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


@pytest.fixture(scope="session")
def cli_env(prefect_api):
    """The environment of `tailflow` child processes: they talk to this session's Prefect server instead of
    starting their own (tests/durable_cli.py runs them)."""
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value())
    env.pop("TAILFLOW_FAULT", None)
    return env


@pytest.fixture(scope="session")
def random_tiny_model_dir(tmp_path_factory):
    """The embedded tiny Qwen2 freshly initialised (seed 0) with its tokenizer, as a HF directory."""
    from tailflow.engines.models import write_random_tiny_model

    return write_random_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def random_code_model_dir(tmp_path_factory):
    """A freshly initialised tiny Qwen2 over printable ASCII: it can write (random) Python."""
    from tailflow.engines.data.tokenizer import PRINTABLE_ASCII
    from tailflow.engines.models import write_random_tiny_model

    return write_random_tiny_model(tmp_path_factory.mktemp("tiny-code") / "model", PRINTABLE_ASCII)


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for the module's tests (starting Ray costs seconds). Not kept for the whole session: an idle
    Ray (gcs, raylet, agents, monitors) took ~4% of a core here (2026-11-27), and a worker's session lasts
    the suite."""
    import ray

    from tailflow.engines.cluster.runtime import NO_IDLE_WORKERS

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, _system_config=NO_IDLE_WORKERS)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True, scope="module")
def no_ray_left_running():
    """A flow run in this process (`rl_training`) starts Ray and leaves it up, as a driver does until it exits;
    here the process is a test worker that lives on for the rest of the suite, so Ray is stopped after the module
    (idle, it would take ~4% of a core from every later test)."""
    yield
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


@pytest.fixture(scope="module")
def model_path(random_tiny_model_dir):
    """The random tiny model's directory as a string (what trainers and workers take)."""
    return str(random_tiny_model_dir)


@pytest.fixture(scope="module")
def ray_cluster():
    """A 2-CPU local Ray for one module (FSDP2 rank tests), shut down after it unless it was already running."""
    import ray

    from tailflow.engines.cluster.runtime import NO_IDLE_WORKERS

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=2, include_dashboard=False, _system_config=NO_IDLE_WORKERS)
    yield
    if started_here:
        ray.shutdown()


# ---- what runs, and what a skip means in CI ------------------------------------------------------------------

SLOW_KINDS = ("long", "e2e", "bench")
"""Markers of tests that are also `slow`: `-m "not slow"` (the fast subset) leaves every one of them out."""

NEEDS_A_GPU = ("CUDA", "GPU")
"""The one thing CI cannot have: a skip whose reason names it is expected; any other skip in CI is a failure."""

ci_skips: list[str] = []


def pytest_addoption(parser):
    parser.addoption("--vllm-only", action="store_true",
                     help="run only the tests marked vllm (scripts/test.sh runs them so, in .venv-vllm)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(kind) for kind in SLOW_KINDS) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    select_vllm_tests(config, items)


def select_vllm_tests(config, items) -> None:
    """Tests marked `vllm` need vLLM's CPU build, which lives in an environment of its own (.venv-vllm, made by
    scripts/test.sh with scripts/install_vllm.sh): where vLLM is not installed they are deselected, said in
    one line, and `--vllm-only` (the second pytest run of scripts/test.sh) runs just them, failing at once if
    vLLM is missing there. Deselected, never skipped: they run, in the other environment."""
    import importlib.util

    has_vllm = importlib.util.find_spec("vllm") is not None
    vllm_only = config.getoption("--vllm-only")
    if vllm_only and not has_vllm:
        raise pytest.UsageError("--vllm-only: vLLM is not installed in this Python environment "
                                "(scripts/install_vllm.sh installs vLLM's CPU build)")
    if has_vllm and not vllm_only:
        return
    dropped = [item for item in items if (item.get_closest_marker("vllm") is None) == vllm_only]
    if dropped:
        items[:] = [item for item in items if item not in set(dropped)]
        config.hook.pytest_deselected(items=dropped)
        if not vllm_only:
            config._tailflow_vllm_note = (f"{len(dropped)} tests marked vllm deselected: vLLM is not installed "
                                          "here; scripts/test.sh runs them in .venv-vllm")


def skip_reason(report) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def pytest_runtest_logreport(report):
    """In CI (`CI=true`) a test must not skip for a missing package, extra or system tool: `scripts/test.sh`
    installs them, so such a skip means the install broke. Only a missing GPU may skip."""
    if report.skipped and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        reason = skip_reason(report)
        if not any(word in reason for word in NEEDS_A_GPU):
            ci_skips.append(f"{report.nodeid}: {reason}")


def pytest_terminal_summary(terminalreporter, config):
    note = getattr(config, "_tailflow_vllm_note", None)
    if note:
        terminalreporter.write_line(note)
    if ci_skips:
        terminalreporter.section("skipped in CI for a missing dependency (a failure in CI)")
        for line in ci_skips:
            terminalreporter.line(line)


def pytest_sessionfinish(session, exitstatus):
    if ci_skips and session.exitstatus == 0:
        session.exitstatus = 1


# ---- where the time goes: one line a test, when scripts/test.sh asks (TAILFLOW_TEST_TIMES) -------------------

def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s() -> dict[tuple[int, int], float]:
    """CPU seconds of this process and of each live descendant (Ray workers, servers, subprocesses), keyed by
    (pid, start time) so a reused pid is another process; from /proc/<pid>/stat (fields 4 ppid, 14 utime,
    15 stime, 22 starttime; the name in parentheses may hold spaces)."""
    parent, seconds = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(entry)] = int(fields[1])
            seconds[int(entry), int(fields[19])] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    tree, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        for child in children.get(frontier.pop(), []):
            tree.add(child)
            frontier.append(child)
    return {key: cpu for key, cpu in seconds.items() if key[0] in tree}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With TAILFLOW_TEST_TIMES=<file>, append {nodeid, wall_s, tree_cpu_s, machine_busy_share} for each test:
    the CPU of the test's own process tree (itself, reaped children, live descendants) says whether a slow test
    computes or waits; the machine's busy share says whether the machine was loaded meanwhile."""
    path = os.environ.get("TAILFLOW_TEST_TIMES")
    if not path or Path(__file__).parent.name != "tests":  # not the copies of this file that tests run pytest on
        yield
        return
    wall, busy, tree = time.monotonic(), machine_busy_s(), tree_cpu_s()
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    yield
    wall, busy = time.monotonic() - wall, machine_busy_s() - busy
    after, reaped_after = tree_cpu_s(), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(seconds - tree.get(key, 0.0) for key, seconds in after.items())
    cpu += (reaped_after.ru_utime + reaped_after.ru_stime) - (reaped.ru_utime + reaped.ru_stime)
    row = {"nodeid": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "wall_s": round(wall, 2), "tree_cpu_s": round(cpu, 2),
           "machine_busy_share": round(busy / max(wall, 1e-6) / os.cpu_count(), 3)}
    with open(path, "a") as times:
        times.write(json.dumps(row) + "\n")
