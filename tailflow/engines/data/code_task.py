"""Code problems: a small built-in task, and KodCode / APPS style JSONL files.

docs/rewards.md, "Code problems", describes the task's families and each file style's row fields
(`CodeTests` says what `reference_time_s` is for). The built-in task (tests, demos, `bench/reward.py`) puts a
worked example in each prompt, so prompts differ and both splits hold every family, in equal shares.
"""
from __future__ import annotations

import ast
import json
import os
import random
from dataclasses import dataclass
from typing import Any, Callable, Literal

from tailflow.engines.data.dataset import (
    DatasetError,
    LoadedProblems,
    _field,
    _id_text,
    _InvalidRow,
    _load_rows,
    _require_text,
    _templated_prompt,
)
from tailflow.engines.data.problem import CodeTests, IOCase, Problem

ANSWER_FORMAT = "Answer with the complete program in one ```python code block."
MAX_TRIES = 50  # draws per family and turn before it counts as out of new prompts

# ---- the built-in task ---------------------------------------------------------------------------


def _reference_function(solution: str, name: str) -> Callable:
    """The function `name` of a family's reference solution (ours, run here): what the tests expect is what it
    returns, so the family's logic is written once."""
    namespace: dict = {}
    exec(solution, namespace)
    return namespace[name]


def _sum_times(rng: random.Random):
    k = rng.randint(2, 9)
    cases = [[rng.randint(-50, 99) for _ in range(rng.randint(1, 8))] for _ in range(3)]
    example = [rng.randint(-9, 20) for _ in range(rng.randint(2, 5))]
    prompt = (f"Write a Python program that reads integers separated by spaces from one line of standard input "
              f"and prints their sum multiplied by {k}. For example, for the input `{' '.join(map(str, example))}` "
              f"it prints {sum(example) * k}.")
    solution = f"print(sum(int(x) for x in input().split()) * {k})"
    return prompt, solution, (), tuple(IOCase(" ".join(map(str, c)) + "\n", f"{sum(c) * k}\n") for c in cases)


def _caesar(rng: random.Random):
    k = rng.randint(1, 25)
    solution = ("def shift_text(s):\n    out = []\n    for ch in s:\n        if ch.islower():\n"
                f"            out.append(chr((ord(ch) - 97 + {k}) % 26 + 97))\n        elif ch.isupper():\n"
                f"            out.append(chr((ord(ch) - 65 + {k}) % 26 + 65))\n        else:\n"
                "            out.append(ch)\n    return ''.join(out)")
    shift_text = _reference_function(solution, "shift_text")
    words = ["hello", "World", "xyz", "Tail flow!", "abc-DEF"]
    picked = rng.sample(words, 3)
    example = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 6)))
    prompt = (f"Write a Python function `shift_text(s)` that returns `s` with every letter moved {k} places "
              "forward in the alphabet, wrapping around and keeping case; other characters stay as they are. "
              f"For example shift_text({example!r}) == {shift_text(example)!r}.")
    return prompt, solution, tuple(f"assert shift_text({w!r}) == {shift_text(w)!r}" for w in picked), ()


def _fizzbuzz(rng: random.Random):
    a, b = rng.sample(range(2, 10), 2)
    fizz, buzz = rng.choice([("Fizz", "Buzz"), ("Foo", "Bar"), ("Ping", "Pong"), ("Tic", "Tac")])
    def expected(n: int) -> str:
        return "".join((fizz + buzz if i % a == 0 and i % b == 0 else fizz if i % a == 0 else buzz
                        if i % b == 0 else str(i)) + "\n" for i in range(1, n + 1))
    prompt = (f"Write a Python program that reads n from standard input and prints the numbers 1 to n, one per "
              f"line, printing {fizz} instead of multiples of {a}, {buzz} instead of multiples of {b} and "
              f"{fizz}{buzz} instead of multiples of both.")
    solution = ("n = int(input())\nfor i in range(1, n + 1):\n"
                f"    print({fizz + buzz!r} if i % {a} == 0 and i % {b} == 0 else {fizz!r} if i % {a} == 0 else "
                f"{buzz!r} if i % {b} == 0 else i)")
    return prompt, solution, (), tuple(IOCase(f"{n}\n", expected(n)) for n in rng.sample(range(5, 40), 2))


