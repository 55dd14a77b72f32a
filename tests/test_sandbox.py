"""The sandbox against the attacks model-written code can make.

Every attack must end non-ok or visibly fail, leave no process behind (found by
the sandbox dir or a per-test marker in /proc/*/cmdline), and leave the
sandbox usable for the next run.
"""
from __future__ import annotations

import json
import os
import resource
import socket
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from sandbox_leftovers import sandbox_leftovers

from tailflow.engines.reward.sandbox import SandboxError, SandboxLimits, run_python
from tailflow.engines.reward.sandbox import process as process_backend
from tailflow.engines.reward.sandbox.bwrap import bwrap_available, bwrap_works

SMALL = SandboxLimits(timeout_s=2, cpu_time_s=2, memory_bytes=512 << 20, max_processes=32,
                      max_file_bytes=1 << 20, max_output_bytes=64 << 10)
NAMESPACES = process_backend.namespaces_available()
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="needs root and a working unshare")


@pytest.fixture
def marker() -> str:
    return f"tfmark{uuid.uuid4().hex}"


@pytest.fixture(params=["process", "bwrap"])
def sandbox(request):
    """`run_python` on one backend; every attack runs on both."""
    if request.param == "bwrap" and not bwrap_works():
        pytest.skip("bubblewrap (bwrap) is not installed or cannot build its sandbox here")
    return lambda code, **kwargs: run_python(code, backend=request.param, **kwargs)


def leftovers(marker: str) -> list[str]:
    return sandbox_leftovers(marker)


def assert_contained(marker: str, sandbox=run_python) -> None:
    """Nothing survived the run (no process of uid 65534 either), and the next run still works."""
    assert leftovers(marker) == []
    after = sandbox("print(6 * 7)", limits=SMALL)
    assert (after.status, after.stdout) == ("ok", "42\n")


def test_program_reads_stdin_and_returns_stdout_and_exit_code(marker, sandbox):
    result = sandbox("import sys\nprint(sys.stdin.read().upper())\nsys.exit(3)", stdin="hello", limits=SMALL)
    assert (result.status, result.exit_code, result.stdout) == ("error", 3, "HELLO\n")
    ok = sandbox("print('fine')", limits=SMALL)
    assert (ok.status, ok.exit_code, ok.stdout, ok.stdout_truncated) == ("ok", 0, "fine\n", False)


def test_syntax_error_is_an_error_with_the_traceback(marker, sandbox):
    result = sandbox("def broken(:\n    pass\n", limits=SMALL)
    assert result.status == "error" and result.exit_code == 1
    assert "SyntaxError" in result.stderr


@needs_namespaces
def test_runs_as_nobody_with_every_namespace(marker, sandbox):
    code = ("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n"
            "print([l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'NoNewPrivs'))])")
    result = sandbox(code, limits=SMALL)
    assert result.stdout == "65534 65534 []\n['0000000000000000', '1']\n"  # no capabilities, no setuid way back
    assert {"net-ns", "pid-ns", "mount-ns", "uid-nobody"} <= set(result.isolation)


@needs_namespaces
def test_the_sandbox_holds_only_the_interpreter_its_libraries_and_its_own_dir(marker, sandbox):
    """An allowlist, not a denylist: every file the program can find is the interpreter, the standard library, a
    library the interpreter loads or its own scratch dir; no checkout, data, home or installed package."""
    from tailflow.engines.reward.sandbox.allowlist import SANDBOX_DIR, read_only_view

    view = read_only_view()
    allowed = [target for _, target in view.binds] + [SANDBOX_DIR]
    code = (f"import json, os\nallowed, masked = {allowed!r}, {list(view.masked)!r}\noutside, files = [], 0\n"
            "for here, dirs, names in os.walk('/'):\n    dirs[:] = [d for d in dirs if os.path.join(here, d) not in "
            "('/proc', '/dev')]\n    for name in names:\n        path = os.path.join(here, name)\n        files += 1\n"
            "        if not any(path == a or path.startswith(a + '/') for a in allowed):\n"
            "            outside.append(path)\n"
            "print(json.dumps({'outside': outside[:20], 'files': files, 'packages': [os.listdir(m) for m in masked],"
            f" 'repo': os.path.exists({str(Path(__file__).resolve().parents[1])!r}), 'home': os.path.exists('/root')"
            " and os.listdir('/root')}))\n")
    result = sandbox(code, limits=SMALL)
    seen = json.loads(result.stdout)
    assert seen["outside"] == [] and seen["files"] > 100  # the standard library is there, nothing else
    assert seen["packages"] == [[] for _ in view.masked] and not seen["repo"]
    assert seen["home"] in (False, [".pyenv"])  # at most the path down to the interpreter


