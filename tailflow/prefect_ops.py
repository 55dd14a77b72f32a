"""`tailflow server`, `tailflow worker` and `tailflow deploy`: thin wrappers over Prefect's own CLI.

They only pick tailflow's defaults (the `tailflow` process work pool, the
deployments in `deployments/prefect.yaml`) so the commands users already know
from Prefect keep working underneath.
"""
from __future__ import annotations

import os
import sys
from contextlib import suppress
from pathlib import Path

WORK_POOL = "tailflow"


class DeployError(RuntimeError):
    pass


def prefect(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefect", *args]


def server_command(host: str, port: int) -> list[str]:
    """Prefect's `prefect server start`, run by tailflow/prefect_server.py (which says why)."""
    return [sys.executable, "-m", "tailflow.prefect_server", "server", "start", "--host", host, "--port", str(port)]


SQLITE_CACHED_STATEMENTS = 16
"""Prepared statements each of the server's SQLite connections keeps (Python's sqlite3 default: 128).

Prefect's queries vary in their text (an `IN` list per number of ids), so each pooled connection's cache fills
with statements and the parameters last bound to them; under a long run that was most of the server's growth
(heaptrack on `prefect server start` over 250 micro iterations of bench/longrun.py: 8 of the 10.5 MB allocated
and still held were SQLite's, in cached statements and their bound values). Sixteen keeps the statements a run
repeats every iteration; the rest are prepared again, which costs microseconds."""


MALLOC_ARENA_MAX = "2"
"""glibc's heap arenas for the server's threads (its default: 8 a core). With fewer, freed memory is reused across
threads instead of kept per arena; with tailflow/prefect_server.py's trim it kept the server's RSS flat after
its first ~300 micro iterations (the numbers are there)."""


def server_environment(environ: dict[str, str]) -> dict[str, str]:
    """`environ` for `prefect server start`: `MALLOC_ARENA_MAX`, unless the user set it; on a SQLite database
    (Prefect's default, or a `sqlite` URL of the user's), the same URL with
    `cached_statements=SQLITE_CACHED_STATEMENTS`, unless it names its own. Another database's URL is left as it
    is."""
    from prefect.settings import Settings

    environ = {"MALLOC_ARENA_MAX": MALLOC_ARENA_MAX, **environ}
    configured = Settings().server.database.connection_url  # as the environment and profile say now
    url = configured.get_secret_value() if configured is not None else ""
    if not url.startswith("sqlite") or "cached_statements=" in url:
        return environ
    separator = "&" if "?" in url else "?"
    return {**environ, "PREFECT_SERVER_DATABASE_CONNECTION_URL":
            f"{url}{separator}cached_statements={SQLITE_CACHED_STATEMENTS}"}


def worker_command(pool: str = WORK_POOL) -> list[str]:
    return prefect("worker", "start", "--pool", pool, "--type", "process")


def ensure_work_pool(pool: str) -> None:
    """Create the process work pool if the server lacks it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            with suppress(ObjectAlreadyExists):  # another deploy created it meanwhile
                client.create_work_pool(WorkPoolCreate(name=pool, type="process"))


def deploy(repo: Path | None = None, pool: str = WORK_POOL) -> str:
    """Register every deployment of `deployments/prefect.yaml` on the server at PREFECT_API_URL.

    The file is the one definition (`prefect deploy --all --prefect-file deployments/prefect.yaml` reads it
    too, and with fastapi < 0.151 registers all of them; docs/operations.md). We register it through
    Prefect's `RunnerDeployment` so that one command also creates the work pool, needs no TAILFLOW_REPO and
    points the worker at this checkout.
    """
    import yaml
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise DeployError("tailflow deploy needs a Prefect server: start one with `tailflow server` and set "
                          "PREFECT_API_URL=http://127.0.0.1:4200/api")
    repo = (repo or Path(__file__).resolve().parents[1]).resolve()  # default: this (editable) checkout
    prefect_file = repo / "deployments" / "prefect.yaml"
    if not prefect_file.is_file():
        raise DeployError(f"{prefect_file} does not exist: run tailflow deploy from a tailflow checkout "
                          "(pip install -e .), or pass --repo")
    definitions = yaml.safe_load(prefect_file.read_text())["deployments"]
    ensure_work_pool(pool)
    lines = []
    previous = os.getcwd()
    os.chdir(repo)  # entrypoints are relative to the checkout, as the worker will see them
    try:
        for definition in definitions:
            flow_name, deployment_id = register(definition, repo, pool)
            lines.append(f"deployment {flow_name}/{definition['name']}: {deployment_id}")
    finally:
        os.chdir(previous)
    return "\n".join(lines) + f"\nwork pool {pool}: start a worker with `tailflow worker`\n"


def register(definition: dict, repo: Path, pool: str):
    from prefect.client.schemas.objects import ConcurrencyLimitConfig
    from prefect.deployments.runner import RunnerDeployment
    from prefect.schedules import Interval

    limit = definition.get("concurrency_limit")
    schedules = [Interval(item["interval"], active=item.get("active", True), parameters=item.get("parameters"))
                 for item in definition.get("schedules") or []]
    deployment = RunnerDeployment.from_entrypoint(
        definition["entrypoint"], name=definition["name"], parameters=definition.get("parameters") or {},
        description=definition.get("description"), tags=definition.get("tags"),
        enforce_parameter_schema=definition.get("enforce_parameter_schema", True),
        work_pool_name=pool, work_queue_name=definition.get("work_pool", {}).get("work_queue_name"),
        job_variables={**(definition.get("work_pool", {}).get("job_variables") or {}), "working_dir": str(repo)},
        schedules=schedules or None,
        concurrency_limit=ConcurrencyLimitConfig(**limit) if isinstance(limit, dict) else limit,
    )
    return deployment.flow_name, deployment.apply(work_pool_name=pool)
