"""The inside of the `process` sandbox: PID 1 of fresh namespaces, which builds an empty root and starts the program.

Pasted after `inner.py` and run as `python3 -I -S -c SOURCE SPEC` by
`unshare --net --pid --ipc --uts --cgroup --fork --mount-proc --mount` as root
(stdlib only, no `from __future__` line). In its own mount namespace it
mounts a small tmpfs as the new root, binds into it read-only only the
allowlisted paths (`allowlist.py`: the interpreter, the standard library
with site-packages hidden, the shared libraries), a fresh `/proc`, a minimal
`/dev` and the size-bounded scratch tmpfs holding `main.py`, makes the root
read-only, moves it over `/` and chroots into it. Then it drops to uid/gid
65534 and forks the program (`inner.run_program_here`). Staying PID 1 (instead of exec-ing the program)
matters: the kernel protects PID 1 from signals sent inside the namespace,
and when PID 1 exits every process in the namespace is killed, so a daemon
that double-forks and setsid()s cannot outlive the run. Its exit code is the
program's, or 128+signal.
"""
import ctypes

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = 1, 2, 4, 8, 32, 4096, 8192, 16384
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, SIGKILL = 1, 38, 9
DEVICES = ("null", "zero", "full", "random", "urandom")
ROOT_TMPFS = "size=1m,nr_inodes=4096,mode=755"
libc = ctypes.CDLL(None, use_errno=True)


def mount(source, target, fstype, flags, data=None):
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        raise OSError(ctypes.get_errno(), "mount " + target + ": " + os.strerror(ctypes.get_errno()))


def bind_read_only(source, target, flags=MS_NOSUID | MS_NODEV):
    """`source` (a file or a dir, symlinks followed) at `target`, read-only."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        open(target, "w").close()
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)


def make_dev(root):
    """A tiny /dev: the harmless character devices bound from the host, and the usual fd links."""
    dev = root + "/dev"
    os.makedirs(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID, "size=64k,nr_inodes=64,mode=755")
    for name in DEVICES:
        open(dev + "/" + name, "w").close()
        mount("/dev/" + name, dev + "/" + name, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, dev + "/" + name)


def build_root(spec, code):
    """The new root at `spec["root"]`: allowlisted paths, /proc, /dev and the scratch dir with the program."""
    root = spec["root"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, ROOT_TMPFS)
    for source, target in spec["binds"]:
        bind_read_only(source, root + target)
    for path in spec["masked"]:
        mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,mode=755")
    os.makedirs(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    make_dev(root)
    scratch = root + spec["scratch"]
    os.makedirs(scratch)
    mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV,
          "size=%d,nr_inodes=4096,mode=700" % spec["scratch_bytes"])
    os.chown(scratch, NOBODY, NOBODY)
    with open(scratch + "/main.py", "wb") as file:
        file.write(code)
    os.chmod(scratch + "/main.py", 0o444)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def enter_root(root):
    """Move the new root over `/` and chroot into it: the host's tree is no longer reachable by path."""
    os.chdir(root)
    mount(root, "/", None, MS_MOVE)
    os.chroot(".")
    os.chdir("/")


def drop_privileges():
    """To nobody, with no_new_privs; and the parent-death signal again (the uid change cleared unshare's)."""
    drop_to_nobody()
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)


def run_program(spec):
    """Fork the program, reap every orphan (we are init), return its exit code or 128+signal. The child leaves
    through the interpreter's own exit (an uncaught exception, `sys.exit`, or the end of the program), so it
    exits as `python main.py` would: threads joined, output flushed, the traceback printed."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        run_program_here(spec)
        sys.exit(0)
    while True:
        reaped, status = os.waitpid(-1, 0)
        if reaped == pid:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main():
    spec = decode_spec(sys.argv[1])
    with open(spec["code_path"], "rb") as file:
        code = file.read()
    os.umask(0o022)
    build_root(spec, code)
    enter_root(spec["root"])
    drop_privileges()
    return run_program(spec)


if __name__ == "__main__":
    sys.exit(main())
