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
import json
from dataclasses import dataclass
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

from tailflow.engines.runs.commit import read_latest  # noqa: E402
from tailflow.engines.runs.layout import rollout_trace_key  # noqa: E402
from tailflow.engines.track.metrics import MetricsLogger  # noqa: E402

REPORT = "report.html"
PLOTS_DIR = "report"
STEP_PARTS = (("time/step_generate", "generate"), ("time/step_reward", "reward"), ("time/step_train", "train"),
              ("time/step_model_update", "sync"), ("time/eval", "eval"))


@dataclass(frozen=True)
class ReportFiles:
    """What `write_report` wrote: store keys of the page and of each plot."""
    page: str
    plots: tuple[str, ...]
    iterations: int


def read_rows(store: Any, run_id: str) -> list[dict[str, Any]]:
    rows = MetricsLogger(store, run_id).rows()
    latest = read_latest(store, run_id)
    committed = latest.iteration if latest else 0
    return [row for row in rows if row["iteration"] < committed]  # rows past the commit may be run again


def response_lengths(store: Any, run_id: str) -> dict[str, list[int]]:
    """Lengths of responses that ended by themselves, by round kind (short, long, sync), from the trace (a
    trajectory's: its model tokens, as `token/response_length/*` counts them)."""
    key = rollout_trace_key(run_id)
    lengths: dict[str, list[int]] = {}
    if not store.exists(key):
        return lengths
    for line in store.read_text(key).splitlines():
        if line.strip():
            round_ = json.loads(line)
            lengths.setdefault(round_["round"], []).extend(
                model_length(response) for prompt in round_["prompts"] for response in prompt["responses"]
                if response["finish"] != "abort")
    return lengths


def model_length(response: dict[str, Any]) -> int:
    """A traced response's tokens the model sampled: its length, or a trajectory's turns' model tokens."""
    if "turns" in response:
        return sum(turn["model_tokens"] for turn in response["turns"])
    return response["length"]


def series(rows: list[dict[str, Any]], name: str) -> tuple[list[int], list[float]]:
    points = [(row["iteration"], row[name]) for row in rows if row.get(name) is not None]
    return [x for x, _ in points], [y for _, y in points]


def plot_reward(ax, rows: list[dict[str, Any]]) -> None:
    ax.plot(*series(rows, "reward/mean"), label="reward/mean (train rounds)")
    ax.plot(*series(rows, "reward/accuracy"), "--", label="reward/accuracy (= reward/mean for math)", alpha=0.7)
    x, y = series(rows, "eval/accuracy")
    initial = next((row["eval/accuracy_initial"] for row in rows if row.get("eval/accuracy_initial") is not None), None)
    if initial is not None:
        x, y = [-1, *x], [initial, *y]
    ax.plot(x, y, "o-", label="eval/accuracy (held out, greedy; -1 = initial)")
    ax.set(xlabel="iteration", ylabel="fraction", title="Reward and held-out accuracy")
    ax.legend(fontsize=8)


