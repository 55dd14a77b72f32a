"""A plan as a person reads it: a printed table, a markdown artifact, a heatmap PNG."""
from __future__ import annotations

import math
from pathlib import Path

from tailflow.engines.sim.plan import PlanCell, PlanResult, TpChoice

HEADER = ("prompt ratio", "responses", "rollout s/step", "step s", "speedup", "long rounds", "wasted tok/step",
          "preempt/step")


def cell_values(cell: PlanCell) -> tuple[str, ...]:
    head = (f"{cell.prompt_ratio:g}", str(cell.responses_launched))
    if cell.infeasible:
        return head + ("infeasible", "-", "-", "-", "-", "-")
    return head + (f"{cell.rollout_s:.1f}", f"{cell.step_s:.1f}", f"{cell.speedup:.2f}x", f"{cell.long_round_share:.0%}",
                   f"{cell.wasted_tokens:,.0f}", f"{cell.preemptions:.0f}")


def reasons(result: PlanResult) -> list[str]:
    """Why each infeasible setting could not run, once per reason."""
    found = dict.fromkeys(c.infeasible for c in [result.baseline, *result.cells] if c.infeasible)
    return [f"infeasible: {reason}" for reason in found]


def recommendation(result: PlanResult) -> str:
    best, r = result.recommended, result.request
    ran = [t for t in result.tp_choices if not t.infeasible]
    if best is None:
        hint = f"rollout TP {', '.join(str(t.tp) for t in ran)} can run it" if ran else "no TP up to 16 can run it"
        why = result.baseline.infeasible or "see the rows above"
        return f"recommendation: none: no setting runs at rollout TP {r.tp} ({why}); {hint}"
    if best.speedup <= 1.0:
        return "recommendation: keep tail batching off (tail.enabled: false): no setting beats the synchronous step"
    cadence = f"a long round every {1 / best.long_round_share:.1f} steps" if best.long_round_share else "no long rounds"
    tp_short = min(ran, key=lambda t: t.short_round_s).tp if ran else None
    tp_long = min(ran, key=lambda t: t.long_round_s).tp if ran else None
    return (f"recommendation: tail.prompt_ratio={best.prompt_ratio:g} tail.responses_launched={best.responses_launched} "
            f"(P0={r.prompts_per_step}, R0={r.responses_kept}): {best.speedup:.2f}x the synchronous step "
            f"({result.baseline.step_s:.1f} s -> {best.step_s:.1f} s), {cadence}; "
            f"rollout TP {tp_short} for short rounds, {tp_long} for long rounds")


def tp_line(t: TpChoice) -> str:
    if t.infeasible:
        return f"  TP {t.tp}: infeasible: {t.infeasible}"
    return (f"  TP {t.tp}: short rounds {t.short_round_s:.1f} s ({t.preemptions_short:.0f} preemptions), "
            f"long rounds {t.long_round_s:.1f} s ({t.preemptions_long:.0f} preemptions)")


def text_table(result: PlanResult) -> str:
    rows = [HEADER] + [cell_values(c) for c in result.cells]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(value.rjust(width) for value, width in zip(row, widths)) for row in rows]
    return "\n".join([f"cost model: {result.cost}", f"lengths: {result.lengths}", f"pricing: {result.pricing}",
                      *lines, *reasons(result), "rollout TP at the recommended setting:",
                      *map(tp_line, result.tp_choices), recommendation(result)])


def markdown(result: PlanResult, heatmap_name: str | None = None) -> str:
    r = result.request
    lines = [f"# Tail-batching plan: {r.model} on {r.num_gpus} x {r.hardware} (TP {r.tp})", "",
             f"Cost model: {result.cost}. Lengths: {result.lengths}. Pricing: {result.pricing}. "
             f"P0={r.prompts_per_step}, R0={r.responses_kept}, {r.grid} grid, at least {r.rounds} simulated rounds "
             "per setting (whole cycles).", "",
             "| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(cell_values(c)) + " |" for c in result.cells]
    lines += ["", *reasons(result), "", "| rollout TP | short round s | long round s | preemptions short / long |",
              "| --- | --- | --- | --- |"]
    lines += [f"| {t.tp} | infeasible: {t.infeasible} | | |" if t.infeasible else
              f"| {t.tp} | {t.short_round_s:.1f} | {t.long_round_s:.1f} | {t.preemptions_short:.0f} / "
              f"{t.preemptions_long:.0f} |" for t in result.tp_choices]
    lines += ["", f"**{recommendation(result)}**"]
    if heatmap_name:
        lines += ["", f"Heatmap: `{heatmap_name}`"]
    return "\n".join(lines) + "\n"


def write_heatmap(result: PlanResult, path: str | Path) -> Path:
    """Speedup over synchronous, prompt ratio (rows) x responses launched (columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = sorted({c.prompt_ratio for c in result.cells})
    responses = sorted({c.responses_launched for c in result.cells})
    by_key = {(c.prompt_ratio, c.responses_launched): c.speedup for c in result.cells}
    grid = [[by_key.get((p, n), float("nan")) for n in responses] for p in ratios]
    figure, axes = plt.subplots(figsize=(1.2 + 0.9 * len(responses), 1.0 + 0.6 * len(ratios)))
    image = axes.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    axes.set_xticks(range(len(responses)), [str(n) for n in responses])
    axes.set_yticks(range(len(ratios)), [f"{p:g}" for p in ratios])
    axes.set_xlabel("responses launched per prompt")
    axes.set_ylabel("prompt ratio")
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            axes.text(j, i, "n/a" if math.isnan(value) else f"{value:.2f}", ha="center", va="center", color="white",
                      fontsize=8)
    r = result.request
    axes.set_title(f"simulated step speedup: {r.model}, {r.num_gpus} x {r.hardware}", fontsize=9)
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write_plan(result: PlanResult, out_dir: str | Path) -> tuple[Path, Path]:
    """`<out_dir>/plan.md` and `<out_dir>/plan_heatmap.png`."""
    out = Path(out_dir)
    heatmap = write_heatmap(result, out / "plan_heatmap.png")
    page = out / "plan.md"
    page.write_text(markdown(result, heatmap.name))
    return page, heatmap
