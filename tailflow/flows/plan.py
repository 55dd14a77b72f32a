"""`plan`: which tail-batching settings to use on a GPU cluster, predicted by the simulator from a trace.

The same search as `tailflow plan`, as a Prefect flow (deployment `plan` in
deployments/prefect.yaml): the table and recommendation become a markdown
artifact, the heatmap a file under `out_dir`.
"""
from __future__ import annotations

from prefect import flow

from tailflow.engines.sim.plan import PlanRequest, smallest_tp
from tailflow.engines.sim.sources import LengthSpec, load_lengths, longest_request, policy_sizes
from tailflow.tasks.simulate import PlanSummary, publish_plan, search_settings


@flow(name="plan", log_prints=True, persist_result=False)
def plan_tail_batching(gpus: int, hardware: str, model: str, tp: int | None = None, run_id: str | None = None,
                       trace_path: str | None = None, rollpacker_path: str | None = None,
                       paper_prompts: int | None = None, max_new_tokens: int | None = None,
                       storage_uri: str = "runs", prompts_per_step: int | None = None,
                       responses_kept: int | None = None, grid: str = "paper", rounds: int = 10,
                       out_dir: str = "plan", seed: int = 0, measured_path: str | None = None,
                       pricing: str = "shares", jobs: int | None = None) -> PlanSummary:
    """Lengths from exactly one of: a run (`run_id` in `storage_uri`), a trace file, RollPacker's length log, or
    the paper-like generator (`paper_prompts` prompts, `max_new_tokens` cap). P0 and R0 default to the run's.
    `pricing`: how reward and train are priced (shares, roofline, measured), printed with the result."""
    spec = LengthSpec(run_id, storage_uri, trace_path, rollpacker_path, paper_prompts, max_new_tokens, seed)
    p0, r0 = policy_sizes(spec, prompts_per_step, responses_kept)
    tp = tp or smallest_tp(hardware, model, gpus, longest_request(load_lengths(spec)[0]))
    request = PlanRequest(gpus, hardware, model, tp, p0, r0, grid, rounds, seed=seed, pricing=pricing,
                          measured_path=measured_path, jobs=jobs)
    result = search_settings(request, spec)
    summary = publish_plan(result, out_dir)
    print(summary.table)
    return summary
