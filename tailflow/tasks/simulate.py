"""Plan tail batching on the simulator: search the settings, publish the table, heatmap and recommendation."""
from __future__ import annotations

from dataclasses import dataclass

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from tailflow.engines.sim.plan import PlanRequest, PlanResult, plan
from tailflow.engines.sim.plan_pages import markdown, recommendation, text_table, write_plan
from tailflow.engines.sim.sources import LengthSpec, load_lengths


@dataclass(frozen=True)
class PlanSummary:
    recommendation: str
    table: str
    markdown_path: str
    heatmap_path: str


@task(cache_policy=NO_CACHE, persist_result=False)
def search_settings(request: PlanRequest, spec: LengthSpec) -> PlanResult:
    """Every setting of the grid on the simulator (pure computation on plain inputs: safe to retry)."""
    lengths, description = load_lengths(spec)
    return plan(request, lengths, description, progress=print)


@task(cache_policy=NO_CACHE, persist_result=False)
def publish_plan(result: PlanResult, out_dir: str) -> PlanSummary:
    page, heatmap = write_plan(result, out_dir)
    create_markdown_artifact(key="tail-batching-plan", markdown=markdown(result, str(heatmap)),
                             description=recommendation(result))
    return PlanSummary(recommendation(result), text_table(result), str(page), str(heatmap))
