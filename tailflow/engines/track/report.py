"""The run report: `report.html` and its plots, drawn from what the run committed to the store.

Everything comes from the run's own files (`metrics.jsonl`, `rollout_trace.jsonl`,
`latest.json`), so `tailflow report RUN` draws the same report for a finished
run, a running one or a copy in another bucket. Pages use relative links only:
the run's folder opens from a local disk, an S3 console download or a bucket
website alike; the report's plots are inlined in it (and also written as PNGs
for the index), so a link to the page alone shows them. Commit time is not in the metrics (the row is written inside
the commit), so the step-time bars show generate, reward, train, sync and eval.
"""
from __future__ import annotations

import base64
import html
import io
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

from tailflow.engines.track.report_data import (  # noqa: E402
    STEP_PARTS, MetricColumns, read_columns, response_lengths)

REPORT = "report.html"
PLOTS_DIR = "report"


@dataclass(frozen=True)
class ReportFiles:
    """What `write_report` wrote: store keys of the page and of each plot."""
    page: str
    plots: tuple[str, ...]
    iterations: int


def plot_reward(ax, columns: MetricColumns) -> None:
    ax.plot(*columns.series("reward/mean"), label="reward/mean (train rounds)")
    ax.plot(*columns.series("reward/accuracy"), "--", label="reward/accuracy (= reward/mean for math)", alpha=0.7)
    x, y = columns.series("eval/accuracy")
    initial = columns.first("eval/accuracy_initial")
    if initial is not None:
        x, y = [-1, *x], [initial, *y]
    ax.plot(x, y, "o-", label="eval/accuracy (held out, greedy; -1 = initial)")
    ax.set(xlabel="iteration", ylabel="fraction", title="Reward and held-out accuracy")
    ax.legend(fontsize=8)


