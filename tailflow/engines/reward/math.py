"""The verifiable reward: does the response's final answer equal the gold answer?

Rule. A response is *formatted* when its last non-empty line starts with the
final-answer marker (`####` for the embedded task). Only a formatted response
can be *correct*: the text after the marker on that line is parsed with
math-verify and compared with the parsed gold answer by `verify`.

    "23+45=68\\n68+11=79\\n#### 79"  formatted, correct
    "23+45=68\\n68+11=79"            not formatted -> not correct
    "23+45=68\\n68+11=7"             truncated: not formatted -> not correct

Why the marker is required: math-verify falls back to the last number in the
text, so a marker-less "23+45=68\\n68+11=79" parses to 79, and so does a
response cut off mid-line whose last number happens to match. Requiring the
marker on the last line makes rambling or truncated responses score 0.
Parsing only the text after the marker makes any marker work (math-verify
extracts nothing from "A:79", but 79 from "79"; "####79" likewise gives []).

    reward = 1.0 * correct + format_reward * formatted

so with `format_reward=0.1` a formatted wrong answer gets 0.1 and a right one
1.1; the default 0.0 gives the plain 0/1 reward.

Several values. A gold such as `-1, 4` (or `\\{-1, 4\\}`, `(1, 2)`) is compared
as a whole: the response must give every value, as a set or in order as the
gold writes it (`answer_list.py`); `#### 4` scores 0 there, `#### 4, -1` 1.
And a gold of one value accepts one value: math-verify reads the last number
of "3 and 7", so an answer that writes a number beside the one it reads
scores 0 (`writes_one_value`; with `literal_answers_only` such answers were
already refused as not literal).

Literal answers. math-verify compares values, so "#### 23+45+11" equals 79:
a policy would learn to copy the prompt after the marker. With
`literal_answers_only` (the default) the answer (each of its values) must be a number written as
itself: an integer, a decimal or a reduced fraction (`is_literal_answer`), so
`79\\times1`, `158/2` and `\\frac{158}{2}` score 0 against 79.

Time bound. math-verify's own timeout uses `signal.alarm`, which raises
outside the main thread, and a thread cannot bound it either: verifying
"#### 9^9^9^9" spends minutes inside one C-level integer power that holds the
GIL, so a watchdog thread never even runs. So math-verify runs, with its
timeouts off (`parsing_timeout=None`, `timeout_seconds=None`), in one child
process per `MathReward` (started on first use, ~0.5 s); a check that
overruns `timeout_s` counts as incorrect and the child is killed and
restarted. The same path serves the main thread, other threads and Ray
actors. Any failure counts as incorrect and is counted (`num_timeouts`,
`num_errors`).
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import select
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Sequence

from math_verify import parse, verify

from tailflow.engines.reward.answer_list import same_answer, split_answer, unwrapped, writes_one_value
from tailflow.engines.reward.result import RewardResult

MAX_ANSWER_CHARS = 256
"""Longer text after the marker is not parsed (and so is incorrect)."""
WORKER_START_TIMEOUT_S = 120.0


DECIMAL = re.compile(r"\d+(?:\.\d+)?")
"""An unsigned integer or decimal: `79`, `079`, `79.0`."""
FRACTIONS = (re.compile(r"(\d+)/(\d+)"), re.compile(r"\\frac\{(\d+)\}\{(\d+)\}"))
"""`a/b` and its LaTeX spelling `\\frac{a}{b}`, unsigned; a literal only when reduced (see `is_literal_answer`)."""


def is_literal_answer(answer_text: str) -> bool:
    """A number written as itself: an integer, a decimal, or a reduced fraction `a/b` (`\\frac{a}{b}`), with an
    optional leading '-', optionally inside `$...$` or `\\boxed{...}`.

    Anything else can be an expression the policy copied from the prompt, and math-verify compares values:
    `79\\times1`, `158/2` and `\\frac{158}{2}` all equal 79. A fraction counts only when reduced (gcd 1,
    denominator >= 2), since an unreduced one is a quotient, not the number's own spelling.
    """
    unsigned = unwrapped(answer_text).removeprefix("-")
    if DECIMAL.fullmatch(unsigned):
        return True
    for fraction in FRACTIONS:
        match = fraction.fullmatch(unsigned)
        if match:
            numerator, denominator = int(match.group(1)), int(match.group(2))
            return denominator >= 2 and math.gcd(numerator, denominator) == 1
    return False


def final_answer_text(response_text: str, answer_marker: str) -> str | None:
    """The text after the marker on the last non-empty line; None when that line lacks the marker."""
    lines = [line.strip() for line in response_text.splitlines() if line.strip()]
    if not lines or not lines[-1].startswith(answer_marker):
        return None
    return lines[-1][len(answer_marker):].strip()


@functools.lru_cache(maxsize=4096)
def parse_gold(gold_answer: str) -> tuple:
    """The parsed gold answer; cached (in the child) because every response of a group shares it."""
    return tuple(parse(gold_answer, parsing_timeout=None))


def is_answer_correct(answer_text: str, gold_answer: str) -> bool:
    """math-verify's verdict on one extracted answer, in this process and with no time bound; a gold with several
    values is compared as a whole list (`answer_list.py`)."""
    return same_answer(answer_text, gold_answer, is_same_value)


def is_same_value(answer_text: str, gold_text: str) -> bool:
    """One value against one: the answer must write no number beside the one math-verify reads from it
    (`writes_one_value`: "3 and 7" is not 7), and that value must equal the gold's."""
    gold = parse_gold(gold_text)
    predicted = parse(answer_text, parsing_timeout=None)
    read = next((item for item in reversed(predicted) if isinstance(item, str)), "")
    return (bool(gold) and bool(predicted) and writes_one_value(answer_text, read)
            and verify(list(gold), predicted, timeout_seconds=None))


