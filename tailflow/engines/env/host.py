"""One environment in a process of its own: a hang is killed, a crash is seen, the host goes on.

An environment is user code (it may parse the model's text, drive a sandbox, hang, or take its process down), so
each instance runs in a child process and talks to its host over a socket pipe. Every call waits at most its
timeout: past it the process is SIGKILLed and the call returns TIMEOUT; a process that died (any signal, any exit)
is seen as end-of-file and the call returns ENV_ERROR. `InvalidAction` raised by the environment comes back as
its own outcome, not a failure: the caller penalises the turn and the trajectory goes on.

Processes come from an `EnvLauncher` (one per host process; engines/env/launcher.py says why not
multiprocessing, and how nothing outlives the host). The host signals and waits through a pidfd, so a pid the
system has reused since can never be signalled by mistake.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from tailflow.engines.env.environment import EnvStep
from tailflow.engines.env.launcher import PID
from tailflow.engines.env.trajectory import StopReason

CLOSE_TIMEOUT_S = 2.0
"""How long `close` waits for the environment's own close before the process is killed."""


class EnvLauncher:
    """The host's end of a launcher process: `launch` forks one environment process there (any thread)."""

    def __init__(self) -> None:
        host_end, launcher_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        paths = os.pathsep.join(path for path in sys.path if path)  # the host's imports, pytest's or Ray's too
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tailflow.engines.env.launcher", str(launcher_end.fileno())],
            pass_fds=[launcher_end.fileno()], env={**os.environ, "PYTHONPATH": paths}, stdin=subprocess.DEVNULL)
        launcher_end.close()
        self.control = host_end
        self.lock = threading.Lock()

    def launch(self, class_path: str, settings: dict) -> tuple[int, Connection]:
        """A new environment process for `class_path(**settings)`: its pid and the host's end of its pipe."""
        host_end, environment_end = socket.socketpair()
        try:
            with self.lock:
                socket.send_fds(self.control, [pickle.dumps((class_path, settings))], [environment_end.fileno()])
                reply = self.control.recv(PID.size)
        except OSError:
            reply = b""
        finally:
            environment_end.close()
        if len(reply) != PID.size:
            host_end.close()
            raise RuntimeError(f"the environment launcher (pid {self.process.pid}) is gone "
                               f"(exit code {self.process.poll()})")
        return PID.unpack(reply)[0], Connection(host_end.detach())

    @property
    def is_alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """Stop the launcher; the environment processes it started go with it."""
        self.control.close()
        try:
            self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass(frozen=True)
class EnvFailure:
    """Why an environment call failed: the trajectory ends with `reason` (TIMEOUT or ENV_ERROR) and is dropped."""

    reason: StopReason
    message: str
    """One line: what happened, for the log and the rollout trace."""


@dataclass(frozen=True)
class ResetResult:
    observation: str
    """The first observation ("" on failure)."""
    seconds: float
    """Wall time of the call as the host saw it (the last attempt's, after retries)."""
    failure: EnvFailure | None = None
    attempts: int = 1
    """Processes started to get here (1 + retries used)."""
    pid: int = 0
    """The environment process's id."""


@dataclass(frozen=True)
class StepResult:
    step: EnvStep | None
    """The environment's answer; None after an invalid action or a failure."""
    seconds: float
    invalid_action: str = ""
    """Non-empty: the environment raised InvalidAction with this message (penalised, not a failure)."""
    failure: EnvFailure | None = None


