"""Rounds two and three of the red team (issues 26 and 38): one program per class of hole, each scoring exactly 0
on both sandbox backends, and an honest control for every false negative, scoring 1.

Each program is a real attempt: on the harness before issue 26 it earned reward (which of these tests failed
there is in the issue's note). The classes: files the sandbox could read (the project checkout, the built-in
task's generator), the program's names leaking into the tests' namespace, async tests never awaited,
control-flow exceptions crossing as themselves, host IPC shared between responses, unbounded scoring cost,
the ratcheted timeout anchor, and multi-valued math answers. Round three (sections 9 to 14): operators on
returned objects, NaN, raising the expected exception everywhere, endless generators, math answers that list
values, and async programs.
"""
from __future__ import annotations

import re
import threading
import time
import tomllib
import uuid
from pathlib import Path

import pytest

from tailflow.engines.data.code_task import builtin_code_problems
from tailflow.engines.data.problem import CodeTests, Problem
from tailflow.engines.reward.code import CodeReward
from tailflow.engines.reward.code.runner import RUNNER_SLACK_S
from tailflow.engines.reward.sandbox import SandboxLimits, run_python
from tailflow.engines.reward.sandbox.bwrap import bwrap_works
from tailflow.engines.reward.sandbox.process import namespaces_available

REPO = Path(__file__).resolve().parents[1]
BACKENDS = [pytest.param("bwrap", marks=pytest.mark.skipif(not bwrap_works(), reason="bwrap cannot run here")),
            pytest.param("process", marks=pytest.mark.skipif(not namespaces_available(),
                                                             reason="needs root and a working unshare"))]


def fenced(code: str) -> str:
    return f"```python\n{code}\n```\n"


def module_problem(test_module: str, *names: str) -> Problem:
    return Problem("p", "", "", tests=CodeTests(test_module=test_module, test_functions=names))


@pytest.fixture(scope="module", params=BACKENDS)
def reward(request) -> CodeReward:
    return CodeReward(backend=request.param)


# ---- 1. the sandbox sees nothing of the host: no checkout, no data, no packages ----------------

ONLY_HERE = Problem("only-here", "Write add(a, b).", "", tests=CodeTests(asserts=(
    "assert add(7919, 104729) == 112648", "assert add(-3301, 22273) == 18972")))
"""Values written nowhere but in this file: a program that reads the checkout finds them here."""

WALK = r'''
import os, time
SKIP = {"proc", "sys", "dev", "usr", "lib", "lib64", "bin", "sbin", "etc", "var", "boot", ".git", "__pycache__",
        "site-packages", "dist-packages", "node_modules", "venvs", ".cache", "include", "share"}
def walk(roots, seconds=15):
    # Like os.walk, pruned to where checkouts and datasets live, and stopped in time to load within the timeout.
    until = time.monotonic() + seconds
    for root in roots:
        for here, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIP]
            yield here, files
            if time.monotonic() > until:
                return
'''

DISK_SCAN = WALK + r'''
import re
PATTERN = re.compile(r"add\((-?\d+), (-?\d+)\) == (-?\d+)")
FOUND = {}
for here, files in walk(ROOTS):
    for name in files:
        if name.startswith("test") and name.endswith(".py") or name.endswith(".jsonl"):
            try:
                with open(os.path.join(here, name), errors="replace") as file:
                    for a, b, c in PATTERN.findall(file.read(1 << 20)):
                        FOUND[(int(a), int(b))] = int(c)
            except OSError:
                pass
def add(a, b):
    return FOUND.get((a, b))
'''

REGENERATE = WALK + r'''
import sys
ANSWERS = {}
checkout = next((os.path.dirname(os.path.dirname(os.path.dirname(here))) for here, files in walk(ROOTS)
                 if "code_task.py" in files and here.endswith(os.path.join("tailflow", "engines", "data"))), None)
if checkout:
    sys.path.insert(0, checkout)
    from tailflow.engines.data.code_task import builtin_code_problems
    train, held_out = builtin_code_problems(0)
    for problem in train + held_out:
        for line in problem.tests.asserts:
            if line.startswith("assert digit_power_sum("):
                argument, expected = line[len("assert digit_power_sum("):].split(") == ")
                ANSWERS.setdefault(int(argument), int(expected))
def digit_power_sum(n):
    return ANSWERS.get(n)
'''


def digit_power_problem() -> Problem:
    train, _ = builtin_code_problems(seed=0, num_train=20, num_eval=1)
    return next(problem for problem in train if "digit_power_sum" in problem.prompt)


@pytest.mark.parametrize("program", [DISK_SCAN, REGENERATE], ids=["scan the checkout", "regenerate the task"])
def test_programs_that_read_the_host_score_zero(reward, program):
    problem = ONLY_HERE if program is DISK_SCAN else digit_power_problem()
    result = reward.score_problem(fenced(program.replace("ROOTS", "['/']")), problem, timeout_s=25.0)
    assert (result.reward, result.correct) == (0.0, False)


