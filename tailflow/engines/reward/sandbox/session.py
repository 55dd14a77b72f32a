"""A sandboxed program that stays up and answers: one request line in, one reply line out.

Code tests need this: the tests run on the trusted side and call into the
program many times, each call's result deciding what the test does next.
The session is the same sandbox as a one-shot run (same backend, same
`SandboxLimits`, the same kill of the whole process tree); what differs is
that stdin and stdout are a conversation; the clock is the test runner's
(`verdict.timed`), outside the sandbox, where the program cannot reach it.
The program's stderr is drained in a thread and discarded, so a program
that prints without end can neither block nor bloat this side.
"""
from __future__ import annotations

import os
import selectors
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tailflow.engines.reward.sandbox.records import SandboxLimits
from tailflow.engines.reward.sandbox.supervise import CHUNK


@dataclass(frozen=True)
class Reply:
    """One answer: `line` when `status` is "ok"; else "timeout" (killed), "closed" (the program is gone)
    or "overflow" (a reply longer than the output bound; killed)."""

    status: str
    line: str


class SandboxSession:
    def __init__(self, code: str, limits: SandboxLimits, backend: str) -> None:
        from tailflow.engines.reward.sandbox import launch, resolve_backend

        self.limits = limits
        self.workdir = tempfile.TemporaryDirectory(prefix="tailflow-session-")
        Path(self.workdir.name, "main.py").write_text(code)
        self.launched = launch(resolve_backend(backend), self.workdir.name, limits, die_with_parent=True)
        self.proc = self.launched.proc
        self.drainer = threading.Thread(target=self._drain_stderr, daemon=True)
        self.drainer.start()
        self.pending = bytearray()
        self.is_closed = False
        for stream in (self.proc.stdin, self.proc.stdout):
            os.set_blocking(stream.fileno(), False)

    def _drain_stderr(self) -> None:
        try:
            while self.proc.stderr.read1(CHUNK):
                pass
        except (OSError, ValueError):
            pass  # closed under us: the session is over

    def ask(self, line: str, timeout_s: float) -> Reply:
        """Send one line, wait for one line back; on timeout or overflow the session is killed."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        status = "closed" if self.is_closed else self._exchange(line.encode(), deadline)
        if status != "ok":
            self.close()
            return Reply(status, "")
        newline = self.pending.index(b"\n")
        reply = bytes(self.pending[:newline]).decode("utf-8", errors="replace")
        del self.pending[:newline + 1]
        return Reply("ok", reply)

    def _exchange(self, payload: bytes, deadline: float) -> str:
        out_fd, in_fd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            if payload:
                selector.register(out_fd, selectors.EVENT_WRITE)
            selector.register(in_fd, selectors.EVENT_READ)
            while b"\n" not in self.pending:
                now = time.monotonic()
                if now >= deadline:
                    return "timeout"
                for key, _ in selector.select(timeout=deadline - now):
                    try:
                        if key.fd == out_fd:
                            payload = payload[os.write(out_fd, payload):]
                            if not payload:
                                selector.unregister(out_fd)
                            continue
                        chunk = os.read(in_fd, CHUNK)
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        return "closed"
                    if not chunk:
                        return "closed"
                    self.pending += chunk
                    if len(self.pending) > self.limits.max_output_bytes:
                        return "overflow"
        return "ok"

    def close(self) -> None:
        """Kill everything in the sandbox and remove its files; idempotent."""
        if self.is_closed:
            return
        self.is_closed = True
        self.launched.end()
        self.drainer.join(timeout=5)
        self.proc.stderr.close()
        self.workdir.cleanup()

