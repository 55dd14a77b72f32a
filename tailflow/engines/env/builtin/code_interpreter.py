"""A code interpreter: the model runs Python in the reward's sandbox, reads the output, and answers.

    first observation  the question, then the tool protocol
    model turn         ```python
                       print(sum(int(d) for d in str(7 ** 300)))
                       ```
    observation        "[ok]\\n1158\\n"             (the run's stdout, then stderr, cut at `max_output_bytes`)
    model turn         "ANSWER: 1158"              (ends the task: reward 1.0 if it is the gold integer, else 0.0)

The task comes from the seed alone: one of a few families of questions whose answer is one integer that wants
computation (the n-th prime, primes below n, the digit sum of a power, Collatz steps, a Fibonacci number mod m, a
sum of powers mod m), with constants drawn from `random.Random(f"code-interpreter:{seed}")`, so a GRPO group
shares its problem. Each family is written once, as the program that answers it (`Question.solution`); the gold is
that program run here, on the trusted side, at reset (a few ms). Why these and not the code task's problems: the
answer is one integer, out of reach of mental arithmetic, so the tool is what gets the reward, and it is checked
by the math reward's rule as it stands for an integer: the last line after the marker, `$...$` / `\\boxed{}`
unwrapped (`answer_list.unwrapped`), a literal integer (`is_literal_answer`'s rule: `ANSWER: 7**300` scores 0, the
model has to compute) equal to the gold, which is what math-verify concludes for two integers. It runs in-process,
not through `MathReward`: that starts a math-verify child per instance, here one per trajectory (measured ~1 s and
~60 MB each on this machine) to compare two integers. A code problem's answer is a program, checked by a test
runner and a second sandbox: a different environment.

Turns (`step`):
- the last non-empty line starts with `ANSWER:`: the final answer; checked, and the task is over (done), any code
  in the turn is not run;
- else a fenced block tagged python (or untagged; the last one, as the code reward extracts it) is one tool call:
  a fresh `run_python` of that block, on `backend`, under `SandboxLimits` built from the settings;
- anything else raises `InvalidAction`.

What holds for every tool call is what holds for the code reward's programs (docs/rewards.md, "The sandbox" and
"Tool calls"): a new sandbox per call (a fresh process tree, scratch dir, pid/net/ipc/mount namespaces and cgroup:
nothing of one call reaches the next, in memory, on disk or in SysV IPC), the allowlisted root (nothing of the
host's files), uid 65534, and the limits: wall clock `timeout_s`, CPU `cpu_time_s`, memory `memory_mb` (for the
whole sandbox), `max_processes`, file size; each stream is read up to a bound and the run is killed past
it (`MIN_READ_BYTES`, 64 KiB, or `max_output_bytes` if larger), so a call costs at most `timeout_s` (plus the
kill) and that much of this process's memory per stream.
An episode runs at most `max_tool_calls` calls; later code turns are answered without running anything. The
observation is at most `max_output_bytes` of output plus one status line and one cut line.

The sandbox dies with this process (`die_with_parent`: steps run in the environment process's one thread): the
host kills an environment whose step outlives `env.step_timeout_s`, or that is busy at close, and its tool call
must not run on without a supervisor.

A backend that would run the code without namespaces (`process` without root: rlimits only, the host's files
readable as this user) is refused unless `allow_unisolated` is set: a tool call's output goes back to the model,
so what the sandbox can read, the policy reads.

Keep `env.step_timeout_s` above `timeout_s` plus the sandbox's start (a second or so): a tool call that runs to its
timeout is the model's cost, an observation, and must not be taken for a hung environment.
"""
from __future__ import annotations

import contextlib
import io
import math
import random
import re
from dataclasses import dataclass

from tailflow.engines.env.environment import EnvStep, Environment, InvalidAction
from tailflow.engines.reward.answer_list import unwrapped
from tailflow.engines.reward.code.extract import PYTHON_TAGS, fenced_blocks
from tailflow.engines.reward.sandbox import SandboxLimits, SandboxResult, resolve_backend, run_python

