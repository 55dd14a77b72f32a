"""Do two commits train the same? Seeded runs of each, compared weight for weight and metric for metric.

    python scripts/compare_commits.py BEFORE AFTER [--iterations 4] [--out DIR] [--only NAME ...]

Why: a refactor that claims "no behaviour change" (issue 24) is checked by running the code before and after it,
not by reading the diff. Each commit is checked out into its own git worktree and run from there (PYTHONPATH
points at it, so the driver and its Ray workers import that commit's tailflow), one run per setting below, all
on one rollout worker, seeded, from the shipped warm start, one after the other. Then for each setting:

- the committed weights' sha256 after the last iteration (states/iter-NNNN.json, `weights_sha256`);
- every metrics.jsonl row, key by key, leaving out `time/*` (wall-clock) and listing keys only one side has;
- whether each run wrote rollout_trace.jsonl.

It prints one block per setting and a last line `SAME n/4` (settings whose weights and shared metrics are equal).
A run is small (prompts_per_step 8, 30 held-out problems) so that eight runs take minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMALL = ["data.prompts_per_step=8", "data.num_eval=30", "train.eval_every=2", "tracking.report_every=1000"]
SETTINGS = {
    "sync-tail": ["rollout.async_ratio=0", "tail.enabled=true"],
    "sync-no-tail": ["rollout.async_ratio=0", "tail.enabled=false"],
    "default-async": [],
    "streamed": ["rollout.async_ratio=0", "train.stream=true"],
}


def checkout(commit: str, folder: Path) -> Path:
    source = folder / f"src-{commit[:10]}"
    if not source.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--force", str(source), commit],
                       check=True, capture_output=True)
    return source


def train(source: Path, storage: Path, name: str, overrides: list[str], iterations: int) -> Path:
    run_dir = storage / name
    if (run_dir / "latest.json").exists():
        return run_dir  # ran before into this --out
    sets = [f"storage.uri={storage}", f"train.iterations={iterations}", *SMALL, *overrides]
    command = [sys.executable, "-c", "import sys; from tailflow.cli import main; sys.exit(main(sys.argv[1:]))",
               "train", "-c", "configs/default.yaml", "--run-id", name]
    for item in sets:
        command += ["--set", item]
    env = {**os.environ, "PYTHONPATH": str(source), "RAY_ADDRESS": "local"}
    storage.mkdir(parents=True, exist_ok=True)
    log = storage / f"{name}.log"
    with log.open("w") as out:
        done = subprocess.run(command, cwd=source, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"{source.name} {name}: exit {done.returncode}, see {log}")
    return run_dir


def final_sha256(run_dir: Path) -> str:
    state = max((run_dir / "states").glob("iter-*.json"))
    return json.loads(state.read_text())["weights_sha256"]


def metric_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{key: value for key, value in row.items() if not key.startswith("time/")} for row in rows]


def compare(name: str, before: Path, after: Path) -> bool:
    sha_before, sha_after = final_sha256(before), final_sha256(after)
    rows_before, rows_after = metric_rows(before), metric_rows(after)
    print(f"\n== {name}")
    print(f"weights sha256: {'equal' if sha_before == sha_after else 'DIFFER'} ({sha_before[:16]} / {sha_after[:16]})")
    print(f"metrics rows: {len(rows_before)} / {len(rows_after)}")
    unequal = []
    for index, (one, other) in enumerate(zip(rows_before, rows_after)):
        only_before, only_after = sorted(one.keys() - other.keys()), sorted(other.keys() - one.keys())
        if only_before or only_after:
            print(f"  row {index}: keys only before {only_before}, only after {only_after}")
        unequal += [(index, key, one[key], other[key]) for key in sorted(one.keys() & other.keys())
                    if one[key] != other[key]]
    for index, key, value_before, value_after in unequal:
        print(f"  row {index} {key}: {value_before!r} != {value_after!r}")
    print(f"shared metric values unequal: {len(unequal)}")
    for label, run_dir in (("before", before), ("after", after)):
        print(f"rollout_trace.jsonl {label}: {'yes' if (run_dir / 'rollout_trace.jsonl').exists() else 'no'}")
    return sha_before == sha_after and not unequal and len(rows_before) == len(rows_after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--out", help="folder for worktrees and runs (default: a temporary one, removed)")
    parser.add_argument("--only", nargs="*", choices=sorted(SETTINGS), help="some settings only")
    args = parser.parse_args()
    commits = [subprocess.run(["git", "-C", str(REPO), "rev-parse", ref], check=True, capture_output=True,
                              text=True).stdout.strip() for ref in (args.before, args.after)]
    names = args.only or list(SETTINGS)
    with tempfile.TemporaryDirectory(prefix="compare-commits-") as scratch:
        folder = Path(args.out or scratch).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        runs = {}
        for commit in commits:
            source = checkout(commit, folder)
            for name in names:
                print(f"training {name} at {commit[:10]}", flush=True)
                runs[commit, name] = train(source, folder / f"runs-{commit[:10]}", name, SETTINGS[name],
                                           args.iterations)
        same = sum(compare(name, runs[commits[0], name], runs[commits[1], name]) for name in names)
        for commit in commits:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(folder / f"src-{commit[:10]}")], capture_output=True)
    print(f"\nSAME {same}/{len(names)} ({commits[0][:10]} -> {commits[1][:10]}, {args.iterations} iterations)")


if __name__ == "__main__":
    main()
