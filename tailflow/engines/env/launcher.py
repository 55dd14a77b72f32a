"""The process side of environments: a launcher that forks one process per environment, and that process's loop.

Why a launcher of our own. The host is usually a Ray actor, a process with threads, and `fork` from a threaded
process copies locks other threads may hold at that instant (a child can deadlock on its first allocation or log
line). `spawn` is safe but pays a fresh interpreter and its imports per environment. multiprocessing's
`forkserver` is the right idea, but every child it starts re-runs the parent's main module first (its `__main__`
preload is never passed to the server in Python 3.11), and in a Ray actor that is Ray's worker script: measured
~330 ms per environment here. So each host starts one small single-threaded launcher with `subprocess` (which
execs, safe from any thread), the launcher imports this package and the environment's module once, and each
environment is forked from it. Measured 2026-11-28 on this machine's 2 shared cores, calculator environments:
start + first reset 4 ms median in-process, 5 ms through a Ray actor call (32 at once: 86 ms); the launcher's own
start ~50 ms, once per host.

Nothing outlives the host: the launcher exits when its control socket to the host reads end-of-file (the host
exited or was SIGKILLed: the kernel closes the socket either way), and each environment process asks the kernel
(prctl PR_SET_PDEATHSIG) for SIGKILL when the launcher, its parent, exits.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import pickle
import signal
import socket
import struct
import sys
import time
from multiprocessing.connection import Connection

from tailflow.engines.env.environment import EnvStep, InvalidAction, environment_class

PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""
MAX_REQUEST_BYTES = 1 << 20
"""The largest (class path, settings) request: settings are plain constructor arguments."""
PID = struct.Struct("q")


def die_with_parent() -> None:
    """SIGKILL this process when its parent exits; exit now if the parent already has."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def reap_children(*_: object) -> None:
    """SIGCHLD: collect every finished environment process, so none stays a zombie."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def serve_launches(control_fd: int) -> None:
    """The launcher's loop: each request on the control socket is (class path, settings) plus one socket, the
    environment's end of its pipe; fork a process to serve it and answer its pid. Ends at end-of-file."""
    control = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGCHLD, reap_children)
    while True:
        payload, fds, _, _ = socket.recv_fds(control, MAX_REQUEST_BYTES, 1)
        if not payload:
            return  # the host is gone: exiting takes every environment process with it (PDEATHSIG)
        class_path, settings = pickle.loads(payload)
        try:
            importlib.import_module(class_path.replace(":", ".").rpartition(".")[0])  # once, not per fork
        except Exception:  # noqa: BLE001 - the environment process reports it at its first reset
            pass
        pid = os.fork()
        if pid == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                die_with_parent()
                serve_environment(Connection(fds[0]), class_path, settings)
            finally:
                os._exit(0)
        os.close(fds[0])
        control.send(PID.pack(pid))


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


def serve_environment(connection: Connection, class_path: str, settings: dict) -> None:
    """An environment process's loop: build the environment at the first reset, answer each call, stop at
    `close` or end-of-file. Replies are ("ok", value), ("invalid", message) or ("error", message)."""
    environment = None
    while True:
        try:
            command, argument = connection.recv()
        except (EOFError, OSError):
            return
        if command == "sleep":  # an injected delay (engines/env/faults.py): this process is the slow one
            time.sleep(argument)
            connection.send(("ok", None))
            continue
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


if __name__ == "__main__":
    serve_launches(int(sys.argv[1]))