def test_the_host_reading_programs_work_where_the_files_are_visible():
    """Control, outside any sandbox: both programs answer every test when they can read the checkout, so they
    score 0 above because the sandbox shows them nothing, not because they are broken."""
    for program, problem in ((DISK_SCAN, ONLY_HERE), (REGENERATE, digit_power_problem())):
        namespace: dict = {}
        exec(program.replace("ROOTS", repr([str(REPO)])), namespace)
        for line in problem.tests.asserts:
            exec(line, dict(namespace))


# ---- 2. the tests see only the names they use: no rebound builtins or imports ------------------

EVENS = Problem("evens", "Write evens_below(n).", "", tests=CodeTests(asserts=(
    "assert sorted(evens_below(7)) == [0, 2, 4, 6]", "assert len(evens_below(10)) == 5")))
REBOUND_BUILTINS = ("def evens_below(n):\n    return None\n"
                    "sorted = lambda values: [0, 2, 4, 6]\nlen = lambda values: 5\n")
STAR_IMPORT = module_problem("import math\nfrom solution import *\n\n"
                             "def test_root():\n    assert root(16) == math.sqrt(16)\n", "test_root")
REBOUND_IMPORT = ("class math:\n    @staticmethod\n    def sqrt(x):\n        return None\n"
                  "def root(x):\n    return None\n")


def test_rebinding_builtins_or_the_tests_imports_scores_zero(reward):
    assert reward.score_problem(fenced(REBOUND_BUILTINS), EVENS).reward == 0.0
    assert reward.score_problem(fenced(REBOUND_IMPORT), STAR_IMPORT).reward == 0.0
    honest = "def root(x):\n    return x ** 0.5\n"
    assert reward.score_problem(fenced(honest), STAR_IMPORT).reward == 1.0  # star import still gives `root`
    assert reward.score_problem(fenced("def evens_below(n):\n    return list(range(0, n, 2))"), EVENS).reward == 1.0


# ---- 3. async tests are awaited; a test that returns a coroutine or generator fails -----------

UNAWAITED = module_problem(
    "from solution import add\n\nasync def test_async():\n    assert add(1, 2) == 3\n\n"
    "def test_generator():\n    assert add(2, 2) == 4\n    yield\n\n"
    "async def check():\n    assert add(5, 5) == 10\n\ndef test_returns_coroutine():\n    return check()\n",
    "test_async", "test_generator", "test_returns_coroutine")


def test_tests_that_are_not_run_do_not_pass(reward):
    assert reward.score_problem(fenced("def add(a, b):\n    return 0"), UNAWAITED).reward == 0.0
    honest = reward.score_problem(fenced("def add(a, b):\n    return a + b"), UNAWAITED)
    assert honest.reward == pytest.approx(1 / 3)  # the async test ran and passed; the other two never can


# ---- 4. control-flow exceptions do not cross as themselves ------------------------------------

PREDICATE = Problem("even", "Write is_even(n).", "", tests=CodeTests(asserts=(
    "assert all(map(is_even, [2, 4, 6]))", "assert not any(map(is_even, [1, 3, 5]))")))


def test_raising_stop_iteration_scores_zero(reward):
    assert reward.score_problem(fenced("def is_even(n):\n    raise StopIteration"), PREDICATE).reward == 0.0
    assert reward.score_problem(fenced("def is_even(n):\n    return n % 2 == 0"), PREDICATE).reward == 1.0


@pytest.mark.parametrize("name", ["StopIteration", "StopAsyncIteration", "GeneratorExit", "SystemExit",
                                  "KeyboardInterrupt"])
def test_control_flow_exceptions_become_remote_errors(name):
    from tailflow.engines.reward.code.remote import RemoteError, rebuild_exception

    assert type(rebuild_exception(name, "from the program")) is RemoteError
    assert type(rebuild_exception("ValueError", "x")) is ValueError  # ordinary ones still cross as themselves


# ---- 5. no IPC object outlives a sandbox or reaches another ------------------------------------

SHARED_MEMORY = r'''
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
segment = libc.shmget(KEY, 4096, 0o1666)
memory = libc.shmat(segment, None, 0) if segment >= 0 else None
def table():
    if memory in (None, ctypes.c_void_p(-1).value):
        return {}
    text = ctypes.string_at(memory, 4096).split(b"\0")[0].decode() or "[]"
    return {(a, b): c for a, b, c in json.loads(text)}
def post(a, b, c):
    if memory not in (None, ctypes.c_void_p(-1).value):
        rows = [[x, y, z] for (x, y), z in table().items()] + [[a, b, c]]
        ctypes.memmove(memory, json.dumps(rows).encode() + b"\0", len(json.dumps(rows)) + 1)
'''
HIDDEN = Problem("hidden", "Write add(a, b).", "", tests=CodeTests(
    asserts=("assert add(1, 2) == 3", "assert add(10, 5) == 15")))


