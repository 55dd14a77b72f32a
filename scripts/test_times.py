"""Print the slowest tests of a run from the rows tests/conftest.py appends (TAILFLOW_TEST_TIMES=<file>).

    python scripts/test_times.py FILE [--top 30]

Each row: the test's wall seconds, the CPU seconds of its own process tree (a ratio near 0 waits, near 1 or
above computes) and how busy the whole machine was meanwhile (two pytest workers share it)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    if not args.file.exists():
        print(f"test times: {args.file} does not exist (no test ran)")
        return
    rows = [json.loads(line) for line in args.file.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda row: row["wall_s"], reverse=True)
    print(f"test times: {len(rows)} tests, {sum(row['wall_s'] for row in rows) / 60:.1f} test-minutes of wall time "
          f"(summed over workers), {sum(row['tree_cpu_s'] for row in rows) / 60:.1f} CPU-minutes in the tests' own "
          f"process trees; the {min(args.top, len(rows))} slowest:")
    print(f"{'wall s':>8} {'cpu s':>8} {'cpu/wall':>8} {'machine':>8}  test")
    for row in rows[:args.top]:
        print(f"{row['wall_s']:8.1f} {row['tree_cpu_s']:8.1f} {row['tree_cpu_s'] / max(row['wall_s'], 0.1):8.2f} "
              f"{row['machine_busy_share']:8.0%}  {row['nodeid']}")


if __name__ == "__main__":
    main()
