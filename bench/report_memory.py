"""What redrawing the run report costs a long-lived process in memory, as a run's files grow (issue 42).

    python bench/report_memory.py [--rows 2000] [--every 100]

The run's driver redraws the report every `tracking.report_every` iterations for as long as the run lasts. Each
alternative runs in a fresh interpreter of its own (RSS is the process's, so two in one process would share a
heap), one after the other, on the same files: `--rows` rows of metrics.jsonl and rollout_trace.jsonl, written
`--every` rows at a time (100 real rows of a micro run, bench/longrun.py's configuration, repeated with their
iteration renumbered); after each write the process draws the whole report (`write_report`, local store) and
records its RSS.

    whole               what the report did before: metrics.jsonl and rollout_trace.jsonl read whole, every row kept as
                        a dict and every traced length in a list, then drawn (the same plots)
    streamed            tailflow's report (`write_report`): both files streamed a line at a time into the drawn
                        columns (engines/track/report_data.py)
    whole_collected     `whole`, then a full garbage collection, as the run's driver does after every
                        iteration (driver/garbage.py): the closed figures are freed through their reference cycles
    streamed_collected  `streamed`, then the same collection: what the driver does now

Slopes are least squares per 100 rows from row 200 on (the first redraws load matplotlib and its fonts).
Last line: RESULT rows=<n> whole_mb_per_100=<slope> streamed_mb_per_100=<slope>
           whole_collected_mb_per_100=<slope> streamed_collected_mb_per_100=<slope>
"""
from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARM_ROWS = 200
ALTERNATIVES = ("whole", "streamed", "whole_collected", "streamed_collected")


def rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def micro_rows(work: Path) -> tuple[list[dict], list[dict]]:
    """100 iterations of bench/longrun.py's micro configuration: its metrics and trace rows."""
    sys.path.insert(0, str(REPO / "bench"))
    import yaml
    from longrun import micro_config

    config = work / "micro.yaml"
    config.write_text(yaml.safe_dump(micro_config(100, str(work / "micro-store"))))
    subprocess.run([sys.executable, "-m", "tailflow.cli", "train", "-c", str(config), "--run-id", "micro"],
                   cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    run = work / "micro-store" / "micro"
    return ([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()],
            [json.loads(line) for line in (run / "rollout_trace.jsonl").read_text().splitlines()])


def draw_whole(store, run_id: str) -> None:
    """The report as drawn before report_data.py: every row whole, every length in a list."""
    from tailflow.engines.track import report
    from tailflow.engines.track.metrics import MetricsLogger
    from tailflow.engines.track.report_data import MetricColumns, model_length

    rows = MetricsLogger(store, run_id).rows()
    lengths: dict[str, list[int]] = {}
    for line in store.read_text(f"{run_id}/rollout_trace.jsonl").splitlines():
        round_ = json.loads(line)
        lengths.setdefault(round_["round"], []).extend(
            model_length(response) for prompt in round_["prompts"] for response in prompt["responses"]
            if response["finish"] != "abort")
    columns = MetricColumns.of_rows(rows)
    counted = {kind: Counter(values) for kind, values in lengths.items()}
    for draw in (lambda ax: report.plot_reward(ax, columns), lambda ax: report.plot_lengths(ax, counted),
                 lambda ax: report.plot_step_times(ax, columns), lambda ax: report.plot_long_queue(ax, columns),
                 lambda ax: report.plot_wasted(ax, columns)):
        report.png(draw)
    report.page_html(run_id, columns, [])


def one_alternative(name: str, rows_file: Path, total: int, every: int, root: Path) -> list[tuple[int, float]]:
    """In this (fresh) process: grow the run's files and redraw after each `every` rows; (rows, RSS MB)."""
    from tailflow.engines.store import open_store
    from tailflow.engines.track.report import write_report

    metrics, trace = json.loads(rows_file.read_text())
    (root / "r").mkdir(parents=True)
    store = open_store(str(root))
    points = []
    with open(root / "r/metrics.jsonl", "w") as metrics_file, open(root / "r/rollout_trace.jsonl", "w") as trace_file:
        for i in range(total):
            metrics_file.write(json.dumps(metrics[i % len(metrics)] | {"iteration": i}, sort_keys=True) + "\n")
            trace_file.write(json.dumps(trace[i % len(trace)] | {"iteration": i}) + "\n")
            if (i + 1) % every:
                continue
            metrics_file.flush()
            trace_file.flush()
            pointer = {"iteration": i + 1, "state": "r/states/s.json", "checkpoint": None}
            (root / "r/latest.json").write_text(json.dumps(pointer))
            if name.startswith("whole"):
                draw_whole(store, "r")
            else:
                write_report(store, "r")
            if name.endswith("collected"):
                gc.collect()
            points.append((i + 1, rss_mb()))
    return points


def slope_per_100(points: list[tuple[int, float]]) -> float:
    xs, ys = zip(*points)
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return 100 * sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # name rows_file: one alternative, JSON out
    args = parser.parse_args()
    if args.child:
        name, rows_file = args.child
        print(json.dumps(one_alternative(name, Path(rows_file), args.rows, args.every,
                                         Path(tempfile.mkdtemp()) / "store")))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows_file = work / "rows.json"
        rows_file.write_text(json.dumps(micro_rows(work)))
        results = {}
        for name in ALTERNATIVES:
            out = subprocess.run([sys.executable, __file__, "--rows", str(args.rows), "--every", str(args.every),
                                  "--child", name, str(rows_file)], check=True, capture_output=True, text=True)
            results[name] = [tuple(point) for point in json.loads(out.stdout.splitlines()[-1])]
    print(f"{'rows':>6} " + " ".join(f"{name:>18}" for name in results) + "   (RSS MB after the redraw)")
    for i, (rows, _) in enumerate(results["whole"]):
        print(f"{rows:6d} " + " ".join(f"{points[i][1]:18.1f}" for points in results.values()))
    slopes = {name: slope_per_100([p for p in points if p[0] >= WARM_ROWS]) for name, points in results.items()}
    for name, points in results.items():
        print(f"{name:>18}: RSS {points[0][1]:.1f} -> {points[-1][1]:.1f} MB, slope {slopes[name]:+.2f} MB per 100 "
              f"rows from row {WARM_ROWS}")
    now = slopes["streamed_collected"]
    ratio = slopes["whole"] / now if now > 0 else float("inf")
    verdict = "the driver's redraw stays within" if now <= 1 else "the driver's redraw still exceeds"
    print(f"verdict: {verdict} 1 MB per 100 rows; whole / streamed_collected slope = {ratio:.1f}")
    print(f"RESULT rows={args.rows} " + " ".join(f"{name}_mb_per_100={slopes[name]:.2f}" for name in ALTERNATIVES))

if __name__ == "__main__":
    main()