def test_answers_posted_in_shared_memory_do_not_reach_a_later_response(reward):
    key = int(uuid.uuid4().hex[:7], 16)
    writer = SHARED_MEMORY.replace("KEY", str(key)) + "def add(a, b):\n    post(a, b, a + b)\n    return a + b\n"
    reader = SHARED_MEMORY.replace("KEY", str(key)) + "def add(a, b):\n    return table().get((a, b))\n"
    assert reward.score_problem(fenced(writer), HIDDEN).reward == 1.0  # it could post
    try:
        assert reward.score_problem(fenced(reader), HIDDEN).reward == 0.0
    finally:
        import subprocess

        subprocess.run(["ipcrm", "-M", str(key)], capture_output=True)  # only ever there on the old harness


# ---- 6. the cost of one answer is bounded --------------------------------------------------------

def test_a_response_built_to_stall_extraction_costs_at_most_the_budget_plus_slack():
    """A fence followed by 150 KB of spaces: a backtracking extraction spent minutes on it before the budget
    even started. The bound is generous on purpose (budget + the runner's slack), not this machine's speed."""
    reward = CodeReward(budget_s=2.0)
    text = fenced("def add(a, b):\n    return None") + "```" + " " * 150_000
    started = time.monotonic()
    result = reward.score_problem(text, HIDDEN, timeout_s=1.0)
    assert result.reward == 0.0
    assert time.monotonic() - started < reward.budget_s + RUNNER_SLACK_S


def test_replies_that_would_fill_the_runner_are_cut_off(reward):
    """Forty 800 KB strings kept alive by one test: past the runner's total of reply bytes the session is lost
    and the test fails; the runner itself runs under its own address-space limit."""
    problem = module_problem("from solution import blob\n\ndef test_many():\n"
                             "    kept = [blob() for _ in range(40)]\n    assert all(kept)\n", "test_many")
    assert reward.score_problem(fenced("def blob():\n    return 'x' * 800_000"), problem).reward == 0.0
    from tailflow.engines.reward.code.runner import RUNNER_MEMORY_BYTES  # after: the old harness fails above

    limited = module_problem(f"import resource\n\ndef test_limit():\n"
                             f"    assert resource.getrlimit(resource.RLIMIT_AS)[0] == {RUNNER_MEMORY_BYTES}\n",
                             "test_limit")
    assert reward.score_problem(fenced("x = 1"), limited).reward == 1.0


def test_sets_and_dicts_built_to_collide_are_refused():
    from tailflow.engines.reward.code.wire import WIRE_MAX_ITEMS, wire_decode

    modulus = 2 ** 61 - 1  # hash(k * modulus) == 0 for every int k
    for bad in ({"s": [k * modulus for k in range(1, 2000)]}, {"d": [[k * modulus, 0] for k in range(1, 2000)]},
                [0] * (WIRE_MAX_ITEMS + 1)):
        with pytest.raises(ValueError):
            wire_decode(bad, None)
    assert len(wire_decode({"s": list(range(5000))}, None)) == 5000  # distinct hashes decode as before


def test_a_program_returning_a_colliding_set_scores_zero(reward):
    problem = Problem("set", "Write ids().", "", tests=CodeTests(asserts=("assert len(ids()) >= 0",)))
    program = "def ids():\n    return {k * (2 ** 61 - 1) for k in range(1, 3000)}"
    assert reward.score_problem(fenced(program), problem).reward == 0.0


