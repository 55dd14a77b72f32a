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

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


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


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session (starting Ray costs seconds)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_path(random_tiny_model_dir):
    """The random tiny model's directory as a string (what trainers and workers take)."""
    return str(random_tiny_model_dir)


@pytest.fixture(scope="module")
def ray_cluster():
    """A 2-CPU local Ray for one module (FSDP2 rank tests), shut down after it unless it was already running."""
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=2, include_dashboard=False)
    yield
    if started_here:
        ray.shutdown()