@needs_namespaces
def test_fork_bomb_hits_the_process_limit_and_dies(marker, sandbox):
    code = ("import os, time\nhit = False\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
            "        if not hit:\n            hit = True\n            print('EAGAIN', flush=True)\n")
    result = sandbox(code, limits=SMALL)
    assert result.status in ("timeout", "killed")
    assert "EAGAIN" in result.stdout  # RLIMIT_NPROC refused forks
    assert_contained(marker, sandbox)


def test_memory_bomb_gets_memory_error(marker, sandbox):
    result = sandbox("block = bytearray(4 << 30)\nprint('allocated')", limits=SMALL)
    assert result.status == "error" and "MemoryError" in result.stderr and "allocated" not in result.stdout
    assert_contained(marker, sandbox)


def test_cpu_loop_is_killed_by_the_cpu_limit(marker, sandbox):
    limits = SandboxLimits(timeout_s=10, cpu_time_s=1, memory_bytes=512 << 20)
    result = sandbox("while True:\n    pass\n", limits=limits)
    assert result.status == "killed" and "SIGXCPU" in result.detail  # the CPU rlimit, not the wall clock
    assert_contained(marker, sandbox)


def test_printing_a_gigabyte_is_truncated_quickly_with_bounded_memory(marker, sandbox):
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n"
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = sandbox(code, limits=SandboxLimits(timeout_s=30, max_output_bytes=64 << 10))
    rss_growth_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert result.status == "killed" and result.stdout_truncated
    assert len(result.stdout) == 64 << 10
    assert "output over" in result.detail  # stopped at the bound, not left to run to its end
    assert rss_growth_kb < 50_000
    assert_contained(marker, sandbox)


@needs_namespaces
def test_writes_outside_the_sandbox_dir_do_not_reach_the_host(marker, tmp_path, sandbox):
    repo = Path(__file__).resolve().parents[1]
    targets = [f"/tmp/{marker}", f"/var/tmp/{marker}", f"/dev/shm/{marker}", f"/work/{marker}", f"{repo}/{marker}",
               f"/root/{marker}"]
    code = (f"import os\nfor path in {targets!r}:\n    try:\n        open(path, 'w').write('x')\n"
            "        print('wrote', path)\n    except OSError as error:\n        print('refused', path, error)\n"
            "open('own.txt', 'w').write('mine')\nprint('cwd', open('own.txt').read())\n")
    result = sandbox(code, limits=SMALL)
    assert result.status == "ok" and "cwd mine" in result.stdout  # its own dir is writable
    for target in targets:
        assert not os.path.exists(target), target
    assert_contained(marker, sandbox)


@needs_namespaces
def test_the_private_dir_is_bounded_in_size(marker, sandbox):
    """Many files each under the file-size limit still cannot fill the host's disk or memory."""
    code = ("n = 0\ntry:\n    for i in range(64):\n        open(f'f{i}', 'wb').write(b'x' * ((1 << 20) - 1))\n"
            "        n += 1\nexcept OSError as error:\n    print('stopped', n, error.errno)\n")
    result = sandbox(code, limits=SMALL)  # 1 MiB files
    assert result.status == "ok" and result.stdout.startswith("stopped")
    assert int(result.stdout.split()[1]) <= 8 and result.stdout.split()[2] in ("27", "28")  # EFBIG, ENOSPC
    assert_contained(marker, sandbox)


@needs_namespaces
def test_parent_credentials_and_environment_are_invisible(marker, monkeypatch, sandbox):
    secret = f"SECRET{uuid.uuid4().hex}"
    home = Path(tempfile.mkdtemp(prefix="tf-home-"))
    try:
        (home / ".aws").mkdir()
        (home / ".aws" / "credentials").write_text(f"[default]\naws_secret_access_key = {secret}\n")
        for path in (home, home / ".aws"):
            path.chmod(0o755)  # world-readable: only the mount namespace can hide it
        (home / ".aws" / "credentials").chmod(0o644)
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        monkeypatch.setenv("TAILFLOW_TEST_SECRET", secret)
        paths = [str(home / ".aws" / "credentials"), os.path.expanduser("~/.aws/credentials"),
                 f"/proc/{os.getpid()}/environ", "/proc/1/environ"]
        code = (f"import os\nprint(dict(os.environ))\nfor path in {paths!r}:\n    try:\n"
                "        print(path, open(path, 'rb').read())\n    except OSError as error:\n"
                "        print('refused', path, type(error).__name__)\n")
        result = sandbox(code, limits=SMALL)
    finally:
        for path in (home / ".aws" / "credentials", home / ".aws", home):
            path.unlink() if path.is_file() else path.rmdir()
    assert result.status == "ok" and "PATH" in result.stdout
    assert secret not in result.stdout + result.stderr
    assert f"refused {paths[0]}" in result.stdout
    assert_contained(marker, sandbox)


