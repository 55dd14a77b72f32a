"""A GPU session's device time, planned: the evidence kit's stages in priority order, each in its own process under
its own timeout, every result in one tar under the output folder.

    python bench/gpu_plan.py --dry-run                     # the plan and the expected seconds; runs nothing
    python bench/gpu_plan.py [--budget S] [--stages a,b] [--out DIR] [-- kit arguments]

(`scripts/gpu_session.sh` is the same with the carried wheels installed first: what a device call runs.)

Why this shape. A session gets 15 minutes of one GPU, all calls together, a machine start (30-60 s) included,
and at most 10 minutes a call; only 8 files of a call's output folder come back. So: the stages most worth
their seconds first (`PLAN`, with why); a stage starts only if its expected seconds fit what is left of the
call's budget (else a later, shorter one may take its place), and runs under a timeout (SIGINT, then SIGKILL)
so one hung stage cannot eat the rest; each stage is its own process (a CUDA error or an out-of-memory in one
leaves the next a clean device); after every stage the work folder (printouts, JSON records, calibration
files) is tarred again into `--out`, so a call killed from outside still returns what finished. What did not
fit, or timed out, is printed as the next call's `--stages`.

Expected seconds: the `[stage] N s` lines of the second H200 session (2026-11-28, every stage in one call), and
`PROCESS_START_S`, each stage's process start (Python, torch with CUDA, transformers) that those lines do not
include, from the same session.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]

SESSION_S = 900
"""A session's device time, every call together."""
MACHINE_START_S = 60
"""A machine start, counted in the session's time (30-60 s seen)."""
CALL_LIMIT_S = 600
"""The most one device call may run."""
CALL_MARGIN_S = 30
"""Kept free in a call: the wheels' install, the tar, the transfer back."""
PROCESS_START_S = 20
"""One stage's process start: the stage's whole process less its `[stage] N s`, 14-22 s on the H200
(2026-11-28)."""
GRACE_S = 10
"""After SIGINT at a stage's timeout, how long before SIGKILL."""


@dataclass(frozen=True)
class PlannedStage:
    name: str
    expected_s: float
    """The stage's own `[stage] N s`."""
    basis: str
    """Where `expected_s` comes from."""
    why: str
    """Why it sits where it does in the order."""

    @property
    def cost_s(self) -> float:
        """What it takes of a call: its seconds and its process start."""
        return self.expected_s + PROCESS_START_S

    @property
    def timeout_s(self) -> int:
        """Half again its cost, at least 30 s more: an estimate may be off; a hang must not take the call."""
        return int(math.ceil(max(1.5 * self.cost_s, self.cost_s + 30)))


PLAN = (
    PlannedStage("contract", 37, "measured: 37.1 s (H200, 2026-11-28)", "the engine contract: the check of every "
                 "engine change since the last GPU session"),
    PlannedStage("trainer", 58, "measured: 58.2 s (H200, 2026-11-28)", "FSDP2 vs Megatron-core on CUDA, the "
                 "stream trainer, the weight sync: run once"),
    PlannedStage("rope", 34, "measured: 34.1 s (H200, 2026-11-28; the chunked fp32 reference)", "ran once; its "
                 "error floor on this shape is high (docs/gpu.md)"),
    PlannedStage("turns", 23, "measured: 23.4 s (H200, 2026-11-28)", "the colocated turn with the staged offload"),
    PlannedStage("rounds", 102, "measured: 101.5 s (H200, 2026-11-28)", "tail batching on a GPU engine: 1.67x "
                 "and 1.70x in two sessions"),
    PlannedStage("graphs", 20, "measured: 20.1 s (H200, 2026-11-28)", "the sleep/wake difference: not reproduced "
                 "once"),
    PlannedStage("offload", 24, "measured: 23.9 s (H200, 2026-11-28)", "the staged offload against the blocking "
                 "one: measured once"),
    PlannedStage("calibrate", 34, "measured: 34.1 s (H200, 2026-11-28)", "measured twice; kernels unchanged"),
    PlannedStage("throughput", 82, "measured: 81.9 s (H200, 2026-11-28; a 75 s budget and the model build)",
                 "measured once (8.8x generate(), cut)"),
)


