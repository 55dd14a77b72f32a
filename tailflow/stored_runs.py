"""What the artifact store says about runs: for `tailflow runs` and `export` (the config a resume continues
with is `tailflow.driver.resume.resume_config`'s).

Everything here trusts only what a run's `latest.json` names (the commit
protocol, `tailflow.engines.runs.commit`): a checkpoint or state written after
the last commit is invisible, so `tailflow runs`, a resume and an export all
agree on one iteration. The CLI parses and prints; this module reads the store and
returns named records.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailflow.engines.run_state import RunState
from tailflow.engines.runs.checkpoint import CRITIC_DIR, OPTIMIZER_FILE, SHARDS_DIR, WEIGHTS_FILE, weights_sha256
from tailflow.engines.runs.commit import CommitError, read_committed_state
from tailflow.engines.runs.layout import RunError, config_key, read_run_config, require_run
from tailflow.engines.store.local import PROCESS_UMASK

QUEUE_PREVIEW = 5
"""How many of the oldest queued prompt ids a `StoredRun` names."""


@dataclass(frozen=True)
class StoredRun:
    """One run as its last commit describes it (`tailflow runs show --json` prints these fields)."""

    run_id: str
    config: str
    """URI of the run's saved config.yaml."""
    committed: bool
    """False: the run never committed (not started, or crashed before its first commit)."""
    iteration: int
    """Iterations completed and committed."""
    iterations_planned: int
    """`train.iterations` of the run's config."""
    round_history: list[int]
    """Per iteration: 0 short round, 1 long round (tail batching)."""
    long_queue_size: int
    long_queue_oldest: list[str]
    """Problem ids of the oldest queued prompts (at most QUEUE_PREVIEW), oldest first."""
    latest_checkpoint: str | None
    """URI of the committed checkpoint; None: the run's initial model."""
    weights_sha256: str | None
    initial_eval_accuracy: float | None
    last_eval_accuracy: float | None
    reward_timeout_anchor_s: float | None = None
    """Code rewards: the adaptive timeout's task anchor (a high quantile of recent correct executions)."""


@dataclass(frozen=True)
class UnreadableRun:
    """A run directory `tailflow runs list` could not read (the reason is one line)."""

    run_id: str
    reason: str


@dataclass(frozen=True)
class ExportResult:
    directory: Path
    checkpoint: str
    """URI of the exported checkpoint."""
    iteration: int
    weights_sha256: str


def read_run(store: Any, run_id: str) -> StoredRun:
    require_run(store, run_id)
    config = read_run_config(store, run_id)
    state = read_committed_state(store, run_id)
    committed = state is not None
    state = state or RunState(run_id=run_id)
    return StoredRun(
        run_id=run_id,
        config=store.uri(config_key(run_id)),
        committed=committed,
        iteration=state.iteration,
        iterations_planned=config.train.iterations,
        round_history=list(state.round_history),
        long_queue_size=len(state.tail.queue),
        long_queue_oldest=[p.problem_id for p in state.tail.queue[:QUEUE_PREVIEW]],
        latest_checkpoint=store.uri(state.latest_checkpoint) if state.latest_checkpoint else None,
        weights_sha256=state.weights_sha256,
        initial_eval_accuracy=state.initial_eval_accuracy,
        last_eval_accuracy=state.last_eval_accuracy,
        reward_timeout_anchor_s=state.reward_anchors.task_s,
    )


def list_runs(store: Any) -> list[StoredRun | UnreadableRun]:
    """Every directory under the store root with a config.yaml, by run id; one broken run does not hide
    the others."""
    runs: list[StoredRun | UnreadableRun] = []
    for name in store.list_dir():
        if not store.exists(config_key(name)):
            continue  # not a run: a warm-start cache, or something else sharing the store
        try:
            runs.append(read_run(store, name))
        except (CommitError, TypeError, ValueError) as error:  # ValueError: a ConfigError, or a bad queue record
            runs.append(UnreadableRun(name, " ".join(str(error).split())))
    return runs


def rounds_text(history: list[int], limit: int = 60) -> str:
    """'SSSSL SSSSL SS (12 short, 2 long)': S short, L long, in fives by iteration; only the newest
    `limit` (rounded up to a group) are spelled out."""
    if not history:
        return "none yet"
    start = max(0, (len(history) - limit) // 5 * 5)
    letters = "".join("L" if kind else "S" for kind in history[start:])
    groups = " ".join(letters[i:i + 5] for i in range(0, len(letters), 5))
    skipped = f"... ({start} earlier) " if start else ""
    num_long = sum(1 for kind in history if kind)
    return f"{skipped}{groups} ({len(history) - num_long} short, {num_long} long)"


def check_export_target(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise RunError(f"export directory {directory} is a file")
    if directory.is_dir() and any(directory.iterdir()):
        raise RunError(f"export directory {directory} is not empty; name a new or empty directory")


def export_checkpoint(store: Any, run_id: str, directory: str | Path) -> ExportResult:
    """Copy the committed checkpoint, minus the optimizer state (optimizer.pt, Megatron's per-rank shards) and the
    critic (train.advantage gae), into
    `directory` as a Hugging Face model directory.

    The copy is staged beside `directory` and renamed into place only after its weights match the sha256
    the commit recorded, so a refused or failed export leaves nothing behind."""
    target = Path(directory).expanduser().absolute()
    check_export_target(target)
    require_run(store, run_id)
    state = read_committed_state(store, run_id)
    if state is None or state.latest_checkpoint is None:
        done = 0 if state is None else state.iteration
        raise RunError(f"run {run_id} in {store.uri()} has no checkpoint yet ({done} iterations committed)")
    checkpoint_uri = store.uri(state.latest_checkpoint)
    source = store.local_dir(state.latest_checkpoint)
    if not (source / WEIGHTS_FILE).is_file():
        raise RunError(f"checkpoint {checkpoint_uri} has no {WEIGHTS_FILE}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.export-"))
    try:
        os.chmod(staging, 0o777 & ~PROCESS_UMASK)  # mkdtemp makes 0700; an export is an ordinary directory
        leave_out = shutil.ignore_patterns(OPTIMIZER_FILE, SHARDS_DIR, CRITIC_DIR, ".*")
        shutil.copytree(source, staging, dirs_exist_ok=True, ignore=leave_out)
        digest = weights_sha256(staging)
        if state.weights_sha256 is not None and digest != state.weights_sha256:
            raise RunError(f"checkpoint {checkpoint_uri}: {WEIGHTS_FILE} has sha256 {digest} but the commit "
                           f"recorded {state.weights_sha256}; not exported")
        check_export_target(target)  # still empty: nothing appeared while copying
        os.replace(staging, target)  # onto a missing or empty directory
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(target, checkpoint_uri, state.iteration, digest)
