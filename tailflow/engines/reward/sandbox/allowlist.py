"""What a sandbox can read: the interpreter, its standard library and the shared libraries they load. Nothing else.

Both namespace backends (`bwrap`, and `process` as root) start the program
from an empty root and bind back, read-only and at the same path, only the
paths of `read_only_view` (docs/rewards.md, "What the sandbox enforces",
describes the whole tree the program sees): the interpreter binary, the
standard library directory (`site-packages` under it hidden), and the shared
libraries the interpreter and the standard library's extension modules link
against, found with `ldd` (without it, a libc other than glibc, the
directories holding them). The libraries of one host directory are gathered
(hard links, else copies) into a directory of their own, which is bound over
that directory: one mount instead of one per file (each mount costs the
sandbox's start about a millisecond). Both the gathered directories and the
view itself are cached in a root-only directory under the temp dir (`ldd`
over the standard library's extension modules took 2 to 11 s on this loaded
machine), keyed by the interpreter's, the extension modules' and the loader
cache's file versions.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass

SANDBOX_DIR = "/tmp/sandbox"
"""The program's private writable directory inside the sandbox (its cwd, HOME and TMPDIR)."""
SCRATCH_FILES = 4
"""The scratch tmpfs holds this many files of the largest size one file may have."""
FALLBACK_LIBRARY_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64")
LOADER_CACHE = "/etc/ld.so.cache"
"""Rewritten by ldconfig whenever libraries are installed or upgraded: part of the view cache's key."""


@dataclass(frozen=True)
class ReadOnlyView:
    """Read-only binds (host source, path in the sandbox), and directories among them hidden again under an
    empty read-only tmpfs (`masked`)."""

    binds: tuple[tuple[str, str], ...]
    masked: tuple[str, ...]


def interpreter() -> str:
    """The interpreter the sandbox runs (a venv's `python` resolved to the real binary, whose prefix holds the
    standard library)."""
    return os.path.realpath(sys.executable)


def scratch_bytes(max_file_bytes: int) -> int:
    """Size of the private writable dir: a few files of the largest size one file may have."""
    return SCRATCH_FILES * max_file_bytes


def standard_library() -> str:
    import sysconfig  # here, not at the top: a test runner that is handed its view never needs it

    return os.path.realpath(sysconfig.get_paths()["stdlib"])


def package_dirs_under(directory: str) -> list[str]:
    """Installed-package trees inside `directory` (site-packages / dist-packages): hidden in the sandbox."""
    import site
    import sysconfig

    candidates = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    found = {os.path.realpath(path) for path in candidates}
    found.update(glob.glob(os.path.join(directory, "*-packages")))
    return sorted(path for path in found if os.path.isdir(path) and path.startswith(directory + os.sep))


def shared_libraries(binaries: list[str]) -> list[str]:
    """Every shared library `binaries` load, as `ldd` resolves them on this host (one call for all)."""
    if not binaries:
        return []
    listing = subprocess.run(["ldd", *binaries], capture_output=True, text=True, timeout=60).stdout
    libraries = set()
    for line in listing.splitlines():
        for word in line.split():
            if word.startswith("/") and not word.endswith(":") and os.path.exists(word):
                libraries.add(word)
    return sorted(libraries - set(binaries))


def file_version(path: str) -> str:
    """`path` and what changes when the file is replaced or rewritten: a part of a cache key (OSError if absent)."""
    info = os.stat(path)
    return f"{path}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns};"


@functools.cache
def read_only_view() -> ReadOnlyView:
    """The read-only part of every sandbox on this host, once per process: from the host's cache where this
    host's interpreter and libraries have not changed since, else computed (and cached)."""
    executable, stdlib = interpreter(), standard_library()
    extensions = sorted(glob.glob(os.path.join(stdlib, "lib-dynload", "*.so")))
    digest = hashlib.sha256()
    for path in (executable, LOADER_CACHE, *extensions):
        try:
            digest.update(file_version(path).encode())
        except OSError:
            digest.update(f"{path}:absent;".encode())
    try:
        cached = os.path.join(cache_home(), f"view-{digest.hexdigest()[:24]}.json")
    except OSError:
        return view_of(executable, stdlib, extensions)
    try:
        with open(cached) as file:
            data = json.load(file)
        view = ReadOnlyView(tuple((source, target) for source, target in data["binds"]), tuple(data["masked"]))
        if all(os.path.exists(source) for source, _ in view.binds):
            return view
    except (OSError, ValueError, KeyError, TypeError):
        pass
    view = view_of(executable, stdlib, extensions)
    staging = f"{cached}.{os.getpid()}"
    with open(staging, "w") as file:
        json.dump(asdict(view), file)
    os.replace(staging, cached)
    return view


def view_of(executable: str, stdlib: str, extensions: list[str]) -> ReadOnlyView:
    """The read-only part of every sandbox on this host: the interpreter, its standard library, its libraries."""
    masked = package_dirs_under(stdlib)
    binds = [(executable, executable), (stdlib, stdlib)]
    if shutil.which("ldd"):
        libraries = [path for path in shared_libraries([executable, *extensions])
                     if not path.startswith(stdlib + os.sep)]
        binds += library_binds(libraries)
    else:
        binds += [(path, path) for path in FALLBACK_LIBRARY_DIRS if os.path.isdir(path)]
        masked += sorted(glob.glob(os.path.join("/usr/lib", "python3*", "*-packages")))
    return ReadOnlyView(binds=tuple(dict.fromkeys(binds)), masked=tuple(masked))


def library_binds(libraries: list[str]) -> list[tuple[str, str]]:
    """One bind per library directory (its needed files gathered), one per file where gathering fails."""
    by_directory: dict[str, list[str]] = {}
    for path in libraries:
        by_directory.setdefault(os.path.dirname(path), []).append(path)
    binds = []
    for directory, files in by_directory.items():
        try:
            binds.append((gathered(files), directory) if len(files) > 1 else (files[0], files[0]))
        except OSError:
            binds += [(path, path) for path in files]
    return binds


def cache_home() -> str:
    """The cache directory, made if missing; refused (PermissionError) unless it is ours alone."""
    home = os.path.join(tempfile.gettempdir(), f"tailflow-sandbox-cache-{os.geteuid()}")
    os.makedirs(home, mode=0o755, exist_ok=True)
    info = os.stat(home, follow_symlinks=False)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022 or not os.path.isdir(home):
        raise PermissionError(f"{home} is not ours alone")
    return home


def gathered(files: list[str]) -> str:
    """A read-only directory holding exactly `files` (by base name), made once per host and file versions."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(file_version(path).encode())
    home = cache_home()
    final = os.path.join(home, digest.hexdigest()[:24])
    if os.path.isdir(final):
        return final
    staging = tempfile.mkdtemp(dir=home)
    for path in files:
        target = os.path.join(staging, os.path.basename(path))
        try:
            os.link(os.path.realpath(path), target)
        except OSError:  # another filesystem: a copy
            shutil.copy2(path, target)
    os.chmod(staging, 0o755)
    try:
        os.rename(staging, final)
    except OSError:  # another process made it first
        shutil.rmtree(staging, ignore_errors=True)
    return final
