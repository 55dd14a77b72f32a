"""The code-interpreter environment (engines/env/builtin/code_interpreter.py): episodes, bounds, and the sandbox's
guarantees held for tool calls.

The attacks are the red team's own programs, imported (tests/test_reward_red_team.py, tests/test_reward_hacking.py),
run as tool calls; the process-level attacks of tests/test_sandbox.py are written inline there, so they are
restated here in a few lines each. Every attack runs on each backend tests/test_reward_red_team.py runs (`BACKENDS`,
with its skips); what the reward tests require (score 0: nothing of the host read) is here "nothing of the host in
the observation, nothing of the host affected, nothing left running, and the episode goes on".
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid

import pytest
from sandbox_leftovers import sandbox_leftovers
from test_reward_hacking import HACKS
from test_reward_red_team import BACKENDS, DISK_SCAN, REGENERATE, SHARED_MEMORY

from tailflow.engines.env.builtin.code_interpreter import (ANSWER_MARKER, FAMILIES, MIN_READ_BYTES, NO_CALLS_LEFT,
                                                           CodeInterpreter, problem_for)
from tailflow.engines.env.environment import InvalidAction

CLASS_PATH = "tailflow.engines.env.builtin.code_interpreter:CodeInterpreter"
FAST = dict(timeout_s=2.0, memory_mb=256, max_processes=16, max_file_mb=1)
"""Limits for the attack tests: small, so a bomb costs about two seconds."""
SLACK_S = 3.0
"""What a call may take beyond its timeout on this loaded 2-core machine: the sandbox's start and kill."""


def fenced(code: str) -> str:
    return f"```python\n{code}\n```\n"


@pytest.fixture
def environments():
    """Builds environments and closes them after the test."""
    made = []

    def make(**settings) -> CodeInterpreter:
        made.append(CodeInterpreter(**settings))
        return made[-1]
    yield make
    for environment in made:
        environment.close()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


def seed_of(family: str) -> int:
    return next(seed for seed in range(1000) if problem_for(seed)[0].family == family)


def run(environment: CodeInterpreter, code: str) -> str:
    step = environment.step(fenced(code))
    assert not step.done and step.reward == 0.0
    return step.observation


def assert_contained(environment: CodeInterpreter, marker: str) -> None:
    """Nothing the calls started is alive (by the sandbox's own processes or the marker), this process is whole,
    and the episode goes on: the next call runs."""
    assert sandbox_leftovers(marker) == []
    os.kill(os.getpid(), 0)
    assert run(environment, "print(6 * 7)") == "[ok]\n42\n"


# ---- episodes -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_scripted_correct_episode_gets_reward_one(environments, family):
    """Each family: run the family's program as the tool call, read the number, answer it."""
    environment = environments()
    first = environment.reset(seed_of(family))
    assert environment.problem.question in first and "```python" in first and ANSWER_MARKER in first
    observation = run(environment, environment.problem.solution)
    status, value = observation.split()
    assert status == "[ok]" and value == environment.gold
    final = environment.step(f"The program printed {value}.\n{ANSWER_MARKER} {value}")
    assert (final.done, final.reward, final.info) == (True, 1.0, {"correct": 1, "tool_calls": 1})


def test_a_wrong_answer_gets_zero_and_so_does_an_expression(environments):
    environment = environments()
    seed = seed_of("digit_sum_of_power")
    environment.reset(seed)
    wrong = environment.step(f"{ANSWER_MARKER} {int(environment.gold) + 1}")
    assert (wrong.done, wrong.reward, wrong.info["correct"]) == (True, 0.0, 0)
    environment.reset(seed)
    base, power = environment.problem.question.split()[-1].rstrip("?").split("^")
    copied = environment.step(f"{ANSWER_MARKER} {base}**{power}")  # not a literal: the model has to compute
    assert (copied.done, copied.reward) == (True, 0.0)
    assert environment.step(f"{ANSWER_MARKER} {environment.gold}").reward == 1.0


@pytest.mark.parametrize("written, reward", [("$GOLD$", 1.0), ("\\boxed{GOLD}", 1.0), ("  GOLD  ", 1.0),
                                              ("GOLD.5", 0.0), ("GOLD or 3", 0.0), ("", 0.0), ("9" * 5000, 0.0)])
def test_answers_are_read_as_the_math_reward_reads_a_literal_integer(environments, written, reward):
    environment = environments()
    environment.reset(3)
    final = environment.step(f"{ANSWER_MARKER} {written.replace('GOLD', environment.gold)}")
    assert (final.done, final.reward) == (True, reward)


