"""The GPU session planner (`bench/gpu_plan.py`): the plan covers every stage of the kit in priority order and
its first call fits a call's budget; the runner times out a hung stage (keeping what it printed), passes over a
stage that does not fit for a later one that does, and tars everything. No kit runs: short Python one-liners
stand in for the stages, so this costs a few seconds (one stub sleeps into its 2 s timeout)."""
from __future__ import annotations

import ast
import sys
import tarfile
from pathlib import Path

import bench_path  # noqa: F401  (bench/gpu_plan.py is not part of the package)

REPO = Path(__file__).resolve().parents[1]


def kit_stages() -> tuple[str, ...]:
    """gpu_evidence.STAGES, read from its source (importing the kit would put bench/ first on sys.path)."""
    tree = ast.parse((REPO / "bench" / "gpu_evidence.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "STAGES")
    return ast.literal_eval(node.value)


def test_the_plan_covers_every_stage_and_its_first_call_fits(capsys):
    import gpu_plan

    assert sorted(s.name for s in gpu_plan.PLAN) == sorted(kit_stages())
    assert gpu_plan.main(["--dry-run"]) == 0
    printed = capsys.readouterr().out
    first_call = next(line for line in printed.splitlines() if line.startswith("call 1:"))
    assert all(f"  {s.name} " in printed for s in gpu_plan.PLAN)  # every stage with its expected seconds
    fits, _ = gpu_plan.schedule(gpu_plan.PLAN, gpu_plan.CALL_LIMIT_S - gpu_plan.CALL_MARGIN_S)
    assert first_call.split("--stages ")[1].split()[0].split(",") == [s.name for s in fits]
    assert fits[0] == gpu_plan.PLAN[0]  # the first priority always runs in the first call
    assert sum(s.cost_s for s in fits) <= gpu_plan.CALL_LIMIT_S - gpu_plan.CALL_MARGIN_S


def test_the_planner_times_out_a_stage_skips_what_does_not_fit_and_tars_everything(tmp_path, monkeypatch):
    import gpu_plan

    monkeypatch.setattr(gpu_plan, "PROCESS_START_S", 0)
    monkeypatch.setattr(gpu_plan, "GRACE_S", 1)
    plan = [gpu_plan.PlannedStage("quick", 0.5, "stub", "first"),
            gpu_plan.PlannedStage("hangs", 0.5, "stub", "second"),
            gpu_plan.PlannedStage("huge", 1000, "stub", "too big for the budget"),
            gpu_plan.PlannedStage("late", 0.5, "stub", "fits after the huge one is passed over")]
    scripts = {"quick": "print('[quick] 0.1 s')", "hangs": "import time; print('started', flush=True); time.sleep(60)",
               "late": "print('[late] 0.1 s')"}
    monkeypatch.setattr(gpu_plan.PlannedStage, "timeout_s", property(lambda stage: 2))
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(), out.mkdir()
    runs = gpu_plan.run_plan(plan, 30, lambda stage: [sys.executable, "-c", scripts[stage.name]], work, out)
    assert [(r.name, r.status) for r in runs] == [("quick", "ran"), ("hangs", "timed out"), ("huge", "did not fit"),
                                                 ("late", "ran")]
    assert runs[1].seconds < 2 + gpu_plan.GRACE_S + 5
    with tarfile.open(out / "gpu_evidence_results.tar.gz") as tar:
        names = set(tar.getnames())
        log = tar.extractfile("gpu_evidence_hangs.log").read().decode()
    assert names == {"gpu_evidence_quick.log", "gpu_evidence_hangs.log", "gpu_evidence_late.log",
                     "gpu_plan_summary.json"}
    assert "started" in log  # what a stage printed before its timeout is kept
    assert "next call: --stages hangs,huge" in "\n".join(gpu_plan.describe_runs(runs))