def _count_char(rng: random.Random):
    c = rng.choice("abcdeilnorstuz")
    texts = ["banana split", "test the tests", "zebra crossing", "a", "", "sassy asides", "duct tape", "lemon curd"]
    example = "".join(rng.choice(f"{c}{c}xyz ") for _ in range(rng.randint(4, 9)))
    prompt = (f"Write a Python function `count_char(s)` that returns how many times the character '{c}' occurs in "
              f"`s`. For example count_char({example!r}) == {example.count(c)}.")
    solution = f"def count_char(s):\n    return s.count({c!r})"
    return prompt, solution, tuple(f"assert count_char({t!r}) == {t.count(c)}" for t in rng.sample(texts, 3)), ()


def _nth_prime(rng: random.Random):
    solution = ("def nth_prime(k):\n    count, n = 0, 1\n    while count < k:\n        n += 1\n"
                "        if all(n % d for d in range(2, int(n ** 0.5) + 1)):\n            count += 1\n    return n")
    nth = _reference_function(solution, "nth_prime")
    ks = rng.sample(range(1, 150), 3)
    prompt = (f"Write a Python function `nth_prime(k)` that returns the k-th prime number (nth_prime(1) == 2). "
              f"For example nth_prime({ks[0]}) == {nth(ks[0])}.")
    return prompt, solution, tuple(f"assert nth_prime({k}) == {nth(k)}" for k in ks), ()


def _kth_largest(rng: random.Random):
    k = rng.randint(1, 3)
    cases = [rng.sample(range(-99, 100), rng.randint(k, k + 6)) for _ in range(3)]
    example = rng.sample(range(-20, 50), k + 2)
    prompt = (f"Write a Python program that reads distinct integers separated by spaces from standard input and "
              f"prints the {['', 'largest', 'second largest', 'third largest'][k]} of them. For example, for the "
              f"input `{' '.join(map(str, example))}` it prints {sorted(example, reverse=True)[k - 1]}.")
    solution = f"print(sorted(map(int, input().split()), reverse=True)[{k - 1}])"
    return prompt, solution, (), tuple(IOCase(" ".join(map(str, c)) + "\n", f"{sorted(c, reverse=True)[k - 1]}\n")
                                       for c in cases)


def _gcd_all(rng: random.Random):
    import math

    cases = [[rng.randint(1, 30) * g for _ in range(rng.randint(2, 5))] for g in rng.sample(range(1, 13), 3)]
    prompt = (f"Write a Python function `gcd_all(numbers)` that returns the greatest common divisor of a list of "
              f"positive integers. For example gcd_all({cases[0]}) == {math.gcd(*cases[0])}.")
    solution = "import math\n\ndef gcd_all(numbers):\n    return math.gcd(*numbers)"
    return prompt, solution, tuple(f"assert gcd_all({c}) == {math.gcd(*c)}" for c in cases), ()


def _join_sorted(rng: random.Random):
    sep = rng.choice([",", ";", "-", "|"])
    words = ["pear", "apple", "fig", "kiwi", "plum", "date", "lime"]
    cases = [rng.sample(words, rng.randint(2, 6)) for _ in range(3)]
    example = cases.pop()
    prompt = (f"Write a Python program that reads words separated by spaces from standard input and prints them in "
              f"alphabetical order joined by '{sep}'. For example, for the input `{' '.join(example)}` it prints "
              f"`{sep.join(sorted(example))}`.")
    solution = f"print({sep!r}.join(sorted(input().split())))"
    return prompt, solution, (), tuple(IOCase(" ".join(c) + "\n", sep.join(sorted(c)) + "\n") for c in cases)


def _digit_power_sum(rng: random.Random):
    p = rng.randint(1, 4)
    ns = rng.sample(range(0, 100000), 4)
    solution = f"def digit_power_sum(n):\n    return sum(int(d) ** {p} for d in str(n))"
    power_sum = _reference_function(solution, "digit_power_sum")
    prompt = (f"Write a Python function `digit_power_sum(n)` that returns the sum of the digits of the non-negative "
              f"integer n, each raised to the power {p}. For example digit_power_sum({ns[3]}) == {power_sum(ns[3])}.")
    return prompt, solution, tuple(f"assert digit_power_sum({n}) == {power_sum(n)}" for n in ns[:3]), ()