class MathReward:
    def __init__(
        self,
        format_reward: float = 0.0,
        answer_marker: str = "####",
        timeout_s: float = 5.0,
        literal_answers_only: bool = True,
    ):
        if not math.isfinite(format_reward):
            raise ValueError(f"format_reward must be finite, got {format_reward}")
        if not answer_marker.strip():
            raise ValueError("answer_marker must be a non-empty string")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.format_reward = format_reward
        self.answer_marker = answer_marker.strip()
        self.timeout_s = timeout_s
        self.literal_answers_only = literal_answers_only
        self.num_timeouts = 0
        """Checks that ran past `timeout_s`; scored incorrect."""
        self.num_errors = 0
        """Checks that failed (math-verify raised, the child died); scored incorrect."""
        self._lock = threading.Lock()
        self._checker: _CheckerProcess | None = None

    def score(self, response_text: str, gold_answer: str) -> RewardResult:
        answer_text = final_answer_text(response_text, self.answer_marker)
        is_formatted = answer_text is not None
        is_correct = (
            is_formatted
            and 0 < len(answer_text) <= MAX_ANSWER_CHARS
            and (not self.literal_answers_only or all(map(is_literal_answer, split_answer(answer_text).items)))
            and self._check(answer_text, gold_answer)
        )
        reward = 1.0 * is_correct + self.format_reward * is_formatted
        return RewardResult(reward=reward, correct=is_correct, formatted=is_formatted)

    def score_problem(self, response_text: str, problem, timeout_s: float | None = None) -> RewardResult:
        """The reward-function protocol (`spec.build_reward`); math has no adaptive timeout."""
        return self.score(response_text, problem.answer)

    def score_batch(self, texts: Sequence[str], golds: Sequence[str]) -> list[RewardResult]:
        if len(texts) != len(golds):
            raise ValueError(f"score_batch got {len(texts)} texts but {len(golds)} gold answers")
        return [self.score(text, gold) for text, gold in zip(texts, golds)]

    def close(self) -> None:
        """Stops the child process (it also stops when this object is collected or the parent exits)."""
        with self._lock:
            if self._checker is not None:
                self._checker.stop()
                self._checker = None

    def _check(self, answer_text: str, gold_answer: str) -> bool:
        """A child that dies (killed from outside, out of memory) is replaced and the check asked once more:
        losing the process must not change a reward. A second death on the same check (the input itself kills
        it), a check that raises, or one past the timeout scores incorrect."""
        with self._lock:  # one check in flight per child
            for attempt in range(2):
                if self._checker is None:
                    self._checker = _CheckerProcess()
                try:
                    return self._checker.check(answer_text, gold_answer, self.timeout_s)
                except TimeoutError:
                    self.num_timeouts += 1
                    self._drop_dead_checker()
                    return False
                except _CheckFailed:
                    if self._checker.is_alive():  # math-verify raised; the child is fine
                        self.num_errors += 1
                        return False
                    self._drop_dead_checker()
            self.num_errors += 1
            return False

    def _drop_dead_checker(self) -> None:
        if self._checker is not None and not self._checker.is_alive():
            self._checker.stop()
            self._checker = None

    def __getstate__(self) -> dict:  # picklable (Ray): the child and lock are per process
        state = dict(self.__dict__)
        del state["_lock"], state["_checker"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock(), _checker=None)