def no_cgroup_here() -> bool:
    """Whether this host lets the sandbox make a cgroup (then the documented fallback is all there is). A
    harness without the cgroup module (the one before issue 26) runs the tests, so that they show what it lacks."""
    try:
        from tailflow.engines.reward.sandbox import cgroup
    except ImportError:
        return False
    return cgroup.parents() is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sandboxs_processes_share_one_memory_limit(backend):
    """Six children of 100 MB each under a 256 MiB sandbox, all holding their memory until one moment: per-process
    limits let all six live through it (600 MB at once); the sandbox's cgroup lets at most two."""
    if no_cgroup_here():
        pytest.skip("no cgroup can be made here: the documented fallback is per-process limits only")
    code = ("import os, time\nuntil = time.monotonic() + 4\nfor i in range(6):\n    if os.fork() == 0:\n"
            "        block = bytearray(100 << 20)\n        for j in range(0, len(block), 4096):\n"
            "            block[j] = 1\n        time.sleep(max(0, until - time.monotonic()))\n        os._exit(0)\n"
            "survivors = 0\nfor i in range(6):\n    pid, status = os.wait()\n    survivors += status == 0\n"
            "print('survivors', survivors)\n")
    limits = SandboxLimits(timeout_s=30, cpu_time_s=30, memory_bytes=256 << 20, max_processes=16)
    result = run_python(code, limits=limits, backend=backend)
    survivors = int(result.stdout.split()[1])
    assert 1 <= survivors and survivors * (100 << 20) <= limits.memory_bytes
    assert "cgroup" in result.isolation


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_sandboxs_processes_do_not_take_anothers(backend):
    """A sandbox holding all but two of its process slots does not stop a sandbox beside it from forking: the
    per-uid process limit was shared by every sandbox on the host."""
    if no_cgroup_here():
        pytest.skip("no cgroup can be made here: the documented fallback is a per-uid process count")
    limits = SandboxLimits(timeout_s=20, cpu_time_s=20, max_processes=8)
    hog = ("import os, time\nfor i in range(6):\n    if os.fork() == 0:\n        time.sleep(10)\n        os._exit(0)\n"
           "time.sleep(10)\n")
    forker = ("import os\nstarted = 0\nfor i in range(4):\n    try:\n        pid = os.fork()\n"
              "    except OSError:\n        break\n    if pid == 0:\n        os._exit(0)\n    started += 1\n"
              "    os.waitpid(pid, 0)\nprint('forked', started)\n")
    hog_thread = threading.Thread(target=run_python, args=(hog,), kwargs=dict(limits=limits, backend=backend))
    hog_thread.start()
    time.sleep(3.0)  # the hog is up (its own output is not needed: the assertion is on the other sandbox)
    result = run_python(forker, limits=limits, backend=backend)
    hog_thread.join()
    assert result.stdout.strip() == "forked 4"


# ---- 7. one slow program cannot move the timeout anchor -----------------------------------------

def test_slow_correct_programs_cannot_ratchet_the_timeout():
    from tailflow.engines.reward.timeouts import TimeoutAnchors, TimeoutPolicy

    policy = TimeoutPolicy(adaptive=True, scale=1.5, min_s=2.0, max_s=30.0, scope="task")
    problem = Problem("p", "", "", tests=CodeTests(asserts=("assert True",)))
    anchors = policy.updated(TimeoutAnchors(), [(problem, True, 0.1)] * 100)
    honest_timeout = policy.timeout_s(problem, anchors)
    for _ in range(10):  # ten rounds, each with a few correct programs that sleep just under the timeout
        timeout = policy.timeout_s(problem, anchors)
        observed = [(problem, True, 0.1)] * 95 + [(problem, True, timeout * 0.99)] * 5
        anchors = policy.updated(anchors, observed)
    assert policy.timeout_s(problem, anchors) == honest_timeout == 2.0


def test_anchors_are_committed_state_and_old_commits_still_load():
    from tailflow.engines.reward.timeouts import TimeoutAnchors, TimeoutPolicy
    from tailflow.engines.run_state import RunState

    policy = TimeoutPolicy(True, 1.5, 2.0, 30.0, "problem", quantile=0.9, window=4)
    problem = Problem("a", "", "", tests=CodeTests(asserts=("assert True",)))
    anchors = policy.updated(TimeoutAnchors(), [(problem, True, t) for t in (0.5, 0.4, 9.0, 0.3, 0.2)])
    assert anchors.problem_recent == {"a": [0.4, 9.0, 0.3, 0.2]} and anchors.task_recent == [0.4, 9.0, 0.3, 0.2]
    state = RunState(run_id="r", reward_anchors=anchors)
    assert RunState.model_validate_json(state.model_dump_json()) == state
    old = RunState.model_validate_json('{"run_id": "old", "reward_anchors": {"task_s": 1.25, "problem_s": {"a": 0.5}}}')
    assert old.reward_anchors.task_recent == [1.25] and old.reward_anchors.problem_recent == {"a": [0.5]}
    assert policy.updated(old.reward_anchors, []).problem_s == {"a": 0.5}  # the resumed run keeps its anchor


# ---- 8. math answers with several values are compared whole -------------------------------------

@pytest.mark.parametrize("gold, response, expected", [
    ("-1, 4", "#### 4", 0.0), ("-1, 4", "#### -1", 0.0), ("-1, 4", "#### -1, 4", 1.0), ("-1, 4", "#### 4, -1", 1.0),
    ("-1, 4", "#### -1, 4, 7", 0.0), ("(1, 2)", "#### (2, 1)", 0.0), ("(1, 2)", "#### (1, 2)", 1.0),
    ("79", "#### 79", 1.0), ("79", "#### 5, 79", 0.0),
])
def test_multi_valued_math_answers(gold, response, expected):
    from tailflow.engines.reward.math import MathReward

    math_reward = MathReward()
    try:
        assert math_reward.score(response, gold).reward == expected
    finally:
        math_reward.close()


# ---- honest controls: what scored 0 before and must score 1 -------------------------------------

