"""Watch one sandboxed process: feed stdin, read its output up to a bound, and enforce the wall clock.

The reader never holds more than `max_output_bytes` per stream: past it the run
is killed (the output is useless for scoring, and draining 1 GB would only burn
time). Killing is the caller's `kill` callback, so each backend decides what
"everything" means (a process group, a pid namespace).
"""
from __future__ import annotations

import os
import selectors
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

CHUNK = 65536
EXIT_GRACE_S = 0.5  # after the program exits, how long a leftover writer may keep its pipe open


@dataclass(frozen=True)
class Outcome:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    overflowed: bool
    duration_s: float


class BoundedBuffer:
    def __init__(self, limit: int) -> None:
        self.limit, self.data, self.truncated = limit, bytearray(), False

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        self.data += chunk[:room]
        self.truncated = self.truncated or len(chunk) > room


def feed_stdin(proc: subprocess.Popen, data: bytes) -> None:
    """In a thread, so a program that never reads stdin cannot deadlock the reader."""
    def write() -> None:
        try:
            proc.stdin.write(data)
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass
    threading.Thread(target=write, daemon=True).start()


def nonblocking_selector(fds: tuple[int, ...]) -> selectors.BaseSelector:
    """A selector over `fds`, each set non-blocking (a read returns what is there, never waits)."""
    selector = selectors.DefaultSelector()
    for fd in fds:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    return selector


def supervise(proc: subprocess.Popen, stdin: bytes, timeout_s: float, max_output_bytes: int,
              kill: Callable[[], None]) -> Outcome:
    started = time.monotonic()
    deadline = started + timeout_s
    feed_stdin(proc, stdin)
    fds = proc.stdout.fileno(), proc.stderr.fileno()
    buffers = {fd: BoundedBuffer(max_output_bytes) for fd in fds}
    selector = nonblocking_selector(fds)
    timed_out = overflowed = False
    exited_at = None
    while selector.get_map():
        now = time.monotonic()
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now > exited_at + EXIT_GRACE_S:
            break  # the program is gone; a straggler holding the pipe gets killed below
        if now >= deadline:
            timed_out = True
            break
        for key, _ in selector.select(timeout=min(0.05, deadline - now)):
            try:
                chunk = os.read(key.fd, CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                selector.unregister(key.fd)
                continue
            buffers[key.fd].add(chunk)
            overflowed = overflowed or buffers[key.fd].truncated
        if overflowed:
            break
    kill()
    returncode = proc.wait()
    duration = time.monotonic() - started
    selector.close()
    out, err = buffers[fds[0]], buffers[fds[1]]
    return Outcome(None if timed_out or overflowed else returncode, bytes(out.data), bytes(err.data),
                   out.truncated, err.truncated, timed_out, overflowed, duration)