class _CheckFailed(Exception):
    pass


class _CheckerProcess:
    """A child Python running `serve_answer_checks`: one JSON line in, one out."""

    def __init__(self):
        package_root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        command = [sys.executable, "-c", "from tailflow.engines.reward.math import serve_answer_checks as s; s()"]
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._finalizer = weakref.finalize(self, _kill, self._process)
        try:
            greeting = self._read_reply(WORKER_START_TIMEOUT_S)
        except (TimeoutError, _CheckFailed):
            greeting = None
        if greeting != {"ready": True}:
            exit_code = self._process.poll()
            self.stop()
            raise RuntimeError(f"the math-verify child process did not start (exit code {exit_code}); see its stderr")

    def check(self, answer_text: str, gold_answer: str, timeout_s: float) -> bool:
        try:
            self._process.stdin.write(json.dumps([answer_text, gold_answer]).encode() + b"\n")
            self._process.stdin.flush()
        except OSError as error:
            raise _CheckFailed(f"child process gone: {error}") from error
        reply = self._read_reply(timeout_s)
        if "error" in reply:
            raise _CheckFailed(reply["error"])
        return bool(reply["correct"])

    def _read_reply(self, timeout_s: float) -> dict:
        ready, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        if not ready:
            self.stop()
            raise TimeoutError
        line = self._process.stdout.readline()
        if not line:
            raise _CheckFailed(f"child process exited with code {self._process.poll()}")
        try:
            return json.loads(line)
        except json.JSONDecodeError as error:
            self.stop()  # out of step with the child: start afresh
            raise _CheckFailed(f"unreadable reply {line[:80]!r}") from error

    def is_alive(self) -> bool:
        return self._process.poll() is None

    def stop(self) -> None:
        self._finalizer()


def _kill(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout):
        try:
            stream.close()
        except OSError:  # stdin's unflushed request to a dead child: a broken pipe, nothing to keep
            pass


def serve_answer_checks() -> None:
    """The child's loop: reads `[answer_text, gold_answer]` lines, writes `{"correct": bool}` or `{"error": str}`."""
    replies = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but replies on the pipe
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout is disabled" warning is expected here

    def reply(message: dict) -> None:
        replies.write(json.dumps(message).encode() + b"\n")
        replies.flush()

    reply({"ready": True})
    for line in sys.stdin.buffer:  # ends when the parent closes the pipe or exits
        try:
            answer_text, gold_answer = json.loads(line)
            reply({"correct": is_answer_correct(answer_text, gold_answer)})
        except Exception as error:  # noqa: BLE001 - any failure is an incorrect answer, reported
            reply({"error": f"{type(error).__name__}: {error}"})