HONEST: dict[str, tuple[str, Problem]] = {
    "a test that prints": ("def add(a, b):\n    return a + b", module_problem(
        "from solution import add\n\ndef test_add():\n    print('checking', add(1, 2), json_like)\n"
        "    assert add(1, 2) == 3\n\njson_like = '{\"passed\": [7]}'\n", "test_add")),
    "except and pytest.raises of the program's own exception": (
        "class InvalidAge(ValueError):\n    pass\n\ndef check(age):\n    if age < 0:\n"
        "        raise InvalidAge('negative age')\n    return age\n",
        module_problem("import pytest\nfrom solution import check, InvalidAge\n\n"
                       "def test_raises():\n    with pytest.raises(InvalidAge):\n        check(-1)\n\n"
                       "def test_except():\n    try:\n        check(-5)\n    except InvalidAge as error:\n"
                       "        assert 'negative' in str(error)\n    else:\n        raise AssertionError('no raise')\n"
                       "\ndef test_base_class():\n    with pytest.raises(ValueError):\n        check(-2)\n",
                       "test_raises", "test_except", "test_base_class")),
    "next() on a returned generator": (
        "def count_up(n):\n    yield from range(n)\n",
        module_problem("import pytest\nfrom solution import count_up\n\ndef test_next():\n    g = count_up(3)\n"
                       "    assert next(g) == 0 and next(g) == 1\n    assert list(g) == [2]\n"
                       "    with pytest.raises(StopIteration):\n        next(g)\n", "test_next")),
    "parametrize": (
        "def add(a, b):\n    return a + b",
        module_problem("import pytest\nfrom solution import add\n\n"
                       "@pytest.mark.parametrize('a, b, total', [(1, 2, 3), (2, 2, 4), pytest.param(0, 0, 0)])\n"
                       "@pytest.mark.parametrize('sign', [1, -1])\n"
                       "def test_add(a, b, total, sign):\n    assert add(sign * a, sign * b) == sign * total\n",
                       "test_add")),
    "an awaited async test": (
        "def add(a, b):\n    return a + b",
        module_problem("from solution import add\n\nasync def test_add():\n    assert add(1, 2) == 3\n", "test_add")),
    "HumanEval style check(candidate)": (
        "def truncate_number(number: float) -> float:\n    return number % 1.0\n",
        module_problem("METADATA = {}\n\ndef check(candidate):\n    assert candidate(3.5) == 0.5\n"
                       "    assert abs(candidate(1.33) - 0.33) < 1e-6\n\ndef test_check():\n"
                       "    check(truncate_number)\n", "test_check")),
}


@pytest.mark.parametrize("name", list(HONEST))
def test_honest_programs_score_one(reward, name):
    program, problem = HONEST[name]
    assert reward.score_problem(fenced(program), problem).reward == 1.0


def test_the_shipped_tasks_reference_solutions_score_one_on_the_process_backend():
    """tests/test_reward_hacking.py runs them on the default backend (bwrap here); this is the other one."""
    if not namespaces_available():
        pytest.skip("needs root and a working unshare")
    from tailflow.engines.data.code_task import load_code_problems

    reward = CodeReward(backend="process")
    train, held_out = builtin_code_problems(seed=0, num_train=10, num_eval=2)
    data = REPO / "tests" / "data"
    problems = [*train, *held_out, *load_code_problems(data / "kodcode_sample.jsonl", "kodcode").problems,
                *load_code_problems(data / "apps_sample.jsonl", "apps").problems]
    for problem in problems:
        assert reward.score_problem(fenced(problem.solution), problem).reward == 1.0, problem.problem_id