def plot_lengths(ax, lengths: dict[str, list[int]]) -> None:
    if not lengths:
        ax.text(0.5, 0.5, "no rollout_trace.jsonl (storage.rollout_trace: false)", ha="center", va="center")
        return
    top = max(max(values) for values in lengths.values() if values) if any(lengths.values()) else 1
    bins = [edge for edge in range(0, top + 20, max(1, top // 40))]
    for kind, values in sorted(lengths.items()):
        ax.hist(values, bins=bins, alpha=0.55, label=f"{kind} rounds ({len(values)} responses)")
    ax.set_yscale("log")
    ax.set(xlabel="response length (tokens)", ylabel="responses (log scale)", title="Response lengths by round")
    ax.legend(fontsize=8)


def plot_step_times(ax, rows: list[dict[str, Any]]) -> None:
    """Stacked areas, one polygon per phase: one bar per iteration and phase made the redraw grow with the run
    (2.4 s of 8.7 for 470 iterations, bench/longrun.py)."""
    iterations = [row["iteration"] for row in rows]
    parts = [[row.get(name) or 0.0 for row in rows] for name, _ in STEP_PARTS]
    ax.stackplot(iterations, *parts, labels=[label for _, label in STEP_PARTS], step="mid")
    ax.set(xlabel="iteration", ylabel="seconds", title="Step time (commit not timed)")
    ax.legend(fontsize=8)


def plot_long_queue(ax, rows: list[dict[str, Any]]) -> None:
    ax.step(*series(rows, "tail/long_queue_size"), where="post", label="long-prompt queue (after the round)")
    if any(row.get("tail/round") == 1 for row in rows):  # one shaded collection, not a span per long round
        ax.fill_between([row["iteration"] for row in rows], 0, 1, where=[row.get("tail/round") == 1 for row in rows],
                        step="mid", color="tab:red", alpha=0.15, transform=ax.get_xaxis_transform(),
                        label="long round")
    ax.set(xlabel="iteration", ylabel="prompts", title="Long-prompt queue")
    ax.legend(fontsize=8)


def plot_wasted(ax, rows: list[dict[str, Any]]) -> None:
    ax.fill_between(*series(rows, "tail/wasted_tokens"), step="mid", label="tokens of aborted responses")
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


def environment_facts(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """An agentic run's lines of the page's table (rows with `env/*`); none for a single-turn run."""
    rows = [row for row in rows if row.get("env/turns_mean") is not None]
    if not rows:
        return []
    turns = sum(row["env/turns_mean"] for row in rows) / len(rows)
    step_ms = 1000 * sum(row["time/env_step_s_mean"] for row in rows) / len(rows)
    return [("turns per trajectory (mean over iterations)", f"{turns:.2f} (max {max(r['env/turns_max'] for r in rows)})"),
            ("environment step (mean)", f"{step_ms:.1f} ms"),
            ("environment failures (failed resets and steps)", str(sum(row["env/failures"] for row in rows))),
            ("kept trajectories not trained (env/dropped)", str(sum(row["env/dropped"] for row in rows)))]


def page_html(run_id: str, rows: list[dict[str, Any]], plots: list[tuple[str, bytes]]) -> str:
    """The page, its plots (title, PNG bytes) inlined: one URL shows everything, e.g. a link presigned for
    report.html alone on a private bucket (driver/links.py), where the plots' own URLs would answer 403."""
    evals = series(rows, "eval/accuracy")[1]
    rounds = "".join("L" if row.get("tail/round") == 1 else "S" for row in rows)
    facts = [("iterations committed", str(len(rows))), ("rounds (S short, L long)", rounds or "-"),
             ("last held-out accuracy", f"{evals[-1]:.1%}" if evals else "-")]
    facts += environment_facts(rows)
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
    rows = read_rows(store, run_id)
    plots = [("reward", "Reward and held-out accuracy", lambda ax: plot_reward(ax, rows)),
             ("lengths", "Response lengths, short vs long rounds (log scale)",
              lambda ax: plot_lengths(ax, response_lengths(store, run_id))),
             ("step_times", "Step-time breakdown", lambda ax: plot_step_times(ax, rows)),
             ("long_queue", "Long-prompt queue size", lambda ax: plot_long_queue(ax, rows)),
             ("wasted_tokens", "Tokens wasted by aborts", lambda ax: plot_wasted(ax, rows))]
    keys, drawn = [], []
    for name, title, draw in plots:
        keys.append(f"{run_id}/{PLOTS_DIR}/{name}.png")
        drawn.append((title, png(draw)))
        store.write_bytes(keys[-1], drawn[-1][1])
    page = f"{run_id}/{REPORT}"
    store.write_text(page, page_html(run_id, rows, drawn))
    write_index(store, run_id)
    return ReportFiles(page, tuple(keys), len(rows))


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