def plot_lengths(ax, lengths: dict[str, Counter[int]]) -> None:
    if not lengths:
        ax.text(0.5, 0.5, "no rollout_trace.jsonl (storage.rollout_trace: false)", ha="center", va="center")
        return
    top = max((max(counts) for counts in lengths.values() if counts), default=1)
    bins = [edge for edge in range(0, top + 20, max(1, top // 40))]
    for kind, counts in sorted(lengths.items()):
        ax.hist(list(counts), bins=bins, weights=list(counts.values()), alpha=0.55,
                label=f"{kind} rounds ({sum(counts.values())} responses)")
    ax.set_yscale("log")
    ax.set(xlabel="response length (tokens)", ylabel="responses (log scale)", title="Response lengths by round")
    ax.legend(fontsize=8)


def plot_step_times(ax, columns: MetricColumns) -> None:
    """Stacked areas, one polygon per phase: one bar per iteration and phase made the redraw grow with the run
    (2.4 s of 8.7 for 470 iterations, bench/longrun.py)."""
    ax.stackplot(list(columns.iterations), *(columns.filled(name) for name, _ in STEP_PARTS),
                 labels=[label for _, label in STEP_PARTS], step="mid")
    ax.set(xlabel="iteration", ylabel="seconds", title="Step time (commit not timed)")
    ax.legend(fontsize=8)


def plot_long_queue(ax, columns: MetricColumns) -> None:
    ax.step(*columns.series("tail/long_queue_size"), where="post", label="long-prompt queue (after the round)")
    long_rounds = [value == 1 for value in columns.values["tail/round"]]
    if any(long_rounds):  # one shaded collection, not a span per long round
        ax.fill_between(list(columns.iterations), 0, 1, where=long_rounds, step="mid", color="tab:red", alpha=0.15,
                        transform=ax.get_xaxis_transform(), label="long round")
    ax.set(xlabel="iteration", ylabel="prompts", title="Long-prompt queue")
    ax.legend(fontsize=8)


def plot_wasted(ax, columns: MetricColumns) -> None:
    ax.fill_between(*columns.series("tail/wasted_tokens"), step="mid", label="tokens of aborted responses")
    ax.set(xlabel="iteration", ylabel="tokens", title="Tokens wasted by aborts")
    ax.legend(fontsize=8)


def png(draw: Callable[[Any], None]) -> bytes:
    figure, ax = plt.subplots(figsize=(7, 3.6), dpi=100)
    try:
        draw(ax)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(figure)


def environment_facts(columns: MetricColumns) -> list[tuple[str, str]]:
    """An agentic run's lines of the page's table (rows with `env/*`); none for a single-turn run."""
    agentic = [i for i, turns in enumerate(columns.values["env/turns_mean"]) if not math.isnan(turns)]
    if not agentic:
        return []

    def values(name: str) -> list[float]:
        return [columns.values[name][i] for i in agentic]

    turns = sum(values("env/turns_mean")) / len(agentic)
    step_ms = 1000 * sum(values("time/env_step_s_mean")) / len(agentic)
    return [("turns per trajectory (mean over iterations)", f"{turns:.2f} (max {max(values('env/turns_max')):.0f})"),
            ("environment step (mean)", f"{step_ms:.1f} ms"),
            ("environment failures (failed resets and steps)", f"{sum(values('env/failures')):.0f}"),
            ("kept trajectories not trained (env/dropped)", f"{sum(values('env/dropped')):.0f}")]


def page_html(run_id: str, columns: MetricColumns, plots: list[tuple[str, bytes]]) -> str:
    """The page, its plots (title, PNG bytes) inlined: one URL shows everything, e.g. a link presigned for
    report.html alone on a private bucket (driver/links.py), where the plots' own URLs would answer 403."""
    evals = columns.series("eval/accuracy")[1]
    rounds = "".join("L" if value == 1 else "S" for value in columns.values["tail/round"])
    facts = [("iterations committed", str(len(columns))), ("rounds (S short, L long)", rounds or "-"),
             ("last held-out accuracy", f"{evals[-1]:.1%}" if evals else "-")]
    facts += environment_facts(columns)
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    images = "".join(f'<figure><img src="data:image/png;base64,{base64.b64encode(data).decode()}" '
                     f'alt="{html.escape(title)}"></figure>' for title, data in plots)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>tailflow run {html.escape(run_id)}</title>"
            "<style>body{font-family:sans-serif;margin:2em}figure{display:inline-block;margin:.5em}"
            "th{text-align:left;padding-right:1em}</style></head><body>"
            f"<h1>Run {html.escape(run_id)}</h1><table>{table}</table>"
            f"<p><a href='index.html'>all files of the run</a> · <a href='metrics.jsonl'>metrics.jsonl</a></p>"
            f"{images}</body></html>\n")


def write_report(store: Any, run_id: str) -> ReportFiles:
    """Draw the plots and `report.html` into `<run_id>/`, then refresh the run's `index.html`."""
    columns = read_columns(store, run_id)
    plots = [("reward", "Reward and held-out accuracy", lambda ax: plot_reward(ax, columns)),
             ("lengths", "Response lengths, short vs long rounds (log scale)",
              lambda ax: plot_lengths(ax, response_lengths(store, run_id))),
             ("step_times", "Step-time breakdown", lambda ax: plot_step_times(ax, columns)),
             ("long_queue", "Long-prompt queue size", lambda ax: plot_long_queue(ax, columns)),
             ("wasted_tokens", "Tokens wasted by aborts", lambda ax: plot_wasted(ax, columns))]
    keys, drawn = [], []
    for name, title, draw in plots:
        keys.append(f"{run_id}/{PLOTS_DIR}/{name}.png")
        drawn.append((title, png(draw)))
        store.write_bytes(keys[-1], drawn[-1][1])
    page = f"{run_id}/{REPORT}"
    store.write_text(page, page_html(run_id, columns, drawn))
    write_index(store, run_id)
    return ReportFiles(page, tuple(keys), len(columns))


INDEX_SECTIONS = (("Report", ("report.html",)), ("Commit pointer and config", ("latest.json", "config.yaml")),
                  ("Metrics and traces", ("metrics.jsonl", "rollout_trace.jsonl")), ("States", ("states/",)),
                  ("Checkpoints", ("checkpoints/",)))


def write_index(store: Any, run_id: str) -> str:
    """`<run_id>/index.html`: links to the run's report, states, metrics and checkpoint files."""
    files = [name for name in store.list_files(run_id) if name != "index.html"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(run_id)}</title></head><body>",
             f"<h1>Run {html.escape(run_id)}</h1>"]
    sections = [(title, [name for name in files if any(name == p or (p.endswith("/") and name.startswith(p))
                                                       for p in prefixes)]) for title, prefixes in INDEX_SECTIONS]
    listed = {name for _, chosen in sections for name in chosen}
    sections.append(("Other files", [name for name in files if name not in listed]))
    for title, chosen in sections:
        if chosen:
            parts.append(f"<h2>{title}</h2><ul>" + "".join(
                f'<li><a href="{html.escape(name)}">{html.escape(name)}</a></li>' for name in chosen) + "</ul>")
    key = f"{run_id}/index.html"
    store.write_text(key, "".join(parts) + "</body></html>\n")
    return key
