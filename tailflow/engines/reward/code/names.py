"""Which of the program's names the tests see: exactly those the tests use and do not define themselves.

The test code (the asserts, the test module and every function in them) is
compiled here and its global lookups read off the bytecode (`LOAD_GLOBAL`,
`LOAD_NAME`). A name it looks up but never binds itself (by an import, a
`def`, an assignment) and that is not a builtin is a name the task exposes:
the entry point, the class, `add` in `assert add(1, 2) == 3`. Only those of
the program's names enter the tests' globals, and `from solution import *`
gives only those (the proxy module's `__all__`); the builtins the tests see
are the runner's own copy. Why, and what an explicit `from solution import
helper` still reaches: docs/rewards.md, "What the tests see of the program".
"""
from __future__ import annotations

import builtins
import dis
import types

LOADS = ("LOAD_GLOBAL", "LOAD_NAME")
BINDS = ("STORE_NAME", "STORE_GLOBAL", "DELETE_NAME", "DELETE_GLOBAL")


def global_names(codes: list[types.CodeType]) -> tuple[set[str], set[str]]:
    """(names looked up as globals, names bound as globals) anywhere in `codes` and the code nested in them."""
    loaded: set[str] = set()
    bound: set[str] = set()
    stack = list(codes)
    while stack:
        code = stack.pop()
        for instruction in dis.get_instructions(code):
            if instruction.opname in LOADS:
                loaded.add(instruction.argval)
            elif instruction.opname in BINDS:
                bound.add(instruction.argval)
        stack.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return loaded, bound


def exposed_names(codes: list[types.CodeType]) -> frozenset[str]:
    """The program's names the tests may see: used by the tests, bound by none of them, not builtins."""
    loaded, bound = global_names(codes)
    return frozenset(name for name in loaded - bound - set(vars(builtins))
                     if not (name.startswith("__") and name.endswith("__")))


def test_namespace(solution: types.ModuleType, exposed: frozenset[str]) -> dict:
    """Globals for trusted test code: the runner's builtins (whose `import solution` gives the proxy module)
    and the exposed names the program defines; `from solution import *` gives the same names."""
    real_import = builtins.__import__

    def import_hook(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "solution" and level == 0:
            return solution
        return real_import(name, globals, locals, fromlist, level)

    names = {name: getattr(solution, name) for name in sorted(exposed) if name in vars(solution)}
    solution.__all__ = list(names)
    return {"__name__": "tests", "__builtins__": dict(vars(builtins), __import__=import_hook), **names}
