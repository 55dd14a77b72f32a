"""Start or attach to Ray; the only place the run decides where Ray lives."""
from __future__ import annotations

import os

NO_IDLE_WORKERS = {"prestart_worker_first_driver": False}
"""Ray's `_system_config` for a local start: Ray prestarts one idle worker per logical CPU for the first driver.
No task of ours runs on them (every actor asks for its own resources and starts its own process), so each only
costs a start-up (2-3 CPU-seconds of a 3-iteration tiny run's ~45 measured here, 2026-11-27)."""


def start_ray(address: str | None, num_cpus: int | None, min_cpus: int, num_gpus: int | None = None) -> None:
    """Attach to `address`, or start a local Ray with at least `min_cpus` logical CPUs (and `num_gpus` GPUs;
    None: those Ray detects).

    Locally the phases of a synchronous step take turns (rollout, then train), so
    the actors may ask for more logical CPUs than the machine has cores.
    """
    import ray

    if ray.is_initialized():
        return
    # Workers load models with transformers; its per-load progress bars would drown the run's own lines.
    worker_env = {"env_vars": {"TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error"}}
    quiet = {"include_dashboard": False, "log_to_driver": True, "configure_logging": False, "runtime_env": worker_env}
    if address:
        ray.init(address=address, **quiet)
        return
    cpus = max(num_cpus or os.cpu_count() or 1, min_cpus)
    gpus = {} if num_gpus is None else {"num_gpus": num_gpus}
    ray.init(num_cpus=cpus, **gpus, **quiet, _system_config=NO_IDLE_WORKERS)

