"""The cost of one code-reward answer, adversarial and honest, for two checkouts side by side (issue 26).

    python bench/reward_cost.py --before /path/to/old/checkout [--after .] [--quick]

Every answer is scored by a fresh worker process that runs the named
checkout's `CodeReward` (PYTHONPATH and cwd set to that checkout, so the test
runner it starts is that checkout's too). While it runs, this process samples
/proc every 20 ms and records the peak of the summed resident memory of
(a) the test runner and (b) the sandbox (every uid-65534 process under the
worker), and the answer's wall seconds as the worker measured them. Summed
RSS counts a page shared by forked processes once per process, so for a
sandbox of many forks it overstates what a cgroup charges; where the sandbox
has a cgroup, the peak of what it charged is shown too ("cgroup MB").

Adversarial answers, each built against one bound, run with small limits so
the old code's worst case fits on a shared machine (`reward.sandbox_memory_mb`
256, `sandbox_max_processes` 8, budget 10 s, T_max 4 s):

- fan-out: the program forks 5 children that each touch 200 MB (5, so that
  the old per-uid process limit of 8 lets them all start);
- reply flood: a test keeps 60 replies of 150,000 empty lists each (the
  program patches its side of the wire to send them without encoding work;
  this one with T 30 s and budget 40 s (`--flood-timeout`), so decoding is
  not cut short before the caps can show);
- colliding set: the program patches its side of the wire to send a set of
  35,000 ints with one hash (cheap to write, quadratic to decode);
- fence stall: 60 KB of spaces after a fence, no newline;
- hang: five stdin/stdout cases whose program never ends.

Honest answers: the built-in task's reference solutions, the same N answers
per side, in alternating rounds (the machine is shared: ratios of medians,
not absolute seconds, are what to read). The last line is
`RESULT worst_overrun_s_before=... worst_overrun_s_after=... ...`: the most an
adversarial answer ran past its budget, and the peak memories.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
from pathlib import Path

LIMITS = dict(memory_mb=256, max_processes=8, budget_s=10.0, timeout_max_s=4.0)
WORKER = r'''
import json, sys, time
from tailflow.engines.data.problem import CodeTests, IOCase, Problem
from tailflow.engines.reward.code import CodeReward
job = json.loads(sys.stdin.read())
reward = CodeReward(backend=job["backend"], **job["options"])
results = []
for item in job["items"]:
    tests = item["tests"]
    problem = Problem("p", "", "", tests=CodeTests(asserts=tuple(tests.get("asserts", ())),
        io_cases=tuple(IOCase(*case) for case in tests.get("io_cases", ())), test_module=tests.get("test_module", ""),
        test_functions=tuple(tests.get("test_functions", ()))))
    started = time.perf_counter()
    result = reward.score_problem(item["text"], problem, item.get("timeout_s"))
    results.append({"seconds": time.perf_counter() - started, "reward": result.reward})
print(json.dumps(results))
'''


def fenced(code: str) -> str:
    return f"```python\n{code}\n```\n"


WARM_UP = {"text": fenced("def add(a, b):\n    return a + b"), "tests": {"asserts": ["assert add(1, 2) == 3"]}}
"""Scored first by every worker and not counted: a worker's one-time start (imports, the sandbox view) is not
an answer's cost."""


