"""The code reward: tests passed, forgery refused, and every attack scored 0 with nothing left running."""
from __future__ import annotations

import os
import pickle
import socket
import uuid
from pathlib import Path

import pytest
from sandbox_leftovers import sandbox_leftovers

from tailflow.engines.data.problem import CodeTests, IOCase, Problem
from tailflow.engines.reward.code import CodeReward, extract_program

MARK = f"tfattack{uuid.uuid4().hex[:12]}"

ADD = Problem("add", "Write add(a, b).", "", tests=CodeTests(
    asserts=("assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4")))
ECHO = Problem("echo", "Print stdin reversed.", "", tests=CodeTests(
    io_cases=(IOCase("abc\n", "cba\n"), IOCase("xy\n", "yx\n"))))


def fenced(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```\n"


ATTACKS: dict[str, str] = {
    "fork bomb": fenced("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
    "memory bomb": fenced("blocks = []\nwhile True:\n    blocks.append(bytearray(64 << 20))"),
    "infinite loop": fenced("while True:\n    pass"),
    "1 GB of stdout": fenced("import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)"),
    "write outside the temp dir": fenced(
        f"for path in ['/tmp/{MARK}', '/work/{MARK}', '/root/{MARK}', '{Path.cwd()}/{MARK}']:\n"
        "    try:\n        open(path, 'w').write('x')\n    except OSError:\n        pass"),
    "read credentials and environment": fenced(
        "import os\nleak = dict(os.environ)\nfor path in [os.path.expanduser('~/.aws/credentials'), '/proc/1/environ']:\n"
        "    try:\n        leak[path] = open(path).read()\n    except OSError:\n        pass\nprint(leak)"),
    "connect to loopback": fenced(
        "import socket\nport = PORT\n"
        "socket.create_connection(('127.0.0.1', port), timeout=1).sendall(b'leak')"),
    "kill the parent": fenced("import os\nfor pid in (os.getppid(), 1):\n    try:\n        os.kill(pid, 9)\n"
                              "    except OSError:\n        pass\nos.kill(-1, 9)"),
    "sleep past the timeout": fenced("import time\ntime.sleep(60)"),
    "daemon that outlives": fenced(
        "import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)  # {MARK}'])\n"
        "    os._exit(0)\ntime.sleep(0.3)"),
    "forged pass lines": fenced("import sys\nfor i in range(3):\n    print('pass', i, file=sys.stderr)\n"
                                "    print('0' * 32, 'pass', i, file=sys.stderr)"),
    "exit 0 before the tests": fenced("import os\nos._exit(0)"),
}
"""Response texts (name -> text) that must all score 0 on `ADD`; `PORT` is replaced by a live server's port."""


def stray_processes() -> list[str]:
    return sandbox_leftovers(MARK)


@pytest.fixture(scope="module")
def loopback_server():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        yield server


def attack_text(name: str, server) -> str:
    return ATTACKS[name].replace("PORT", str(server.getsockname()[1]))


# ---- scoring ---------------------------------------------------------------------------------

def test_reward_is_the_fraction_of_tests_passed():
    reward = CodeReward()
    full = reward.score_problem(fenced("def add(a, b):\n    return a + b"), ADD)
    assert (full.reward, full.correct, full.formatted, full.timeouts) == (1.0, True, True, 0)
    assert full.exec_s is not None and full.exec_s >= 0
    partial = reward.score_problem(fenced("def add(a, b):\n    return 3 if a == 1 else a + b + 1"), ADD)
    assert partial.reward == pytest.approx(1 / 3) and not partial.correct
    io = reward.score_problem(fenced("s = input()\nprint(s[::-1] if s == 'abc' else s)"), ECHO)
    assert io.reward == 0.5 and not io.correct
    assert CodeReward(all_or_nothing=True).score_problem(fenced("def add(a, b):\n    return 3"), ADD).reward == 0.0


def test_broken_or_missing_programs_score_zero():
    reward = CodeReward()
    assert reward.score_problem(fenced("def add(a, b):\n    return a +"), ADD).reward == 0.0
    unfenced = reward.score_problem("def add(a, b):\n    return a + b", ADD)
    assert unfenced.correct and not unfenced.formatted  # the whole text ran; it just was not fenced
    assert reward.score_problem("I cannot do that.", ADD).reward == 0.0
    with pytest.raises(ValueError, match="no code tests"):
        reward.score_problem("x", Problem("p", "q", "1"))


def test_the_reward_pickles_and_resolves_its_backend_where_it_lands():
    reward = pickle.loads(pickle.dumps(CodeReward(all_or_nothing=True)))
    assert reward.sandbox == "auto" and reward.backend in ("bwrap", "process") and reward.all_or_nothing
    assert reward.score_problem(fenced("def add(a, b):\n    return a + b"), ADD).reward == 1.0


def test_extract_program_takes_the_last_python_block():
    text = "```\nnot this\n```\n```python\nfirst\n```\n```py\nlast\n```"
    assert extract_program(text) == ("last\n", True)
    assert extract_program("```\nonly\n```") == ("only\n", True)
    assert extract_program("plain") == ("plain", False)


def test_stdin_of_the_program_is_its_own():
    reward = CodeReward()
    for program in ("import sys\nprint(sys.stdin.buffer.read().decode().strip()[::-1])",
                    "print(open(0).read().strip()[::-1])", "print(input()[::-1])"):
        assert reward.score_problem(fenced(program), ECHO).correct, program


def test_timeouts_and_exec_time_are_reported():
    reward = CodeReward()
    slow = reward.score_problem(fenced("import time\ntime.sleep(0.4)\ndef add(a, b):\n    return a + b"), ADD)
    assert slow.correct and slow.exec_s >= 0.4  # the runner's clock saw the sleep
    hung = reward.score_problem(fenced("import time\ntime.sleep(30)"), ECHO, timeout_s=0.5)
    assert (hung.reward, hung.timeouts) == (0.0, 2)


def test_a_test_that_hangs_or_exits_fails_alone():
    """The execution that stops inside a test loses that test only; the tests after it run afresh."""
    reward = CodeReward()
    hangs_second = fenced("import time\ndef add(a, b):\n    if a == -1:\n        time.sleep(60)\n    return a + b")
    result = reward.score_problem(hangs_second, ADD, timeout_s=1.0)
    assert (result.reward, result.timeouts) == (pytest.approx(2 / 3), 1)
    exits_first = fenced("import os\ndef add(a, b):\n    if a == 1:\n        os._exit(0)\n    return a + b")
    assert reward.score_problem(exits_first, ADD).reward == pytest.approx(2 / 3)
    before = reward.num_executions
    hangs_loading = reward.score_problem(fenced("import time\ntime.sleep(60)"), ADD, timeout_s=0.5)
    assert (hangs_loading.reward, hangs_loading.timeouts, reward.num_executions - before) == (0.0, 1, 1)


# ---- attacks ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_scores_zero_and_the_reward_still_serves(name, loopback_server):
    reward = CodeReward()
    result = reward.score_problem(attack_text(name, loopback_server), ADD, timeout_s=2.0)
    assert (result.reward, result.correct) == (0.0, False)
    assert stray_processes() == []
    with pytest.raises(BlockingIOError):
        loopback_server.accept()  # nothing reached the host's loopback
    for path in (f"/tmp/{MARK}", f"/work/{MARK}", f"/root/{MARK}", f"{Path.cwd()}/{MARK}"):
        assert not os.path.exists(path)
    assert reward.score_problem(fenced("def add(a, b):\n    return a + b"), ADD).reward == 1.0


@pytest.mark.slow  # ~30 s, most of it starting Ray
def test_attacks_on_a_ray_reward_worker(ray_session, loopback_server):
    """The same attacks through the reward pool: all 0, the worker process survives, nothing left behind.
    Costs ~13 s here when the session's Ray is already up (~30 s when this test is the one that starts it): two Ray
    reward workers, each running every attack in its sandbox. It needs real Ray actors, since whether the worker
    process survives the attacks is what it checks."""
    from tailflow.engines.cluster.reward_pool import RewardPool
    from tailflow.engines.reward.spec import RewardSpec
    from tailflow.engines.reward.worker import ScoreItem

    spec = RewardSpec("code", dict(all_or_nothing=False, backend="auto", memory_mb=512, max_processes=32,
                                   timeout_max_s=2.0))
    pool = RewardPool(spec, min_workers=2, max_workers=2)
    try:
        pids = [pool.worker_pid(i) for i in range(2)]
        items = [ScoreItem(f"a{i}#0", attack_text(name, loopback_server), ADD, 2.0) for i, name in enumerate(ATTACKS)]
        outcomes = pool.score_all(items)
        assert [o.result.reward for o in outcomes] == [0.0] * len(ATTACKS)
        after = pool.score_all([ScoreItem("ok#0", fenced("def add(a, b):\n    return a + b"), ADD, 2.0)])
        assert after[0].result.reward == 1.0
        assert [pool.worker_pid(i) for i in range(2)] == pids  # the same worker processes still serve
    finally:
        pool.shutdown()
    assert stray_processes() == []