@dataclass(frozen=True)
class StageRun:
    name: str
    status: str
    """"ran" (exit 0), "failed" (another exit code), "timed out", or "did not fit"."""
    seconds: float
    returncode: int | None
    timeout_s: int | None


def schedule(plan: Sequence[PlannedStage], budget_s: float) -> tuple[list[PlannedStage], list[PlannedStage]]:
    """(what fits `budget_s`, taken in order, a stage that does not fit passed over for a later one that
    does, as `run_plan` does; what is left)."""
    fits, left, used = [], [], 0.0
    for stage in plan:
        if used + stage.cost_s <= budget_s:
            fits.append(stage)
            used += stage.cost_s
        else:
            left.append(stage)
    return fits, left


def describe_plan(plan: Sequence[PlannedStage], session_s: float = SESSION_S) -> list[str]:
    """The calls a session's time allows, each with its stages, expected seconds and timeouts."""
    lines = [f"session {session_s} s of device time; machine start {MACHINE_START_S} s; one call at most "
             f"{CALL_LIMIT_S} s, {CALL_MARGIN_S} s of it kept for wheels, tar and transfer; "
             f"{PROCESS_START_S} s per stage process (measured)"]
    left_s, remaining, call = session_s - MACHINE_START_S, list(plan), 1
    while remaining and left_s > CALL_MARGIN_S:
        budget = min(CALL_LIMIT_S, left_s) - CALL_MARGIN_S
        fits, remaining = schedule(remaining, budget)
        if not fits:
            break
        used = sum(s.cost_s for s in fits)
        lines.append(f"call {call}: --budget {budget:.0f} --stages {','.join(s.name for s in fits)}  "
                     f"(expected {used:.0f} s)")
        lines.append(f"  {'stage':<11}{'expected s':>11}{'+ start':>9}{'timeout':>9}  basis; why here")
        for stage in fits:
            lines.append(f"  {stage.name:<11}{stage.expected_s:>11.0f}{PROCESS_START_S:>9}{stage.timeout_s:>9}  "
                         f"{stage.basis}; {stage.why}")
        left_s -= used + CALL_MARGIN_S
        call += 1
    lines.append("left for another session: " + (", ".join(s.name for s in remaining) if remaining else "nothing")
                 + f" (about {max(left_s, 0):.0f} s of this one unplanned)")
    return lines


def run_stage(name: str, argv: list[str], timeout_s: int, log_path: Path) -> StageRun:
    """Run `argv`, its output both printed and written to `log_path`; SIGINT at `timeout_s`, SIGKILL after
    `GRACE_S` more."""
    started = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                   start_new_session=True)
        deadline = started + timeout_s

        def watchdog() -> None:
            nonlocal timed_out
            while process.poll() is None:
                if time.perf_counter() > deadline and not timed_out:
                    timed_out = True
                    os.killpg(process.pid, signal.SIGINT)
                elif timed_out and time.perf_counter() > deadline + GRACE_S:
                    os.killpg(process.pid, signal.SIGKILL)
                    return
                time.sleep(0.1)

        guard = threading.Thread(target=watchdog, daemon=True)
        guard.start()
        for line in process.stdout:
            print(line, end="", flush=True)
            log.write(line)
        process.wait()
        guard.join(timeout=1)
    seconds = time.perf_counter() - started
    status = "timed out" if timed_out else ("ran" if process.returncode == 0 else "failed")
    return StageRun(name, status, seconds, process.returncode, timeout_s)