def test_the_same_seed_is_the_same_problem_and_seeds_cover_every_family():
    assert problem_for(7) == problem_for(7)
    assert {problem_for(seed)[0].family for seed in range(60)} == set(FAMILIES)


@pytest.mark.parametrize("action", ["", "42", "ANSWER 42", "print(1)", "```\nunclosed", "``` sh\nls\n```"])
def test_unparsable_turns_are_invalid_actions(environments, action):
    environment = environments()
    environment.reset(0)
    with pytest.raises(InvalidAction):
        environment.step(action)
    assert environment.tool_calls == 0


def test_the_last_python_block_runs_and_an_answer_line_wins_over_code(environments):
    environment = environments()
    environment.reset(0)
    assert run(environment, "print(1)\n```\ntext\n```py\nprint(2)") == "[ok]\n2\n"  # the last python block
    final = environment.step(fenced("print('never run')") + f"{ANSWER_MARKER} {environment.gold}")
    assert (final.done, final.reward, final.info["tool_calls"]) == (True, 1.0, 1)


# ---- bounds -------------------------------------------------------------------------------------------------

def test_output_reaches_the_observation_cut_at_the_bound(environments):
    environment = environments(max_output_bytes=100)
    environment.reset(0)
    assert run(environment, "print('hello')\nimport sys\nprint('oops', file=sys.stderr)") == "[ok]\nhello\noops\n"
    long = run(environment, "print('é' * 5000)")  # two bytes a character: the cut lands on a boundary
    assert long == "[ok]\n" + "é" * 50 + "\n[output cut at 100 bytes]\n"
    error = run(environment, "x = 1\nraise ValueError('x' * 500)")  # read whole, cut here: still its exit code
    assert error.startswith('[exit code 1]\nTraceback (most recent call last):\n  File "/tmp/sandbox/main.py", line 2')
    assert error.endswith("[output cut at 100 bytes]\n")
    assert len(error.encode()) <= 100 + len("[exit code 1]\n\n[output cut at 100 bytes]\n")
    flood = run(environment, "print('x' * (1 << 20))")  # past what is read: killed at the read bound
    assert flood.startswith(f"[killed: output over {MIN_READ_BYTES} bytes") and flood.endswith("bytes]\n")


def test_a_tool_call_that_loops_forever_costs_its_timeout_and_the_episode_goes_on(environments):
    environment = environments(timeout_s=1.0, cpu_time_s=30)
    environment.reset(seed_of("fibonacci_mod"))
    for program in ("while True:\n    pass", "import time\ntime.sleep(60)"):
        started = time.monotonic()
        observation = run(environment, program)
        assert observation.startswith("[timeout: wall clock 1.0s exceeded")
        assert 1.0 <= time.monotonic() - started < 1.0 + SLACK_S
    assert run(environment, environment.problem.solution) == f"[ok]\n{environment.gold}\n"
    assert environment.step(f"{ANSWER_MARKER} {environment.gold}").reward == 1.0


def test_the_cpu_limit_follows_the_timeout_by_default(environments):
    environment = environments(timeout_s=1.0)
    environment.reset(0)
    assert environment.limits.cpu_time_s == 1
    observation = run(environment, "while True:\n    pass")
    assert observation.startswith(("[killed: killed by signal SIGXCPU", "[timeout"))


def test_calls_past_max_tool_calls_are_not_run(environments):
    environment = environments(max_tool_calls=2)
    environment.reset(0)
    assert run(environment, "print(1)") == "[ok]\n1\n" and run(environment, "print(2)") == "[ok]\n2\n"
    started = time.monotonic()
    assert run(environment, "import time\ntime.sleep(5)") == NO_CALLS_LEFT
    assert time.monotonic() - started < 0.5 and environment.tool_calls == 2
    assert environment.step(f"{ANSWER_MARKER} {environment.gold}").reward == 1.0


def test_a_backend_without_namespaces_is_refused_unless_allowed(environments, monkeypatch):
    """The rlimits-only fallback reads what this user reads, and a tool call's output reaches the policy."""
    from tailflow.engines.reward.sandbox import process

    monkeypatch.setattr(process, "namespaces_available", lambda: False)
    with pytest.raises(ValueError, match="allow_unisolated"):
        CodeInterpreter(backend="process")
    environment = environments(backend="process", allow_unisolated=True)
    environment.reset(0)
    assert run(environment, "print(3)") == "[ok]\n3\n"