def _count_primes_slow(rng: random.Random):
    """The slow family: its reference solution takes ~0.2-0.5 s (trial division)."""
    def count(n: int) -> int:
        sieve = bytearray([1]) * n
        sieve[:2] = b"\0\0"[:n]
        for i in range(2, int(n ** 0.5) + 1):
            if sieve[i]:
                sieve[i * i::i] = bytearray(len(sieve[i * i::i]))
        return sum(sieve)
    n = rng.randint(40_000, 80_000)
    prompt = (f"Write a Python program that reads n from standard input and prints how many primes are below n. "
              f"For example the answer for {n} is {count(n)}.")
    solution = ("n = int(input())\ntotal = 0\nfor k in range(2, n):\n    d = 2\n    while d * d <= k:\n"
                "        if k % d == 0:\n            break\n        d += 1\n    else:\n        total += 1\nprint(total)")
    other = rng.randint(40_000, 80_000)
    return prompt, solution, (), (IOCase(f"{other}\n", f"{count(other)}\n"),)


FAMILIES: dict[str, Callable[[random.Random], tuple]] = {
    "sum_times": _sum_times, "caesar": _caesar, "fizzbuzz": _fizzbuzz, "count_char": _count_char,
    "nth_prime": _nth_prime, "kth_largest": _kth_largest, "gcd_all": _gcd_all, "join_sorted": _join_sorted,
    "digit_power_sum": _digit_power_sum, "count_primes": _count_primes_slow,
}


def builtin_code_problems(seed: int = 0, num_train: int = 400, num_eval: int = 40) -> tuple[list[Problem], list[Problem]]:
    """Train and held-out problems of the built-in code task (no prompt in both); ids `code-<split>-<i>`."""
    def generate(split: str, count: int, taken: set[str]) -> list[Problem]:
        """Families in turn, so each has an equal share; a family retries until its prompt is new."""
        rng = random.Random(f"code:{split}:{seed}")
        problems, seen, names = [], set(taken), list(FAMILIES)
        for turn in range(count * 2):
            if len(problems) == count:
                break
            for _ in range(MAX_TRIES):
                prompt, solution, asserts, io_cases = FAMILIES[names[turn % len(names)]](rng)
                prompt = f"{prompt}\n{ANSWER_FORMAT}\n"
                if prompt not in seen:
                    break
            else:
                continue  # this family has run out of new prompts
            seen.add(prompt)
            problems.append(Problem(f"code-{split}-{len(problems)}", prompt, "", solution=solution,
                                    tests=CodeTests(asserts=asserts, io_cases=io_cases)))
        return problems

    train = generate("train", num_train, set())
    held_out = generate("eval", num_eval, {p.prompt for p in train})
    return train, held_out


# ---- KodCode / APPS files ------------------------------------------------------------------------


def load_code_problems(
    path: str | os.PathLike,
    style: Literal["kodcode", "apps"] = "kodcode",
    *,
    id_field: str | None = None,
    prompt_template: str = "{prompt}",
    tokenizer=None,
    max_prompt_tokens: int | None = None,
    on_invalid: Literal["error", "skip"] = "error",
    source_name: str = "data",
) -> LoadedProblems:
    """Code problems from a JSONL (or Parquet) file; bad rows are errors naming file, line and field, or
    (`on_invalid="skip"`) are skipped and counted by reason."""
    if style not in ("kodcode", "apps"):
        raise DatasetError(f"data.code_format must be 'kodcode' or 'apps', got {style!r}")
    rules = _CodeRowRules(style, id_field or ("problem_id" if style == "apps" else None), prompt_template,
                          tokenizer, max_prompt_tokens)
    return _load_rows(path, source_name, on_invalid, rules)