class EnvHost:
    """One environment process. Calls are sequential (a trajectory's turns); `kill` may come from any thread."""

    def __init__(self, pid: int, connection: Connection) -> None:
        self.pid = pid
        self.connection = connection
        self.pidfd = os.pidfd_open(pid)
        """Readable once the process has exited; signals through it reach this process or none."""
        self.lock = threading.Lock()

    @classmethod
    def start(cls, launcher: EnvLauncher, class_path: str, settings: dict) -> "EnvHost":
        """A new process for one environment of `class_path(**settings)`, built at its first reset."""
        return cls(*launcher.launch(class_path, settings))

    def reset(self, seed: int, timeout_s: float) -> ResetResult:
        started = time.monotonic()
        kind, value = self.call("reset", seed, timeout_s)
        seconds = time.monotonic() - started
        if kind == "ok":
            return ResetResult(value, seconds, pid=self.pid)
        if kind == "invalid":  # reset has no action to reject: InvalidAction there is the environment's error
            value = EnvFailure(StopReason.ENV_ERROR, f"reset raised {value}")
        return ResetResult("", seconds, failure=value, pid=self.pid)

    def step(self, action: str, timeout_s: float) -> StepResult:
        started = time.monotonic()
        kind, value = self.call("step", action, timeout_s)
        seconds = time.monotonic() - started
        if kind == "ok":
            return StepResult(value, seconds)
        if kind == "invalid":
            return StepResult(None, seconds, invalid_action=value)
        return StepResult(None, seconds, failure=value)

    def stall(self, seconds: float, timeout_s: float) -> EnvFailure | None:
        """Have the process sleep `seconds` (an injected delay, engines/env/faults.py); past `timeout_s` it is
        killed as a step that took too long would be."""
        kind, value = self.call("sleep", seconds, timeout_s)
        return value if kind == "failed" else None

    def call(self, command: str, argument: object, timeout_s: float) -> tuple[str, object]:
        """("ok", value), ("invalid", message), or ("failed", EnvFailure); a process that timed out is killed."""
        with self.lock:
            try:
                self.connection.send((command, argument))
                if not self.connection.poll(timeout_s):
                    self.kill()
                    return "failed", EnvFailure(StopReason.TIMEOUT, f"{command} took over {timeout_s:g} s; "
                                                                    f"process {self.pid} killed")
                kind, value = self.connection.recv()
            except (EOFError, OSError):
                return "failed", EnvFailure(StopReason.ENV_ERROR, f"environment process {self.pid} died")
        if kind == "error":
            return "failed", EnvFailure(StopReason.ENV_ERROR, f"{command} raised {value}")
        return kind, value

    @property
    def is_alive(self) -> bool:
        return not self.has_exited(0.0)

    def has_exited(self, within_s: float) -> bool:
        """The pidfd turns readable when the process exits. `poll`, not `select`: a worker hosting hundreds of
        environments holds descriptors past select's FD_SETSIZE (1024), where `select` refuses them (seen at
        576 environments in flight: "filedescriptor out of range in select()")."""
        waiter = select.poll()
        waiter.register(self.pidfd, select.POLLIN)
        return bool(waiter.poll(max(0.0, within_s) * 1000))

    def kill(self) -> None:
        """SIGKILL the process and wait (at most 5 s) until it has exited."""
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone
        self.has_exited(5.0)

    def close(self) -> None:
        """Let the environment close itself (at most CLOSE_TIMEOUT_S), then make sure the process is gone. With a
        call in flight (an abort, `close_all`) the process is killed at once: that call then reads end-of-file and
        fails (ENV_ERROR), and the pipe is closed only after it returned (closed under a reading thread, the read
        raised TypeError instead, from inside multiprocessing). Once; later calls do nothing."""
        if self.connection.closed:
            return
        in_flight = not self.lock.acquire(blocking=False)
        if not in_flight:
            try:
                self.connection.send(("close", None))
                if self.connection.poll(CLOSE_TIMEOUT_S):
                    self.connection.recv()
            except (EOFError, OSError):
                pass
            finally:
                self.lock.release()
        if not self.has_exited(0.0 if in_flight else CLOSE_TIMEOUT_S):
            self.kill()
        took_the_pipe = self.lock.acquire(timeout=CLOSE_TIMEOUT_S)  # the call in flight sees the exit and returns
        try:
            self.connection.close()
            os.close(self.pidfd)
        finally:
            if took_the_pipe:
                self.lock.release()


def start_and_reset(launcher: EnvLauncher, class_path: str, settings: dict, seed: int, timeout_s: float, retries: int,
                    backoff_s: float) -> tuple[EnvHost | None, ResetResult]:
    """Start an environment and reset it, trying again in a fresh process up to `retries` times, waiting
    backoff_s, 2 x backoff_s, ... between attempts. The host on success; None (every process gone) on failure."""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        host = EnvHost.start(launcher, class_path, settings)
        result = host.reset(seed, timeout_s)
        result = ResetResult(result.observation, result.seconds, result.failure, attempt + 1, result.pid)
        if result.failure is None:
            return host, result
        host.close()
    return None, result