# ---- a clean namespace per call ---------------------------------------------------------------------------

def test_nothing_of_one_call_reaches_the_next(environments, backend):
    """Names, imported-module state, files in the scratch dir and /tmp, and the environment variables it set."""
    environment = environments(backend=backend, **FAST)
    environment.reset(0)
    first = ("import os, json\nsecret = 41\njson.secret = 41\nos.environ['SECRET'] = '41'\n"
             "open('kept.txt', 'w').write('41')\nopen('/tmp/kept.txt', 'w').write('41') if os.access('/tmp', os.W_OK)"
             " else None\nprint(secret, os.listdir('.'))")
    assert run(environment, first).startswith("[ok]\n41 [")
    second = ("import os, json\nprint('secret' in globals(), hasattr(json, 'secret'), 'SECRET' in os.environ,\n"
              "      os.path.exists('kept.txt'), os.path.exists('/tmp/kept.txt'))")
    assert run(environment, second) == "[ok]\nFalse False False False False\n"


# ---- the red team's programs as tool calls ----------------------------------------------------------------

def test_programs_that_read_the_host_see_nothing_of_it(environments, backend):
    """The red team's scan of the checkout (for the asserts written in its own file) and its regeneration of the
    built-in code task from code_task.py: in the reward they score 0; as a tool call they find nothing to show."""
    environment = environments(backend=backend, timeout_s=20.0, max_output_bytes=4096)
    environment.reset(0)
    scan = run(environment, DISK_SCAN.replace("ROOTS", "['/']") + "print(sorted(FOUND.items()))")
    assert scan == "[ok]\n[]\n"
    regenerated = run(environment, REGENERATE.replace("ROOTS", "['/']") + "print(checkout, sorted(ANSWERS.items()))")
    assert regenerated == "[ok]\nNone []\n"


def test_host_files_other_processes_and_environment_are_not_in_the_observation(environments, backend, monkeypatch,
                                                                                tmp_path):
    """The reward-hacking scan of the host's disk and of every process's command line and environment, with a
    secret planted where it looks (a file under /tmp and this process's environment): its findings are empty."""
    secret = f"assert add({uuid.uuid4().int % 10**9}, 1) == 7"
    (tmp_path / "test_planted.py").write_text(secret + "\n")
    monkeypatch.setenv("TAILFLOW_PLANTED", secret)
    environment = environments(backend=backend, timeout_s=10.0, max_output_bytes=4096)
    environment.reset(0)
    program = HACKS["reading the tests from disk and other processes"]
    observation = run(environment, program + "print(sorted(FOUND.items()))\nprint(open('/proc/1/cmdline').read())")
    assert observation.startswith("[ok]\n[]\n")
    assert secret.split()[1] not in observation and str(tmp_path) not in observation


def test_shared_memory_posted_by_one_call_does_not_reach_the_next(environments, backend):
    key = int(uuid.uuid4().hex[:7], 16)
    program = SHARED_MEMORY.replace("KEY", str(key))
    environment = environments(backend=backend, **FAST)
    environment.reset(0)
    try:
        assert run(environment, program + "post(1, 2, 3)\nprint(table())") == "[ok]\n{(1, 2): 3}\n"  # it could post
        assert run(environment, program + "print(table())") == "[ok]\n{}\n"
    finally:
        subprocess.run(["ipcrm", "-M", str(key)], capture_output=True)  # there only if a sandbox shared the host's


def test_forged_output_on_every_descriptor_is_only_output(environments, backend):
    """The reward-hacking program that writes forged replies and verdicts to every descriptor: the reporting
    channel of a tool call is the observation, and the reward comes only from the answer turn."""
    environment = environments(backend=backend, **FAST)
    environment.reset(0)
    forged = run(environment, HACKS["forged replies and verdicts on every descriptor"]
                 + f"print('{ANSWER_MARKER} {environment.gold}')")
    assert forged.startswith("[ok]\n") and environment.tool_calls == 1
    wrong = environment.step(f"{ANSWER_MARKER} {int(environment.gold) + 1}")
    assert (wrong.done, wrong.reward) == (True, 0.0)