def attacks(flood_timeout_s: float = 30.0) -> dict[str, dict]:
    collide = ("import sys\nmain = sys.modules['__main__']\nreal = main.wire_encode\n"
               "def encode(value, to_handle, depth=0):\n    if value == 'COLLIDE':\n"
               "        return {'s': [k * (2 ** 61 - 1) for k in range(1, 35000)]}\n"
               "    return real(value, to_handle, depth)\nmain.wire_encode = encode\n"
               "def ids():\n    return 'COLLIDE'\n")
    flood = ("import sys\nmain = sys.modules['__main__']\nreal = main.wire_encode\nPAYLOAD = [[]] * 150_000\n"
             "def encode(value, to_handle, depth=0):\n"
             "    return PAYLOAD if value == 'FLOOD' else real(value, to_handle, depth)\n"
             "main.wire_encode = encode\ndef blob():\n    return 'FLOOD'\n")
    fan_out = ("import os, time\nfor i in range(5):\n    if os.fork() == 0:\n        block = bytearray(200 << 20)\n"
               "        for j in range(0, len(block), 4096):\n            block[j] = 1\n        time.sleep(3)\n"
               "        os._exit(0)\nfor i in range(5):\n    os.wait()\nprint(5)\n")
    return {
        "fan-out": {"text": fenced(fan_out), "tests": {"io_cases": [["", "0\n"]]}},
        "reply flood": {"text": fenced(flood),
                        "tests": {"test_module": "from solution import blob\n\ndef test_many():\n"
                                                 "    kept = [blob() for _ in range(60)]\n    assert not kept\n",
                                  "test_functions": ["test_many"]},
                        "options": {"budget_s": flood_timeout_s + 10, "timeout_max_s": flood_timeout_s}},
        "colliding set": {"text": fenced(collide), "tests": {"asserts": ["assert len(ids()) == 0"]}},
        "fence stall": {"text": fenced("def add(a, b):\n    return None") + "```" + " " * 60_000,
                        "tests": {"asserts": ["assert add(1, 2) == 3"]}},
        "hang": {"text": fenced("while True:\n    pass"), "tests": {"io_cases": [["", "1\n"]] * 5}},
    }


def honest_items(count: int) -> list[dict]:
    from tailflow.engines.data.code_task import builtin_code_problems

    train, _ = builtin_code_problems(seed=0, num_train=count, num_eval=1)
    def tests(problem) -> dict:
        return {"asserts": list(problem.tests.asserts),
                "io_cases": [[case.stdin, case.expected_stdout] for case in problem.tests.io_cases]}
    return [{"text": fenced(problem.solution), "tests": tests(problem)} for problem in train]