def tar_results(work: Path, out: Path, name: str = "gpu_evidence_results.tar.gz") -> Path:
    """Everything in `work` into one tar in `out`, replaced atomically (a call killed mid-write keeps the last)."""
    target = out / name
    partial = out / (name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        for path in sorted(work.iterdir()):
            tar.add(path, arcname=path.name)
    partial.replace(target)
    return target


def run_plan(plan: Sequence[PlannedStage], budget_s: float, argv_for: Callable[[PlannedStage], list[str]],
             work: Path, out: Path) -> list[StageRun]:
    """Each stage in order if its cost fits what is left of `budget_s`, under `min(its timeout, what is left)`;
    the summary and the tar written after each."""
    started = time.perf_counter()
    runs: list[StageRun] = []
    for stage in plan:
        left = budget_s - (time.perf_counter() - started)
        if stage.cost_s > left:
            runs.append(StageRun(stage.name, "did not fit", 0.0, None, None))
            print(f"[plan] {stage.name}: expected {stage.cost_s:.0f} s, {left:.0f} s left: not started", flush=True)
            continue
        timeout_s = max(1, int(min(stage.timeout_s, left)))
        print(f"[plan] {stage.name}: expected {stage.cost_s:.0f} s, timeout {timeout_s} s, {left:.0f} s left",
              flush=True)
        runs.append(run_stage(stage.name, argv_for(stage), timeout_s, work / f"gpu_evidence_{stage.name}.log"))
        (work / "gpu_plan_summary.json").write_text(json.dumps([asdict(r) for r in runs], indent=1) + "\n")
        tar_results(work, out)
    (work / "gpu_plan_summary.json").write_text(json.dumps([asdict(r) for r in runs], indent=1) + "\n")
    tar_results(work, out)
    return runs


def describe_runs(runs: Sequence[StageRun]) -> list[str]:
    lines = [f"{'stage':<11}{'status':>12}{'seconds':>9}{'exit':>6}{'timeout':>9}"]
    for r in runs:
        lines.append(f"{r.name:<11}{r.status:>12}{r.seconds:>9.1f}{'-' if r.returncode is None else r.returncode:>6}"
                     f"{'-' if r.timeout_s is None else r.timeout_s:>9}")
    left = [r.name for r in runs if r.status in ("did not fit", "timed out")]
    lines.append(f"next call: --stages {','.join(left)}" if left else "every stage started and ended in time")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan and expected seconds; run nothing")
    parser.add_argument("--budget", type=float, default=CALL_LIMIT_S - CALL_MARGIN_S,
                        help="seconds this call may spend on stages")
    parser.add_argument("--stages", default=None, help="comma-separated subset, run in the plan's order")
    parser.add_argument("--out", type=Path, default=None, help="where the tar goes (default: $OUT, else a new "
                        "temporary directory)")
    parser.add_argument("--work", type=Path, default=None, help="where stages write (default: a new temporary "
                        "directory; it all goes into the tar)")
    parser.add_argument("kit_args", nargs="*", help="after --: more bench/gpu_evidence.py arguments")
    args = parser.parse_args(argv)
    plan = list(PLAN)
    if args.stages:
        wanted = args.stages.split(",")
        unknown = set(wanted) - {s.name for s in PLAN}
        if unknown:
            parser.error(f"unknown stages {sorted(unknown)}")
        plan = [s for s in PLAN if s.name in wanted]
    if args.dry_run:
        print("\n".join(describe_plan(plan)))
        fits, left = schedule(plan, args.budget)
        print(f"this call (--budget {args.budget:.0f}): {', '.join(s.name for s in fits) or 'nothing'}"
              + (f"; then {', '.join(s.name for s in left)}" if left else ""))
        return 0
    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu-plan-out-"))
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-plan-work-"))
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    print(f"results: {work} -> {out}/gpu_evidence_results.tar.gz", flush=True)

    def argv_for(stage: PlannedStage) -> list[str]:
        return [sys.executable, str(REPO / "bench" / "gpu_evidence.py"), "--stages", stage.name, "--out", str(work),
                *args.kit_args]

    runs = run_plan(plan, args.budget, argv_for, work, out)
    print("\n".join(describe_runs(runs)))
    return 0 if all(r.status == "ran" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
