"""The first code that runs inside a sandbox, as root, before the program: limits, drop to nobody, run it.

Stdlib only, with no `from __future__` line: it is pasted as source
(`python -I -S -c`), because nothing of the project is visible inside the
sandbox. `bwrap` runs it as the command of its sandbox (`--launch SPEC`); the
`process` backend's jail (`jail.py`, pasted after this file) forks the program
through `run_program_here`. Without namespaces, `apply_limits` is also used
from the parent's preexec_fn. The spec is `marshal` data in hex (`encode_spec`):
the same interpreter writes and reads it, and `json` would cost the sandbox's
start-up an import of `re`. The program runs in this same interpreter (as
`__main__`, after the drop) rather than in a second one started by exec: one
interpreter start-up per sandbox instead of two.

Dropping privileges: no supplementary groups, uid/gid 65534 (a uid change from
0 clears every capability). bubblewrap has already set no_new_privs, and its
namespace init dies with the caller; the jail, PID 1 of its namespace, sets
both itself (`jail.py`). Unprivileged (bwrap in a user namespace) the uid is
already 65534 there and nothing is dropped.
"""
import marshal
import os
import resource
import sys

NOBODY = 65534


def encode_spec(spec):
    return marshal.dumps(spec).hex()


def decode_spec(text):
    return marshal.loads(bytes.fromhex(text))


def apply_limits(limits):
    """Kernel rlimits for the untrusted process (inherited by everything it forks). `nproc` is the per-uid
    process limit: the sandbox's own count where no cgroup bounds it, a backstop where one does."""
    cpu = int(limits["cpu_time_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    nproc = int(limits["nproc"])
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["max_file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def drop_to_nobody():
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)


def run_program_here(spec):
    """Become the program: its dir, its limits, no inherited descriptors beyond stdin/stdout/stderr, then run
    `main.py` as `__main__` (an uncaught exception exits 1 with its traceback, as `python main.py` would)."""
    os.chdir(spec["scratch"])
    apply_limits(spec["limits"])
    os.closerange(3, 65536)
    program = os.path.join(spec["scratch"], "main.py")
    with open(program, "rb") as file:
        code = compile(file.read(), program, "exec")
    main = type(sys)("__main__")
    main.__file__, main.__builtins__ = program, __builtins__
    sys.modules["__main__"], sys.argv = main, [program]
    exec(code, main.__dict__)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--launch":
    drop_to_nobody()
    run_program_here(decode_spec(sys.argv[2]))