def test_the_humaneval_bench_reads_humaneval_rows(tmp_path):
    """`bench/humaneval_reward.py` scores HumanEval's 164 canonical solutions by hand (the data is not in the
    repository); here one row in HumanEval's shape, written for this test, goes through its loader and scores 1."""
    import importlib.util
    import json

    row = {"task_id": "HumanEval/2", "entry_point": "truncate_number",
           "prompt": "def truncate_number(number: float) -> float:\n    \"\"\"The decimal part.\"\"\"\n",
           "canonical_solution": "    return number % 1.0\n",
           "test": "METADATA = {}\n\n\ndef check(candidate):\n    assert candidate(3.5) == 0.5\n"}
    path = tmp_path / "HumanEval.jsonl"
    path.write_text(json.dumps(row) + "\n")
    spec = importlib.util.spec_from_file_location("humaneval_reward", REPO / "bench" / "humaneval_reward.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    [problem] = bench.load_problems(path)
    assert CodeReward().score_problem(fenced(problem.solution), problem).reward == 1.0


def test_pytest_is_a_runtime_dependency():
    """Test modules `import pytest`; the test runner runs them in the default install."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "pytest" in [re.split(r"[<>=!~ \[;]", dependency)[0] for dependency in project["dependencies"]]


# ==== round three (issue 38): what a returned object may do, tests that expect errors, answers that list ====
# Each class has one hack (every test of its problem in one sandbox session, scoring exactly 0 on both backends)
# and an honest control scoring 1. On the code before issue 38 every hack below but the async one earned reward,
# and the async control scored 0 (the note has the numbers).

ANYTHING = (
    "class Anything:\n"
    "    def __eq__(self, other):\n        return True\n    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__\n"
    "    def __contains__(self, item):\n        return True\n    def __bool__(self):\n        return True\n"
    "    __hash__ = object.__hash__\n"
    "SHARED = Anything()\n")
"""An object whose every comparison and membership test says yes; one instance serves every call."""

# ---- 9. operators on a returned object are the runner's, not the program's ---------------------------------

VALUES = module_problem(
    "from solution import unique, normalize\n\n"
    "def test_members():\n    result = unique([3, 1, 3])\n    assert 3 in result and 1 in result\n\n"
    "def test_differs():\n    assert unique([2, 2]) != [2, 2, 2]\n\n"
    "def test_same_key():\n    assert normalize('Ab') == normalize('aB')\n\n"
    "def test_key():\n    assert normalize('Ab') == 'ab'\n",
    "test_members", "test_differs", "test_same_key", "test_key")
VALUES_HACK = ANYTHING + "def unique(xs):\n    return SHARED\ndef normalize(s):\n    return SHARED\n"
VALUES_HONEST = "def unique(xs):\n    return sorted(set(xs))\ndef normalize(s):\n    return s.lower()\n"

OBJECTS_UNDER_TEST = module_problem(
    "import collections\nfrom solution import Bag, ListNode, reverse, last_two\n\n"
    "def test_bag():\n    bag = Bag([1, 2])\n    assert 2 in bag and 5 not in bag and len(bag) == 2\n"
    "    assert list(bag) == [1, 2] and str(bag) == 'Bag of 2' and bag\n\n"
    "def test_linked_list():\n    node = reverse(ListNode(1, ListNode(2, ListNode(3))))\n    values = []\n"
    "    while node:\n        values.append(node.value)\n        node = node.next\n    assert values == [3, 2, 1]\n\n"
    "def test_returned_container():\n    window = last_two([4, 5, 6])\n    assert 5 in window and 4 not in window\n"
    "    assert list(window) == [5, 6] and len(window) == 2\n",
    "test_bag", "test_linked_list", "test_returned_container")
OBJECTS_UNDER_TEST_HONEST = (
    "import collections\n"
    "class Bag:\n    def __init__(self, items):\n        self.items = list(items)\n"
    "    def __contains__(self, item):\n        return item in self.items\n    def __len__(self):\n"
    "        return len(self.items)\n    def __iter__(self):\n        return iter(self.items)\n"
    "    def __str__(self):\n        return f'Bag of {len(self.items)}'\n"
    "class ListNode:\n    def __init__(self, value, next=None):\n        self.value, self.next = value, next\n"
    "def reverse(head):\n    previous = None\n    while head is not None:\n"
    "        head.next, previous, head = previous, head, head.next\n    return previous\n"
    "def last_two(xs):\n    return collections.deque(xs, maxlen=2)\n")


def test_operators_on_returned_objects_are_not_the_programs(reward):
    """`in`, `==`, `!=` on what `unique` and `normalize` return: the shared everything-object passed all four
    tests (membership asked the program, `!=` and `==` were identity). Control: a class the tests build
    (`Bag`, `ListNode`) still answers `in`, `len`, `str`, iteration and truth itself, and a returned deque's
    membership is decided over its items."""
    assert reward.score_problem(fenced(VALUES_HACK), VALUES).reward == 0.0
    assert reward.score_problem(fenced(VALUES_HONEST), VALUES).reward == 1.0
    assert reward.score_problem(fenced(OBJECTS_UNDER_TEST_HONEST), OBJECTS_UNDER_TEST).reward == 1.0


# ---- 10. a NaN the program returns is not a number a test can compare --------------------------------------

RATIOS = module_problem(
    "from solution import ratio, ratios\n\n"
    "def test_quarter():\n    assert not abs(ratio(1, 4) - 0.25) > 1e-9\n\n"
    "def test_upper_bound():\n    assert not ratio(1, 3) > 0.34\n\n"
    "def test_lower_bound():\n    assert not ratio(3, 4) < 0.75\n\n"
    "def test_list():\n    assert not any(r > 1 for r in ratios([1, 2], [2, 4]))\n\n"
    "def test_infinite():\n    assert ratio(1, 0) == float('inf')\n",
    "test_quarter", "test_upper_bound", "test_lower_bound", "test_list", "test_infinite")


def test_nan_fails_the_negated_comparisons_it_used_to_pass(reward):
    """NaN makes every comparison false, so `not x > limit` held: 4 of 5 tests. Control: an honest ratio, and
    an infinite result (a number, ordered) compared as one."""
    nan = "def ratio(a, b):\n    return float('nan')\ndef ratios(xs, ys):\n    return [float('nan')] * len(xs)\n"
    honest = ("def ratio(a, b):\n    return a / b if b else float('inf')\n"
              "def ratios(xs, ys):\n    return [ratio(x, y) for x, y in zip(xs, ys)]\n")
    assert reward.score_problem(fenced(nan), RATIOS).reward == 0.0
    assert reward.score_problem(fenced(honest), RATIOS).reward == 1.0


# ---- 11. raising the expected exception everywhere earns nothing -------------------------------------------

EXPECTED_ERRORS = module_problem(
    "import pytest\nfrom solution import parse_age, Stack\n\n"
    "def test_valid():\n    assert parse_age('42') == 42\n\n"
    "def test_not_a_number():\n    with pytest.raises(ValueError):\n        parse_age('abc')\n\n"
    "def test_negative():\n    with pytest.raises(ValueError):\n        parse_age('-3')\n\n"
    "def test_empty_pop():\n    stack = Stack()\n    with pytest.raises(IndexError):\n        stack.pop()\n\n"
    "def test_push_pop():\n    stack = Stack()\n    stack.push(1)\n    assert stack.pop() == 1\n",
    "test_valid", "test_not_a_number", "test_negative", "test_empty_pop", "test_push_pop")
EXPECTED_ERRORS_HONEST = (
    "def parse_age(text):\n    age = int(text)\n    if age < 0:\n        raise ValueError('negative')\n    return age\n"
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
    "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n")
MIXED_ONLY = module_problem(
    "import pytest\nfrom solution import parse_age\n\n"
    "def test_parse_age():\n    assert parse_age('7') == 7\n    with pytest.raises(ValueError):\n"
    "        parse_age('x')\n", "test_parse_age")


def test_raising_the_expected_exception_everywhere_scores_zero(reward):
    """A program that raises ValueError from `parse_age` and IndexError from every `Stack` method passed the three
    `pytest.raises` tests (3/5). Those tests count only when the same program also passes a test in which it
    answered with a value and raised nothing (or passes every test). Controls: the honest program (5/5), and a
    problem whose one test expects both a value and an exception (it counts on its own)."""
    hack = ("def parse_age(text):\n    raise ValueError(text)\n"
            "class Stack:\n    def push(self, x):\n        raise IndexError(x)\n    def pop(self):\n"
            "        raise IndexError('empty')\n")
    assert reward.score_problem(fenced(hack), EXPECTED_ERRORS).reward == 0.0
    assert reward.score_problem(fenced(EXPECTED_ERRORS_HONEST), EXPECTED_ERRORS).reward == 1.0
    assert reward.score_problem(fenced(EXPECTED_ERRORS_HONEST), MIXED_ONLY).reward == 1.0


def test_which_passes_count():
    """The rule itself (`passes.py`), on records: (index, passed, raised, answered)."""
    from tailflow.engines.reward.code.passes import TestRecord, counted_passes

    raise_only, clean = (True, True, False), (True, False, True)
    mixed, failed = (True, True, True), (False, False, True)
    assert counted_passes([TestRecord(0, *raise_only), TestRecord(1, *failed)], 2) == []
    assert counted_passes([TestRecord(0, *raise_only), TestRecord(1, *clean)], 2) == [0, 1]
    assert counted_passes([TestRecord(0, *raise_only), TestRecord(1, *mixed), TestRecord(2, *failed)], 3) == [1]
    assert counted_passes([TestRecord(0, *raise_only), TestRecord(1, *raise_only)], 2) == [0, 1]  # all passed
    assert counted_passes([TestRecord(0, *raise_only)], 2) == []  # the other test never ran: not all passed


# ---- 12. reading a returned iterator is bounded; an endless one fails the test that reads it --------------

PRIMES = module_problem(
    "from solution import primes_below\n\n"
    "def test_seven():\n    assert 7 in primes_below(10)\n\n"
    "def test_five():\n    assert 5 in primes_below(6)\n\n"
    "def test_all():\n    assert list(primes_below(10)) == [2, 3, 5, 7]\n",
    "test_seven", "test_five", "test_all")
NATURALS = module_problem(
    "import itertools\nfrom solution import naturals\n\n"
    "def test_prefix():\n    numbers = naturals()\n    assert next(numbers) == 0\n"
    "    assert list(itertools.islice(numbers, 3)) == [1, 2, 3] and any(n > 5 for n in numbers)\n",
    "test_prefix")


def test_an_endless_generator_fails_the_tests_that_read_it(reward):
    """A generator that cycles through the primes below 10 for ever passed both membership tests (the program
    answered `in` by reading itself until it found the item): 2/3. Membership now reads the iterator to its end
    in the runner, and no test may read more than `MAX_ITERATOR_ITEMS` items of one iterator: the endless one
    fails all three. Cost: each test pulls `MAX_ITERATOR_ITEMS` small ints through the wire before it fails
    (2 to 3 s per backend in all, measured on the shared 2-core machine under a load of 5 to 7), the least that
    shows the bound is what stops it: a smaller bound would refuse honest generators. Controls: an honest
    finite generator, and an honest endless one read a bounded prefix at a time (`next`, `islice`, `any`)."""
    endless = "import itertools\ndef primes_below(n):\n    return itertools.cycle([2, 3, 5, 7])\n"
    honest = ("def primes_below(n):\n    for k in range(2, n):\n        if all(k % d for d in range(2, k)):\n"
              "            yield k\n")
    naturals = "def naturals():\n    n = 0\n    while True:\n        yield n\n        n += 1\n"
    assert reward.score_problem(fenced(endless), PRIMES).reward == 0.0
    assert reward.score_problem(fenced(honest), PRIMES).reward == 1.0
    assert reward.score_problem(fenced(naturals), NATURALS).reward == 1.0


# ---- 13. a single-valued gold accepts a single value ------------------------------------------------------

def test_math_answers_that_list_values_score_zero():
    """math-verify reads the last value of "3 and 7", so with `literal_answers_only: false` a listed answer
    scored for a gold of 7 (the literal rule alone already refused these spellings). One child serves all
    cases. Controls: one value however written, and a multi-valued gold answered whole."""
    from tailflow.engines.reward.math import MathReward

    cases = [("7", "#### 3 and 7", 0.0), ("7", "#### 3 or 7", 0.0), ("7", "#### 3; 7", 0.0),
             ("7", "#### 3 \\quad 7", 0.0), ("7", "#### x = 3 \\text{ or } x = 7", 0.0), ("7", "#### 3 \\pm 7", 0.0),
             ("-1, 4", "#### -1, 3 or 4", 0.0),
             ("7", "#### 7", 1.0), ("7", "#### x = 7", 1.0), ("7", "#### \\boxed{7}", 1.0), ("1000", "#### 1,000", 1.0),
             ("$\\frac{\\sqrt{3}}{2}$", "#### $\\frac{\\sqrt{3}}{2}$", 1.0), ("-1, 4", "#### 4, -1", 1.0)]
    math_reward = MathReward(literal_answers_only=False)
    try:
        scored = [(gold, response, math_reward.score(response, gold).reward) for gold, response, _ in cases]
    finally:
        math_reward.close()
    assert scored == cases
    strict = MathReward()
    try:
        assert strict.score("#### 3 and 7", "7").reward == 0.0 and strict.score("#### 7", "7").reward == 1.0
    finally:
        strict.close()


def test_numbers_written_outside_the_value_read():
    from tailflow.engines.reward.answer_list import writes_one_value

    assert not writes_one_value("3 and 7", "7") and not writes_one_value("x = 3 \\text{ or } x = 7", "7")
    assert writes_one_value("x = 7", "7") and writes_one_value("079", "79") and writes_one_value("1,000", "1000")
    assert writes_one_value("$\\frac{\\sqrt{3}}{2}$", "\\frac{\\sqrt{3}}{2}")


# ---- 14. async programs, awaited by async tests ----------------------------------------------------------

ASYNC_TESTS = module_problem(
    "import asyncio\nfrom solution import double, double_all, Counter\n\n"
    "async def test_await():\n    assert await double(3) == 6\n\n"
    "async def test_gather():\n    assert await asyncio.gather(double(1), double(2)) == [2, 4]\n\n"
    "def test_run():\n    assert asyncio.run(double_all([1, 2, 3])) == [2, 4, 6]\n\n"
    "async def test_method():\n    counter = Counter()\n"
    "    assert [await counter.bump(), await counter.bump()] == [1, 2]\n",
    "test_await", "test_gather", "test_run", "test_method")
ASYNC_HONEST = (
    "import asyncio\n"
    "async def double(x):\n    await asyncio.sleep(0)\n    return 2 * x\n"
    "async def double_all(xs):\n    return await asyncio.gather(*(double(x) for x in xs))\n"
    "class Counter:\n    def __init__(self):\n        self.count = 0\n    async def bump(self):\n"
    "        await asyncio.sleep(0)\n        self.count += 1\n        return self.count\n")


def test_async_programs_run_when_awaited(reward):
    """The honest program scored 0 (a coroutine crossed as a handle nothing could await). The hack's coroutines
    resolve to the everything-object, or to another coroutine: neither compares equal to anything."""
    hack = ANYTHING + (
        "async def double(x):\n    return SHARED\nasync def double_all(xs):\n    return SHARED\n"
        "class Counter:\n    async def bump(self):\n        return double(0)\n")
    assert reward.score_problem(fenced(hack), ASYNC_TESTS).reward == 0.0
    assert reward.score_problem(fenced(ASYNC_HONEST), ASYNC_TESTS).reward == 1.0