@needs_namespaces
def test_cannot_connect_to_a_server_on_the_host_loopback(marker, sandbox):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                "    print('connected')\nexcept OSError as error:\n    print('refused', error)\n")
        result = sandbox(code, limits=SMALL)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert result.status == "ok" and "refused" in result.stdout and "connected" not in result.stdout
    assert_contained(marker, sandbox)


@needs_namespaces
def test_cannot_kill_the_parent_or_the_test_process(marker, sandbox):
    me = os.getpid()
    code = (f"import os\nfor pid in (os.getppid(), {me}, 1):\n    try:\n        os.kill(pid, 9)\n"
            "        print('sent', pid)\n    except OSError as error:\n        print('refused', pid, type(error).__name__)\n"
            "print('still here', flush=True)\nos.kill(-1, 9)\n")
    result = sandbox(code, limits=SMALL)
    os.kill(me, 0)  # reached at all means this process survived; say so explicitly
    assert f"refused {me} ProcessLookupError" in result.stdout  # the pid namespace hides the host
    assert "still here" in result.stdout
    assert_contained(marker, sandbox)


def test_sleeping_past_the_timeout_is_a_timeout(marker, sandbox):
    result = sandbox("import time\ntime.sleep(30)\n", limits=SandboxLimits(timeout_s=1))
    assert (result.status, result.exit_code) == ("timeout", None)
    assert result.duration_s >= 1.0  # by the supervisor's clock: it ran until the timeout, no less
    assert_contained(marker, sandbox)


@needs_namespaces
def test_a_setsid_daemon_does_not_outlive_the_run(marker, sandbox):
    code = ("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'])\n"
            "    os._exit(0)\ntime.sleep(0.5)\n"
            f"alive = [p for p in os.listdir('/proc') if p.isdigit() and b'{marker}' in "
            "open(f'/proc/{p}/cmdline', 'rb').read()]\nprint('daemon-alive' if alive else 'no daemon')\n")
    result = sandbox(code, limits=SMALL)
    assert result.status == "ok" and "daemon-alive" in result.stdout  # it really was running
    assert_contained(marker, sandbox)


def test_fallback_without_namespaces_still_limits_and_kills_the_group(marker, monkeypatch):
    monkeypatch.setattr(process_backend, "namespaces_available", lambda: False)
    ok = run_python("import os\nprint(sorted(os.environ))", limits=SMALL, backend="process")
    assert ok.status == "ok" and "net-ns" not in ok.isolation
    assert "AWS" not in ok.stdout and "HOME" in ok.stdout
    code = (f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'])"
            "\nimport time\ntime.sleep(30)\n")
    result = run_python(code, limits=SandboxLimits(timeout_s=1), backend="process")
    assert result.status == "timeout"
    assert leftovers(marker) == []


def test_unknown_and_unavailable_backends_are_one_line_errors():
    with pytest.raises(SandboxError, match="docker"):
        run_python("print(1)", backend="docker")
    with pytest.raises(SandboxError, match="unknown sandbox backend"):
        run_python("print(1)", backend="vm")


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (bwrap) is not installed on this machine")
def test_auto_picks_bwrap_where_it_works_and_bwrap_sees_a_read_only_root(marker):
    from tailflow.engines.reward.sandbox import default_backend

    assert default_backend() == ("bwrap" if bwrap_works() else "process")
    result = run_python("import os\ntry:\n    open('/tailflow-probe', 'w')\nexcept OSError as error:\n"
                        "    print(type(error).__name__, error.errno)\nprint(os.getcwd(), os.path.exists('/etc'))",
                        limits=SMALL, backend="bwrap")
    assert result.status == "ok" and "OSError 30" in result.stdout  # EROFS: the root is read-only
    assert "/tmp/sandbox False" in result.stdout  # and nearly empty: no /etc (tests_sandbox_view has the rest)


def test_cli_prints_one_json_object(tmp_path, capsys):
    from tailflow.cli import main

    program = tmp_path / "program.py"
    program.write_text("print(input()[::-1])\n")
    stdin = tmp_path / "stdin.txt"
    stdin.write_text("abc\n")
    assert main(["sandbox", "run", str(program), "--timeout", "2", "--stdin", str(stdin)]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["status"], record["exit_code"], record["stdout"]) == ("ok", 0, "cba\n")
    assert {"stderr", "duration_s", "isolation"} <= set(record)


def test_cli_missing_file_is_a_one_line_error(tmp_path, capsys):
    from tailflow.cli import main

    assert main(["sandbox", "run", str(tmp_path / "absent.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert "absent.py" in err and len(err.splitlines()) == 1