ANSWER_MARKER = "ANSWER:"
NO_CALLS_LEFT = "[no tool calls left: write ANSWER: <integer>]\n"
INTEGER = re.compile(r"-?\d{1,256}")
"""A literal integer answer; 256 digits bound the comparison (int() of a longer string is refused by Python)."""
MIN_READ_BYTES = 64 << 10
"""Each stream is read up to max(this, `max_output_bytes`), and the run killed past it: the observation is cut
here, on this side, so a program with a long traceback still reads as its exit code, not as killed for output."""
LAUNCHER_FRAMES = re.compile(r'(Traceback \(most recent call last\):\n)(?:  File "<string>", line \d+, in [<>\w]+\n)+'
                             r'(?=  File ")')
"""The sandbox launcher's own frames at the top of a traceback (`sandbox/inner.py`, run as source): noise to the
model, and observation tokens are scarce."""


@dataclass(frozen=True)
class Question:
    question: str
    solution: str
    """A program that prints the answer: the gold is its output, run here (trusted code, ours)."""
    family: str


def _nth_prime(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(1000, 5000)
    return (f"What is the {n}-th prime number (the 1st is 2)?", "import math\n" +
            f"n = {n}\nlimit = int(n * (math.log(n) + math.log(math.log(n)))) + 10\nsieve = bytearray([1]) * limit\n"
            "sieve[:2] = b'\\0\\0'\nfor i in range(2, int(limit ** 0.5) + 1):\n    if sieve[i]:\n"
            "        sieve[i * i::i] = bytearray(len(range(i * i, limit, i)))\n"
            "print([k for k in range(limit) if sieve[k]][n - 1])\n")


def _primes_below(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(10_000, 200_000)
    return (f"How many prime numbers are there below {n}?",
            f"n = {n}\nsieve = bytearray([1]) * n\nsieve[:2] = b'\\0\\0'\nfor i in range(2, int(n ** 0.5) + 1):\n"
            "    if sieve[i]:\n        sieve[i * i::i] = bytearray(len(range(i * i, n, i)))\nprint(sum(sieve))\n")


def _digit_sum_of_power(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(2, 9), rng.randint(100, 400)
    return (f"What is the sum of the decimal digits of {a}^{b}?", f"print(sum(int(d) for d in str({a} ** {b})))\n")


def _collatz_steps(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(100_000, 999_999)
    return (f"Starting from {n} and repeatedly replacing n by n/2 when n is even and by 3n+1 when n is odd, how many "
            "steps does it take to reach 1?",
            f"n, steps = {n}, 0\nwhile n != 1:\n    n = n // 2 if n % 2 == 0 else 3 * n + 1\n    steps += 1\n"
            "print(steps)\n")


def _fibonacci_mod(rng: random.Random) -> tuple[str, str]:
    n, m = rng.randint(1000, 5000), rng.randint(1000, 9999)
    return (f"With F(0) = 0, F(1) = 1 and F(k) = F(k-1) + F(k-2), what is F({n}) mod {m}?",
            f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, a + b\nprint(a % {m})\n")


def _power_sum_mod(rng: random.Random) -> tuple[str, str]:
    k, n, m = rng.randint(3, 7), rng.randint(10_000, 100_000), rng.choice([997, 1009, 7919, 65537, 1_000_003])
    return (f"What is (1^{k} + 2^{k} + ... + {n}^{k}) mod {m}?",
            f"print(sum(pow(i, {k}, {m}) for i in range(1, {n} + 1)) % {m})\n")


FAMILIES = {"nth_prime": _nth_prime, "primes_below": _primes_below, "digit_sum_of_power": _digit_sum_of_power,
            "collatz_steps": _collatz_steps, "fibonacci_mod": _fibonacci_mod, "power_sum_mod": _power_sum_mod}


def problem_for(seed: int) -> tuple[Question, str]:
    """The seed's problem and its gold answer (the solution's output, run in this process)."""
    rng = random.Random(f"code-interpreter:{seed}")
    family = rng.choice(sorted(FAMILIES))
    question, solution = FAMILIES[family](rng)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(solution, f"<{family}>", "exec"), {})  # our own program, not the model's
    return Question(question, solution, family), output.getvalue().strip()


def cut(text: str, max_bytes: int) -> tuple[str, bool]:
    """`text` cut to at most `max_bytes` UTF-8 bytes, at a character boundary; whether it was cut."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text, False
    return data[:max_bytes].decode("utf-8", errors="ignore"), True


def tool_observation(result: SandboxResult, max_output_bytes: int) -> str:
    """One status line, then stdout and stderr together cut to `max_output_bytes` (and a line saying so)."""
    status = {"ok": "[ok]", "error": f"[exit code {result.exit_code}]", "timeout": f"[timeout: {result.detail}]",
              "killed": f"[killed: {result.detail}]"}.get(result.status, f"[{result.status}]")
    output, was_cut = cut(result.stdout + LAUNCHER_FRAMES.sub(r"\1", result.stderr), max_output_bytes)
    was_cut = was_cut or result.stdout_truncated or result.stderr_truncated
    if output and not output.endswith("\n"):
        output += "\n"
    return f"{status}\n{output}" + (f"[output cut at {max_output_bytes} bytes]\n" if was_cut else "")


class CodeInterpreter(Environment):
    """Settings are plain values (`env.settings`); the defaults suit a few-turn episode under the default
    `env.step_timeout_s` (10 s)."""

    def __init__(self, backend: str = "auto", timeout_s: float = 5.0, cpu_time_s: int = 0, memory_mb: int = 512,
                 max_processes: int = 16, max_file_mb: int = 4, max_output_bytes: int = 1024,
                 max_tool_calls: int = 8, allow_unisolated: bool = False) -> None:
        self.backend = resolve_backend(backend)
        if self.backend == "process" and not allow_unisolated:
            from tailflow.engines.reward.sandbox.process import namespaces_available

            if not namespaces_available():
                raise ValueError("code interpreter: the 'process' backend has no namespaces here (needs root and "
                                 "unshare): tool output would show the host's files; use bwrap, or set "
                                 "allow_unisolated for trusted code")
        self.limits = SandboxLimits(timeout_s=timeout_s, cpu_time_s=cpu_time_s or math.ceil(timeout_s),
                                    memory_bytes=memory_mb << 20, max_processes=max_processes,
                                    max_file_bytes=max_file_mb << 20,
                                    max_output_bytes=max(max_output_bytes, MIN_READ_BYTES))
        self.max_output_bytes = max_output_bytes
        if max_tool_calls < 0:
            raise ValueError(f"code interpreter: max_tool_calls must be >= 0, got {max_tool_calls}")
        self.max_tool_calls = max_tool_calls
        self.problem: Question | None = None
        self.gold = ""
        self.tool_calls = 0

    def reset(self, seed: int) -> str:
        self.problem, self.gold = problem_for(seed)
        self.tool_calls = 0
        return (f"{self.problem.question}\n\nYou may run Python: a turn that is a ```python code block is run in a "
                "fresh sandbox (standard library only, no network, nothing kept between runs, "
                f"{self.limits.timeout_s:g} s, at most {self.max_tool_calls} runs) and you see its output, cut at "
                f"{self.max_output_bytes} bytes. End with a last line `{ANSWER_MARKER} <integer>`.\n")

    def step(self, action: str) -> EnvStep:
        if self.problem is None:
            raise RuntimeError("step before reset")
        lines = [line.strip() for line in action.splitlines() if line.strip()]
        if lines and lines[-1].startswith(ANSWER_MARKER):
            answer = unwrapped(lines[-1][len(ANSWER_MARKER):])
            correct = INTEGER.fullmatch(answer) is not None and int(answer) == int(self.gold)
            return EnvStep("", reward=1.0 if correct else 0.0, done=True,
                           info={"correct": int(correct), "tool_calls": self.tool_calls})
        blocks = [body for tag, body in fenced_blocks(action) if tag.lower() in (*PYTHON_TAGS, "")]
        if not blocks:
            raise InvalidAction(f"neither a ```python block nor '{ANSWER_MARKER} <integer>': {action.strip()[:40]!r}")
        if self.tool_calls >= self.max_tool_calls:
            return EnvStep(NO_CALLS_LEFT, info={"tool_calls": self.tool_calls, "status": "refused"})
        self.tool_calls += 1
        result = run_python(blocks[-1], limits=self.limits, backend=self.backend, die_with_parent=True)
        return EnvStep(tool_observation(result, self.max_output_bytes),
                       info={"tool_calls": self.tool_calls, "status": result.status, "tool_s": result.duration_s})