class Sampler:
    """Peak summed RSS of the test runner and of the sandbox processes under one worker process."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid, self.runner_kb, self.sandbox_kb, self.cgroup_bytes = root_pid, 0, 0, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.done.wait(0.02):
            runner = sandbox = charged = 0
            for pid in descendants(self.root_pid):
                charged += cgroup_charge(pid)
                status = read(f"/proc/{pid}/status")
                rss = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")), 0)
                uid = next((line.split()[1] for line in status.splitlines() if line.startswith("Uid")), "")
                if uid == "65534":
                    sandbox += rss
                elif "reward.code.verdict" in read(f"/proc/{pid}/cmdline"):
                    runner += rss
            self.runner_kb, self.sandbox_kb = max(self.runner_kb, runner), max(self.sandbox_kb, sandbox)
            self.cgroup_bytes = max(self.cgroup_bytes, charged)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def cgroup_charge(pid: int) -> int:
    """Memory charged to the sandbox cgroups `pid` made (the new sandbox's `tailflow-sandbox-<pid>-*`)."""
    from tailflow.engines.reward.sandbox import cgroup

    found = cgroup.parents()
    if found is None or found[0] != 1:
        return 0
    usage = 0
    for directory in Path(found[1][0]).glob(f"{cgroup.PREFIX}{pid}-*"):
        text = read(str(directory / "memory.usage_in_bytes")).strip()
        usage += int(text) if text.isdigit() else 0
    return usage


def read(path: str) -> str:
    try:
        return Path(path).read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = read(f"/proc/{entry}/stat").rsplit(")", 1)
            if len(fields) == 2 and len(fields[1].split()) > 1:
                children.setdefault(int(fields[1].split()[1]), []).append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def run_worker(checkout: Path, backend: str, items: list[dict], options: dict) -> tuple[list[dict], Sampler]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    proc = subprocess.Popen([sys.executable, "-c", WORKER], cwd=checkout, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    sampler = Sampler(proc.pid)
    out, _ = proc.communicate(json.dumps({"backend": backend, "options": options, "items": items}))
    sampler.stop()
    return json.loads(out), sampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, type=Path, help="checkout of the old code (e.g. a worktree of main)")
    parser.add_argument("--after", default=Path(__file__).resolve().parents[1], type=Path)
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "process"])
    parser.add_argument("--honest", type=int, default=10, help="honest answers per side and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 honest answers, 1 round")
    parser.add_argument("--only", help="run this adversarial answer alone (no honest ones)")
    parser.add_argument("--flood-timeout", type=float, default=30.0, help="T of the reply-flood answer")
    args = parser.parse_args()
    if args.quick:
        args.honest, args.rounds = 4, 1
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    sys.path.insert(0, str(sides["after"]))

    print(f"backend {args.backend}; adversarial limits {LIMITS}")
    print(f"{'attack':<14} | {'before: s':>9} {'runner MB':>9} {'sandbox MB':>10} {'reward':>6} | "
          f"{'after: s':>8} {'runner MB':>9} {'sandbox MB':>10} {'cgroup MB':>9} {'reward':>6}")
    worst = {side: [-1e9, 0.0, 0.0] for side in sides}
    for name, item in attacks(args.flood_timeout).items():
        if args.only and name != args.only:
            continue
        row = []
        for side, checkout in sides.items():
            options = dict(LIMITS, **item.get("options", {}))
            (_, result), sampler = run_worker(checkout, args.backend, [WARM_UP, item], options)
            numbers = [result["seconds"], sampler.runner_kb / 1024, sampler.sandbox_kb / 1024]
            overrun = [numbers[0] - options["budget_s"], *numbers[1:]]
            worst[side] = [max(a, b) for a, b in zip(worst[side], overrun)]
            charged = f" {sampler.cgroup_bytes / 2 ** 20:>9.0f}" if side == "after" else ""
            row.append(f"{numbers[0]:>9.2f} {numbers[1]:>9.0f} {numbers[2]:>10.0f}{charged} {result['reward']:>6.2f}")
        print(f"{name:<14} | {row[0]} | {row[1]}")
    if args.only:
        return

    honest = honest_items(args.honest + 1)
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    peaks = {side: [0.0, 0.0] for side in sides}
    for _ in range(args.rounds):
        for side, checkout in sides.items():
            results, sampler = run_worker(checkout, args.backend, honest, {})
            assert all(r["reward"] == 1.0 for r in results), (side, results)
            seconds[side] += [r["seconds"] for r in results[1:]]  # the first pays the worker's one-time start
            peaks[side] = [max(peaks[side][0], sampler.runner_kb / 1024),
                           max(peaks[side][1], sampler.sandbox_kb / 1024)]
    median = {side: statistics.median(values) for side, values in seconds.items()}
    print(f"\nhonest answers ({len(seconds['after'])} per side, built-in task references, default limits):")
    for side in sides:
        print(f"  {side:<6} median {median[side]:.3f} s/answer (min {min(seconds[side]):.3f}), peak runner "
              f"{peaks[side][0]:.0f} MB, peak sandbox {peaks[side][1]:.0f} MB")
    ratio = median["after"] / median["before"]
    print(f"after / before honest: median {ratio:.2f}x, min {min(seconds['after']) / min(seconds['before']):.2f}x")
    print(f"VERDICT: worst adversarial answer past its budget {worst['before'][0]:+.1f} s -> "
          f"{worst['after'][0]:+.1f} s "
          f"(bound: + the runner's 10 s slack), sandbox {worst['before'][2]:.0f} MB -> "
          f"{worst['after'][2]:.0f} MB (limit {LIMITS['memory_mb']} MB), runner {worst['before'][1]:.0f} MB -> "
          f"{worst['after'][1]:.0f} MB; honest answers {ratio:.2f}x the old cost")
    print(f"RESULT worst_overrun_s_before={worst['before'][0]:.2f} worst_overrun_s_after={worst['after'][0]:.2f} "
          f"worst_sandbox_mb_before={worst['before'][2]:.0f} worst_sandbox_mb_after={worst['after'][2]:.0f} "
          f"worst_runner_mb_before={worst['before'][1]:.0f} worst_runner_mb_after={worst['after'][1]:.0f} "
          f"honest_s_before={median['before']:.3f} honest_s_after={median['after']:.3f}")


if __name__ == "__main__":
    main()