@dataclass(frozen=True)
class _CodeRowRules:
    """What turns one row of a code dataset into a Problem, or an _InvalidRow naming the field."""

    style: Literal["kodcode", "apps"]
    id_field: str | None
    prompt_template: str
    tokenizer: Any
    max_prompt_tokens: int | None

    def problem(self, record: dict, default_id: str, seen: set[str]) -> Problem:
        id_field = self.id_field  # an APPS row may lack it (then the default id); a KodCode row may not
        is_id_read = id_field and (id_field in record or self.style == "kodcode")
        problem_id = _id_text(record, id_field) if is_id_read else default_id
        if problem_id in seen:
            raise _InvalidRow("duplicate_id", f"field '{id_field}': duplicate problem id {problem_id!r}")
        prompt, solution, tests = (_kodcode_problem if self.style == "kodcode" else _apps_problem)(record)
        prompt = _templated_prompt(prompt, self.prompt_template, self.tokenizer, self.max_prompt_tokens, "question")
        return Problem(problem_id, prompt, "", solution=solution, tests=tests)


def _reference_time(record: dict) -> float | None:
    value = record.get("reference_time_s")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise _InvalidRow("bad_type", f"field 'reference_time_s' must be a positive number, got {value!r}")
    return float(value)


def _optional_string(record: dict, name: str) -> str | None:
    value = record.get(name)
    if value is not None and not isinstance(value, str):
        raise _InvalidRow("bad_type", f"field '{name}' must be a string or null, got {type(value).__name__}")
    return value


def _kodcode_problem(record: dict) -> tuple[str, str | None, CodeTests]:
    prompt = _require_text(record, "question", "empty_prompt")
    test_code = _require_text(record, "test", "bad_tests")
    try:
        tree = ast.parse(test_code)
    except SyntaxError as error:
        raise _InvalidRow("bad_tests", f"field 'test' is not valid Python: {error.msg} (line {error.lineno})") from None
    names = tuple(node.name for node in tree.body
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"))
    if not names:
        raise _InvalidRow("bad_tests", "field 'test' defines no test_* function")
    tests = CodeTests(test_module=test_code, test_functions=names, reference_time_s=_reference_time(record))
    return prompt, _optional_string(record, "solution"), tests


def _json_field(record: dict, name: str) -> Any:
    value = _field(record, name)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise _InvalidRow("bad_tests", f"field '{name}' is not valid JSON: {error.msg}") from None
    return value


def _apps_problem(record: dict) -> tuple[str, str | None, CodeTests]:
    prompt = _require_text(record, "question", "empty_prompt")
    starter = _optional_string(record, "starter_code") or ""
    io = _json_field(record, "input_output")
    if not isinstance(io, dict) or not isinstance(io.get("inputs"), list) or not isinstance(io.get("outputs"), list):
        raise _InvalidRow("bad_tests", "field 'input_output' must hold lists 'inputs' and 'outputs'")
    inputs, outputs = io["inputs"], io["outputs"]
    if not inputs or len(inputs) != len(outputs):
        raise _InvalidRow("bad_tests", f"field 'input_output': {len(inputs)} inputs and {len(outputs)} outputs "
                                       "(need the same number, at least one)")
    fn_name = io.get("fn_name")
    if fn_name:
        call = f"Solution().{fn_name}" if "class Solution" in starter else fn_name
        asserts = []
        for args, expected in zip(inputs, outputs):
            args = args if isinstance(args, list) else [args]
            asserts.append(f"_result = {call}(*{args!r})\nassert _result == {expected!r} or [_result] == {expected!r}")
        tests = CodeTests(asserts=tuple(asserts), reference_time_s=_reference_time(record))
    else:
        if not all(isinstance(x, str) for x in inputs + outputs):
            raise _InvalidRow("bad_tests", "field 'input_output': stdin/stdout cases must be strings")
        tests = CodeTests(io_cases=tuple(IOCase(i, o) for i, o in zip(inputs, outputs)),
                          reference_time_s=_reference_time(record))
    solutions = _json_field(record, "solutions") if record.get("solutions") else []
    solution = solutions[0] if isinstance(solutions, list) and solutions and isinstance(solutions[0], str) else None
    if starter:
        prompt = f"{prompt}\n\nStarter code:\n```python\n{starter}\n```"
    return prompt, solution, tests
