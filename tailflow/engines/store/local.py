"""The artifact store: where a run's config, metrics and checkpoints live.

Keys are '/'-separated paths relative to the store's root (`<run_id>/config.yaml`).
A local folder is the default; the S3 store (s3.py) implements the same methods,
so the flows never know which one they write to. Writes are atomic (temp file, fsync,
rename): a reader never sees half a file.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it; done once, at import, before any threads write
    os.umask(mask)
    return mask


PROCESS_UMASK = _read_umask()


def _fsync_dir(path: str | Path) -> None:
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def sha256_of_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class StoreError(OSError):
    pass


class StoreAccessError(StoreError):
    """The store refuses this process: no credentials, wrong ones, no permission, or no such bucket. Unlike an
    outage, waiting does not help: the credentials or `storage.uri` must change."""


@dataclass(frozen=True)
class Versioned:
    """An object read for a conditional write: its bytes, the tag a write must match, and its age by the
    store's own clock (S3: the server's Date minus LastModified; local: now minus mtime), so no reader
    compares its clock with the writer's."""
    data: bytes
    tag: str
    age_s: float


class LocalStore:
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()

    def path(self, key: str) -> Path:
        target = (self.root / key).resolve()
        if target != self.root and self.root not in target.parents:
            raise StoreError(f"key {key!r} escapes the store root {self.root}")
        return target

    def uri(self, key: str = "") -> str:
        return str(self.path(key)) if key else str(self.root)

    def exists(self, key: str) -> bool:
        return self.path(key).exists()

    def write_bytes(self, key: str, data: bytes) -> None:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            os.fchmod(handle, 0o666 & ~PROCESS_UMASK)  # mkstemp makes 0600; a store file is an ordinary file
            with os.fdopen(handle, "wb") as temp:
                temp.write(data)
                temp.flush()
                os.fsync(temp.fileno())
            os.replace(temp_name, target)
            _fsync_dir(target.parent)  # the rename itself survives a power loss
        except BaseException:
            Path(temp_name).unlink(missing_ok=True)
            raise

    def write_text(self, key: str, text: str) -> None:
        self.write_bytes(key, text.encode())

    def read_bytes(self, key: str) -> bytes:
        target = self.path(key)
        if not target.is_file():
            raise FileNotFoundError(f"{target} does not exist in the artifact store")
        return target.read_bytes()

    def read_text(self, key: str) -> str:
        return self.read_bytes(key).decode()

    def read_lines(self, key: str) -> Iterator[str]:
        """The file's lines, one at a time: a reader of a file that grows with the run (metrics.jsonl) holds a
        line, not the file."""
        target = self.path(key)
        if not target.is_file():
            raise FileNotFoundError(f"{target} does not exist in the artifact store")
        with open(target, encoding="utf-8") as handle:
            yield from handle

    def append_line(self, key: str, line: str) -> None:
        """Append one line (a JSONL row); flushed and fsynced before returning."""
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a") as handle:
            handle.write(line.rstrip("\n") + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def put_dir(self, key: str, local_dir: str | Path) -> None:
        """Copy a local directory under `key`, replacing what was there, atomically: every file is fsynced in
        a hidden staging directory, which is then renamed into place (a power loss cannot leave a named but
        empty checkpoint behind a later commit)."""
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        try:
            shutil.copytree(local_dir, staging, dirs_exist_ok=True)
            for folder, _, files in os.walk(staging):
                os.chmod(folder, 0o777 & ~PROCESS_UMASK)  # mkdtemp makes 0700; store folders are ordinary ones
                for name in files:
                    path = os.path.join(folder, name)
                    os.chmod(path, 0o666 & ~PROCESS_UMASK)
                    with open(path, "rb") as handle:
                        os.fsync(handle.fileno())
                _fsync_dir(folder)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
            _fsync_dir(target.parent)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def has_dir(self, key: str) -> bool:
        """A complete directory stored by `put_dir` (atomic here: the rename is the commit)."""
        return self.path(key).is_dir()

    def local_dir(self, key: str) -> Path:
        """A local path holding the directory at `key` (here: the directory itself)."""
        target = self.path(key)
        if not target.is_dir():
            raise FileNotFoundError(f"{target} is not a directory in the artifact store")
        return target

    def delete_prefix(self, key: str) -> None:
        """Remove the directory at `key` and all it holds (checkpoint retention); missing is fine."""
        target = self.path(key)
        if not key.strip("/") or target == self.root:
            raise StoreError(f"refusing to delete the whole store {self.root}")
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            raise StoreError(f"{target} is a file, not a directory; delete_prefix removes directories")

    def list_dir(self, key: str = "") -> list[str]:
        target = self.path(key) if key else self.root
        if not target.is_dir():
            return []
        return sorted(entry.name for entry in target.iterdir() if not entry.name.startswith("."))

    def list_files(self, key: str = "") -> list[str]:
        """Every file under `key`, as paths relative to it, sorted; hidden names (and what is under them)
        skipped."""
        target = self.path(key) if key else self.root
        if not target.is_dir():
            return []
        found = (path.relative_to(target) for path in target.rglob("*") if path.is_file())
        return sorted(str(path) for path in found if not any(part.startswith(".") for part in path.parts))


    # -- conditional writes (the run lease, engines/runs/lease.py) ------------------------------------
    # Local files have no ETags: the tag is the content's sha256, and check-then-write runs under an
    # flock on a sidecar file, so two processes on this host (or on an NFS mount with working locks)
    # cannot both win.

    @contextmanager
    def _locked(self, key: str) -> Iterator[Path]:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{target.name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield target

    def read_versioned(self, key: str) -> Versioned | None:
        target = self.path(key)
        try:
            data, mtime = target.read_bytes(), target.stat().st_mtime
        except FileNotFoundError:
            return None
        return Versioned(data, hashlib.sha256(data).hexdigest(), max(0.0, time.time() - mtime))

    def create_if_absent(self, key: str, data: bytes) -> str | None:
        """Write `key` only if nothing is there; its tag, or None when it exists."""
        with self._locked(key) as target:
            if target.exists():
                return None
            self.write_bytes(key, data)
        return hashlib.sha256(data).hexdigest()

    def replace_if(self, key: str, data: bytes, tag: str) -> str | None:
        """Overwrite `key` only if it still holds what `tag` names; the new tag, or None."""
        with self._locked(key):
            current = self.read_versioned(key)
            if current is None or current.tag != tag:
                return None
            self.write_bytes(key, data)
        return hashlib.sha256(data).hexdigest()

    def delete_if(self, key: str, tag: str) -> bool:
        with self._locked(key) as target:
            current = self.read_versioned(key)
            if current is None or current.tag != tag:
                return False
            target.unlink()
        return True