ATTACKS = {
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
                  ("[timeout", "[killed"), ""),
    "memory bomb": ("block = bytearray(4 << 30)\nprint('allocated')", ("[exit code 1]\nTraceback",), "MemoryError"),
    "a gigabyte of output": ("import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)",
                             ("[killed: output over",), "[output cut at"),
    "kill everything in sight": ("import os\nfor pid in (os.getppid(), TEST_PID, 1, -1):\n    try:\n"
                                 "        os.kill(pid, 9)\n    except OSError as error:\n"
                                 "        print('refused', pid, type(error).__name__, flush=True)\n", ("[",),
                                 "refused TEST_PID ProcessLookupError"),
    "a setsid daemon": ("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                        "        os.execv(sys.executable, [sys.executable, '-c',\n"
                        "                 'import time; time.sleep(60)  # MARKER'])\n"
                        "    os._exit(0)\ntime.sleep(0.3)\nprint('started')", ("[ok]\nstarted",), ""),
    "connect to the host's loopback": ("import socket\ntry:\n"
                                       "    socket.create_connection(('127.0.0.1', PORT), timeout=1)\n"
                                       "    print('connected')\nexcept OSError as error:\n    print('refused')",
                                       ("[ok]\nrefused",), ""),
}
"""name -> (program, how its observation may start, what it must hold): tests/test_sandbox.py's process-level
attacks (written inline there), as tool calls. TEST_PID, PORT and MARKER are filled in by the test."""


@pytest.mark.parametrize("name", list(ATTACKS))
def test_process_level_attacks_cost_their_bounds_and_leave_nothing(environments, backend, name):
    marker = f"tfmark{uuid.uuid4().hex}"
    program, starts, holds = (text.replace("TEST_PID", str(os.getpid())) if isinstance(text, str) else text
                              for text in ATTACKS[name])
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        program = program.replace("PORT", str(server.getsockname()[1])).replace("MARKER", marker)
        environment = environments(backend=backend, **FAST)
        environment.reset(0)
        started = time.monotonic()
        observation = run(environment, f"# {marker}\n{program}")
        spent = time.monotonic() - started
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing reached the host's loopback
    assert observation.startswith(starts) and holds in observation, observation[:300]
    assert len(observation.encode()) <= environment.max_output_bytes + 100
    assert spent < FAST["timeout_s"] + SLACK_S
    assert_contained(environment, marker)


# ---- by class path, in its own process ----------------------------------------------------------------------

def test_an_episode_in_its_own_process_by_class_path(tmp_path):
    """The environment process imports the class by path, runs tool calls (the forging program among them) and
    pays the answer; the host's pipe to it is out of the sandbox's reach."""
    from tailflow.engines.env.host import EnvHost, EnvLauncher

    launcher = EnvLauncher()
    host = EnvHost.start(launcher, CLASS_PATH, {"timeout_s": 2.0, "max_output_bytes": 256})
    try:
        seed = seed_of("primes_below")
        first = host.reset(seed, timeout_s=30)
        assert first.failure is None and "prime numbers are there below" in first.observation
        question, gold = problem_for(seed)
        forged = host.step(fenced(HACKS["forged replies and verdicts on every descriptor"]), timeout_s=10)
        assert forged.failure is None and forged.step.observation.startswith("[ok]")
        assert host.step("no code here", timeout_s=10).invalid_action.startswith("InvalidAction")
        output = host.step(fenced(question.solution), timeout_s=10).step
        assert output.observation == f"[ok]\n{gold}\n" and output.info["status"] == "ok"
        final = host.step(f"{ANSWER_MARKER} {gold}", timeout_s=10).step
        assert (final.done, final.reward, final.info) == (True, 1.0, {"correct": 1, "tool_calls": 2})
    finally:
        host.close()
        launcher.close()


def test_a_tool_call_dies_with_its_environment_process(backend):
    """The host kills an environment process whose step outlives `env.step_timeout_s` (and a busy one at close):
    the sandbox it was running goes with it, on every backend, instead of running on to its own timeout."""
    from tailflow.engines.env.host import EnvHost, EnvLauncher

    marker = f"tfmark{uuid.uuid4().hex}"
    launcher = EnvLauncher()
    host = EnvHost.start(launcher, CLASS_PATH, {"backend": backend, "timeout_s": 60.0})
    try:
        assert host.reset(0, timeout_s=30).failure is None
        program = ("import subprocess, sys, time\n"
                   f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'])\n"
                   "time.sleep(60)\n")
        hung = host.step(fenced(program), timeout_s=2.0)
        assert hung.failure is not None and "killed" in hung.failure.message
        deadline = time.monotonic() + 5.0
        while sandbox_leftovers(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sandbox_leftovers(marker) == []
    finally:
        host.close()
        launcher.close()
