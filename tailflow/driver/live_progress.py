"""Live progress of a run: a run bar with an ETA and one line for the round in flight.

On a terminal, rich draws both and keeps them at the bottom while the run's
lines scroll above. Anywhere else (a file, a Prefect worker's log) the round
line is a plain log line at most every `TAILFLOW_PROGRESS_EVERY_S` seconds
(default 10). Either way the run's Prefect progress artifact moves within a
round (at most every 2 s), by the fraction of the round's P0 prompts complete.

While the run lives, its Ray actors' stderr lines (warnings, errors) are also
filed in the flow run's Prefect logs, at WARNING (ERROR for errors and
tracebacks); the terminal already shows them, as Ray prints them there.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

from tailflow.config import RunConfig
from tailflow.driver.run_log import say, tolerated
from tailflow.engines.data.problem import Problem
from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.store import open_store
from tailflow.engines.track.live import RoundCount, RoundWatcher

ARTIFACT_EVERY_S = 2.0


def round_line(iteration: int, count: RoundCount, seconds: float, queue_size: int, compact: bool = False) -> str:
    """The round's live line; `compact` fits an 80-column terminal beside the bars."""
    rate = count.num_tokens / seconds if seconds > 0 else 0.0
    if compact:
        return f"iter {iteration:04d}: {count.in_flight} in flight, {rate:.0f} tok/s, queue {queue_size}"
    return (f"[tailflow] iter {iteration:04d} round: {count.prompts_done}/{count.prompts_needed} prompts complete | "
            f"{count.in_flight} requests in flight | {rate:.0f} tok/s (finished responses) | long queue {queue_size}")


class LiveProgress:
    def __init__(self, config: RunConfig, run_id: str, terminal: bool):
        committed = read_committed_state(open_store(config.storage.uri), run_id)
        self.config, self.run_id = config, run_id
        self.done = committed.iteration if committed else 0
        self.queue_ids = {entry.problem_id for entry in committed.tail.queue} if committed else set()
        self.plain_every_s = float(os.environ.get("TAILFLOW_PROGRESS_EVERY_S", "10"))
        self.last_plain = self.last_artifact = 0.0
        self.progress_id = None
        self.display = TerminalDisplay(run_id, config.train.iterations, self.done) if terminal else None

    def watcher(self, problems: Sequence[Problem]) -> RoundWatcher:
        config = self.config
        is_long = config.tail.enabled and bool(problems) and all(p.problem_id in self.queue_ids for p in problems)
        per_prompt = config.responses_launched if config.tail.enabled and not is_long else config.rollout.n
        count = RoundCount(len(problems), per_prompt, config.data.prompts_per_step, config.rollout.n)
        started = time.perf_counter()

        def watch(completions) -> None:
            count.add(completions)
            self.round_update(count, time.perf_counter() - started)
        return watch

    def round_update(self, count: RoundCount, seconds: float) -> None:
        line = round_line(self.done, count, seconds, len(self.queue_ids), compact=self.display is not None)
        now = time.monotonic()
        if self.display is not None:
            self.display.round(line, count.prompts_done, count.prompts_needed)
        elif now - self.last_plain >= self.plain_every_s:
            self.last_plain = now
            say(line)
        if now - self.last_artifact >= ARTIFACT_EVERY_S:
            self.last_artifact = now
            self.update_artifact(self.done + count.prompts_done / max(count.prompts_needed, 1))

    def update_artifact(self, iterations: float) -> None:
        """The run's `<run>-progress` artifact (RunArtifacts made it) moved to `iterations` of the planned."""
        from prefect.artifacts import update_progress_artifact

        from tailflow.driver.artifacts import artifact_key

        with tolerated("the progress artifact's update"):
            if self.progress_id is None:
                self.progress_id = latest_artifact_id(f"{artifact_key(self.run_id)}-progress")
            if self.progress_id is not None:
                planned = self.config.train.iterations
                update_progress_artifact(self.progress_id, 100.0 * iterations / max(planned, 1),
                                         description=f"run {self.run_id}: iteration {int(iterations)} of {planned} "
                                                     "in progress")

    def iteration_done(self, state) -> None:
        self.done = state.iteration
        self.queue_ids = {entry.problem_id for entry in state.tail.queue}
        if self.display is not None:
            self.display.run(self.done)

    def close(self) -> None:
        if self.display is not None:
            self.display.stop()


def latest_artifact_id(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort
    from prefect.runtime import flow_run

    if not flow_run.id:
        return None
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                      sort=ArtifactSort.CREATED_DESC, limit=1)
    return found[0].id if found else None


class TerminalDisplay:
    """rich: the run bar (iterations, ETA) and the round's bar (prompts complete of P0) with its line, redrawn in
    place at the bottom."""

    def __init__(self, run_id: str, planned: int, done: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeRemainingColumn(), redirect_stdout=True, redirect_stderr=True)
        self.run_task = self.progress.add_task(f"run {run_id}"[:40], total=planned, completed=done)
        self.round_task = self.progress.add_task("waiting for the first round", total=1, completed=0)
        self.progress.start()

    def round(self, line: str, done: int, needed: int) -> None:
        self.progress.update(self.round_task, description=line, completed=done, total=needed)

    def run(self, done: int) -> None:
        self.progress.update(self.run_task, completed=done)

    def stop(self) -> None:
        self.progress.stop()


@contextmanager
def live_progress(config: RunConfig, run_id: str, terminal: bool | None = None) -> Iterator[LiveProgress]:
    """Show the run's live progress while inside (rich on a terminal, plain lines elsewhere); the run hands
    `live.watcher` to each round's scorer and tells `live` when an iteration is done."""
    from prefect.runtime import flow_run

    from tailflow.engines.cluster.actor_output import actor_stderr_to

    live = LiveProgress(config, run_id, sys.stdout.isatty() if terminal is None else terminal)
    flow_run_id = flow_run.id
    try:
        if flow_run_id:
            with actor_stderr_to(lambda line, severe: say(line, flow_run_id=flow_run_id,
                                                          level=logging.ERROR if severe else logging.WARNING)):
                yield live
        else:
            yield live
    finally:
        live.close()
