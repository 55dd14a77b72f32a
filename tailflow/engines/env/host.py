"""One environment in a process of its own: a hang is killed, a crash is seen, the host goes on.

An environment is user code (it may parse the model's text, drive a sandbox, hang, or take its process down), so
each instance runs in a child process and talks to its host over a pipe. Every call waits at most its timeout:
past it the child is SIGKILLed and the call returns TIMEOUT; a child that died (any signal, any exit) is seen as
end-of-file on the pipe and the call returns ENV_ERROR. `InvalidAction` raised by the environment comes back as
its own outcome, not a failure: the caller penalises the turn and the trajectory goes on.

Start method: `forkserver`. The host is usually a Ray actor, a process with threads (Ray's own, and the worker's
step threads), and `fork` from a threaded process copies locks that other threads may hold at that instant, so
a child can deadlock on its first allocation or log line. `spawn` is safe but starts a fresh interpreter per
environment. The fork server is spawned once per host process, single-threaded, with this module preloaded;
each environment is then forked from it, which is both safe and cheap: measured on this machine (2 shared
cores, 2026-11-28), `EnvHost.start` plus the first reset of the calculator took 9 ms median with the server
running (spawn: ~110 ms), and the server's own start ~0.25 s once per host.

Children never outlive their host: each child asks the kernel (prctl PR_SET_PDEATHSIG) for SIGKILL when its
parent, the fork server, exits, and the fork server exits when its host does (it reads end-of-file on the pipe
its host holds, also when the host is SIGKILLed; see `die_with_parent` for the one copy of that pipe a child must
close). So a killed Ray actor takes its environments with it.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from tailflow.engines.env.environment import EnvStep, InvalidAction, environment_class
from tailflow.engines.env.trajectory import StopReason

START_METHOD = "forkserver"
PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""
CLOSE_TIMEOUT_S = 2.0
"""How long `close` waits for the environment's own close before the process is killed."""


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


def die_with_parent() -> None:
    """In the child: SIGKILL when the parent (the fork server) exits; exit now if it already has.

    The fork server hands each child the write end of its "host alive" pipe (so a child could start processes of
    its own through the server), and the server exits only when every write end is closed: a child keeping it
    would keep the server, and through it itself, alive after the host died. So the child closes it first.
    """
    from multiprocessing import forkserver

    alive_fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if alive_fd is not None:
        os.close(alive_fd)
        forkserver._forkserver._forkserver_alive_fd = None
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


def serve_environment(connection: Connection, class_path: str, settings: dict) -> None:
    """The child's loop: build the environment at the first reset, answer each call, stop at `close` or EOF."""
    die_with_parent()
    environment = None
    while True:
        try:
            command, argument = connection.recv()
        except (EOFError, OSError):
            return
        if command == "close":
            if environment is not None:
                try:
                    environment.close()
                except Exception:  # noqa: BLE001 - closing is best effort; the process ends anyway
                    pass
            connection.send(("closed", None))
            return
        try:
            if environment is None:
                environment = environment_class(class_path)(**settings)
            reply = ("ok", checked(command, environment.reset(argument) if command == "reset"
                                   else environment.step(argument)))
        except InvalidAction as error:
            reply = ("invalid", one_line(error))
        except Exception as error:  # noqa: BLE001 - any error of user code fails this trajectory only
            reply = ("error", one_line(error))
        try:
            connection.send(reply)
        except Exception as error:  # noqa: BLE001 - e.g. an EnvStep.info value that cannot be pickled
            connection.send(("error", f"cannot send the reply: {one_line(error)}"))


def checked(command: str, value: object) -> object:
    """The environment's return value, if it is what the interface promises."""
    wanted = str if command == "reset" else EnvStep
    if not isinstance(value, wanted):
        raise TypeError(f"{command} returned {type(value).__name__}, not {wanted.__name__}")
    return value


class EnvHost:
    """One environment process. Calls are sequential (a trajectory's turns); `kill` may come from any thread."""

    def __init__(self, process: multiprocessing.Process, connection: Connection) -> None:
        self.process = process
        self.connection = connection
        self.lock = threading.Lock()
        self.pid = process.pid or 0

    @classmethod
    def start(cls, class_path: str, settings: dict) -> "EnvHost":
        """A new process for one environment of `class_path(**settings)`, built at its first reset."""
        context = multiprocessing.get_context(START_METHOD)
        module = class_path.replace(":", ".").rpartition(".")[0]
        # Read when the server starts (the first call only). "__main__" too: the server imports the main module once,
        # so no environment process re-imports it (in a Ray actor that is Ray's worker script, seconds of imports).
        context.set_forkserver_preload(["__main__", __name__, module])
        parent_end, child_end = context.Pipe()
        process = context.Process(target=serve_environment, args=(child_end, class_path, settings), daemon=True,
                                  name=f"env:{class_path}")
        process.start()
        child_end.close()
        return cls(process, parent_end)

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

    def call(self, command: str, argument: object, timeout_s: float) -> tuple[str, object]:
        """("ok", value), ("invalid", message), or ("failed", EnvFailure); a failed process is killed."""
        with self.lock:
            try:
                self.connection.send((command, argument))
                if not self.connection.poll(timeout_s):
                    self.kill()
                    return "failed", EnvFailure(StopReason.TIMEOUT, f"{command} took over {timeout_s:g} s; "
                                                                    f"process {self.pid} killed")
                kind, value = self.connection.recv()
            except (EOFError, OSError):
                return "failed", EnvFailure(StopReason.ENV_ERROR, self.death_note())
        if kind == "error":
            return "failed", EnvFailure(StopReason.ENV_ERROR, f"{command} raised {value}")
        return kind, value

    def death_note(self) -> str:
        self.process.join(timeout=1.0)
        return f"environment process {self.pid} died (exit code {self.process.exitcode})"

    @property
    def is_alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        """SIGKILL the process and wait for it to be gone (any thread, any time)."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5.0)

    def close(self) -> None:
        """Let the environment close itself (at most CLOSE_TIMEOUT_S), then make sure the process is gone."""
        if self.lock.acquire(timeout=CLOSE_TIMEOUT_S):
            try:
                if self.process.is_alive():
                    self.connection.send(("close", None))
                    if self.connection.poll(CLOSE_TIMEOUT_S):
                        self.connection.recv()
            except (EOFError, OSError):
                pass
            finally:
                self.lock.release()
        self.kill()
        self.connection.close()


def start_and_reset(class_path: str, settings: dict, seed: int, timeout_s: float, retries: int,
                    backoff_s: float) -> tuple[EnvHost | None, ResetResult]:
    """Start an environment and reset it, trying again in a fresh process up to `retries` times, waiting
    backoff_s, 2 x backoff_s, ... between attempts. The host on success; None (every process gone) on failure."""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        host = EnvHost.start(class_path, settings)
        result = host.reset(seed, timeout_s)
        result = ResetResult(result.observation, result.seconds, result.failure, attempt + 1, result.pid)
        if result.failure is None:
            return host, result
        host.close()
    return None, result
