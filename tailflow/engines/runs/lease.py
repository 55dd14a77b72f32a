"""One writer per run: a lease object in the artifact store itself, held for the whole run.

Two processes writing one run (two `tailflow resume`s, a flow run and a CLI
run, a schedule firing during a resume) would interleave metrics rows and
race on `latest.json`. How the lease is taken and renewed, when a dead holder's
lease goes stale, and what it does and does not guarantee:
docs/operations.md#one-writer-per-run.
"""
from __future__ import annotations

import getpass
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel, ConfigDict

from tailflow.config import ConfigError
from tailflow.engines.runs.layout import lease_key

LEASE_TIMEOUT_S = 60.0
"""A lease not renewed for this long is free to take (holder on another host, or of unknown liveness)."""
HEARTBEAT_S = 10.0
"""How often the holder renews its lease."""

log = logging.getLogger("tailflow.lease")


class RunBusyError(ConfigError):
    """Another live writer holds the run (no retry helps: the other writer is doing the work)."""


class LeaseLostError(RuntimeError):
    """This process held the run's lease and no longer does (taken over, or expired while stalled)."""


class Lease(BaseModel):
    """The content of `.leases/<run_id>.json`."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    holder: str
    """Who writes: user and what runs (e.g. `alice: flow run run-x (3f2a...)`)."""
    host: str
    boot_id: str
    """The kernel's boot id: with `host`, tells whether `pid` can be checked here."""
    pid: int
    pid_started: int
    """The process's start time in clock ticks since boot (/proc/<pid>/stat): a reused pid does not match."""
    token: str
    acquired_at: float
    heartbeat_at: float
    """The holder's clock, for people; staleness uses the store's clock (the object's age)."""
    timeout_s: float
    flow_run_id: str | None = None
    """The orchestrator's run that holds it (a Prefect flow run id): marked Crashed when its lease is taken."""

    def describe(self) -> str:
        return f"{self.holder} (pid {self.pid} on {self.host})"


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_started(pid: int) -> int | None:
    """Start time of `pid` in ticks since boot; None when there is no such process (or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def stale_reason(lease: Lease, age_s: float) -> str | None:
    """Why `lease` may be taken without asking (None: its holder may be alive)."""
    if lease.host == socket.gethostname() and lease.boot_id and lease.boot_id == boot_id():
        if process_started(lease.pid) != lease.pid_started:
            return f"its process {lease.pid} on {lease.host} is gone"
        return None
    if age_s > lease.timeout_s:
        return f"no heartbeat for {age_s:.0f}s (timeout {lease.timeout_s:.0f}s)"
    return None


def new_lease(run_id: str, holder: str, timeout_s: float, flow_run_id: str | None = None) -> Lease:
    now = time.time()
    return Lease(run_id=run_id, holder=f"{getpass.getuser()}: {holder}", host=socket.gethostname(),
                 boot_id=boot_id(), pid=os.getpid(), pid_started=process_started(os.getpid()) or 0,
                 token=uuid.uuid4().hex, acquired_at=now, heartbeat_at=now, timeout_s=timeout_s,
                 flow_run_id=flow_run_id)


def read_lease(store: Any, run_id: str) -> tuple[Lease, float] | None:
    """The run's lease and its age in seconds, or None when nobody holds it."""
    current = store.read_versioned(lease_key(run_id))
    return None if current is None else (Lease.model_validate_json(current.data), current.age_s)


class HeldLease:
    """A lease this process holds: renewed by a daemon thread until `release`."""

    def __init__(self, store: Any, lease: Lease, tag: str, heartbeat_s: float, taken_from: Lease | None = None):
        self.store, self.lease, self.tag, self.heartbeat_s = store, lease, tag, heartbeat_s
        self.taken_from = taken_from
        """The previous holder's lease when this one was taken from a dead (or, with take_over, live) holder."""
        self.key = lease_key(lease.run_id)
        self.lost: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{lease.run_id}", daemon=True)
        self._thread.start()

    def renew(self) -> bool:
        """One heartbeat; False (and `lost` says why) when the lease is no longer ours."""
        with self._lock:
            if self.lost:
                return False
            renewed = self.lease.model_copy(update={"heartbeat_at": time.time()})
            tag = self.store.replace_if(self.key, renewed.model_dump_json(indent=1).encode(), self.tag)
            if tag is None:
                current = read_lease(self.store, self.lease.run_id)
                self.lost = (f"run {self.lease.run_id}: the lease was taken by {current[0].describe()}"
                             if current else f"run {self.lease.run_id}: the lease was removed")
                log.error("%s; this process stops writing at the next iteration", self.lost)
                return False
            self.lease, self.tag = renewed, tag
            return True

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if not self.renew():
                    return
            except OSError as error:  # a store outage: keep trying; past timeout_s others may take over
                log.warning("run %s: lease heartbeat failed: %s", self.lease.run_id, error)

    def check(self) -> None:
        """Raise LeaseLostError if another writer took the run (called between iterations)."""
        if self.lost:
            raise LeaseLostError(self.lost)

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours. A store that cannot be reached now leaves
        it behind: it is then freed as a dead holder's (at once on this host, after timeout_s elsewhere)."""
        self._stop.set()
        self._thread.join(timeout=30)
        with self._lock:
            if not self.lost:
                try:
                    self.store.delete_if(self.key, self.tag)
                except OSError as error:  # do not hide the run's own outcome behind a cleanup failure
                    log.warning("run %s: could not release the lease: %s", self.lease.run_id, error)


def acquire_lease(store: Any, run_id: str, holder: str, take_over: bool = False, flow_run_id: str | None = None,
                  timeout_s: float = LEASE_TIMEOUT_S, heartbeat_s: float = HEARTBEAT_S) -> HeldLease:
    """Take the run's lease, or raise RunBusyError naming its live holder."""
    key = lease_key(run_id)
    mine = new_lease(run_id, holder, timeout_s, flow_run_id)
    data = mine.model_dump_json(indent=1).encode()
    for _ in range(5):  # each pass either wins, or saw someone else's write land first
        tag = store.create_if_absent(key, data)
        if tag is not None:
            return HeldLease(store, mine, tag, heartbeat_s)
        current = store.read_versioned(key)
        if current is None:
            continue  # released between our two calls
        other = Lease.model_validate_json(current.data)
        reason = stale_reason(other, current.age_s)
        if reason is None and not take_over:
            raise RunBusyError(
                f"run {run_id} is being written by {other.describe()}, last heartbeat {current.age_s:.0f}s ago; "
                f"wait for it to finish or stop it. If it is dead, its lease frees itself after "
                f"{other.timeout_s:.0f}s without a heartbeat, or take over now with --take-over")
        tag = store.replace_if(key, data, current.tag)
        if tag is not None:
            log.warning("run %s: took the lease from %s (%s)", run_id, other.describe(),
                        reason or "--take-over")
            return HeldLease(store, mine, tag, heartbeat_s, taken_from=other)
    raise RunBusyError(f"run {run_id}: other writers kept taking the lease; try again")


@contextmanager
def hold_lease(store: Any, run_id: str, holder: str, take_over: bool = False, flow_run_id: str | None = None,
               **options: float) -> Iterator[HeldLease]:
    held = acquire_lease(store, run_id, holder, take_over, flow_run_id, **options)
    try:
        yield held
    finally:
        held.release()
