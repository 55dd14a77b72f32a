"""`vllm_kernel_scan.py`: the modules vLLM's start-up kernel scan would stop on are hidden while it runs and put
back after (no vLLM needed: the scan's `hasattr` is what is imitated, on a real module in `sys.modules`)."""
from __future__ import annotations

import sys
import types

import pytest

from tailflow.engines.rollout.vllm_kernel_scan import modules_hidden_from_vllm_scan, unscannable_modules


class Unbound:
    """Raises as Flask's `current_app` does outside an application context."""

    @property
    def __dict__(self):
        raise RuntimeError("Working outside of application context.")


@pytest.fixture
def proxy_module():
    module = types.ModuleType("tailflow_test_proxy_module")
    module.current_app = Unbound()
    sys.modules[module.__name__] = module
    yield module
    sys.modules.pop(module.__name__, None)


def test_a_module_holding_a_raising_value_is_hidden_during_the_scan_and_back_after(proxy_module):
    with pytest.raises(RuntimeError):
        hasattr(proxy_module.current_app, "__dict__")  # what vLLM's scan runs into
    # Flask's own modules are there too when an earlier test of the session started moto's server
    already_unscannable = {name for name in unscannable_modules() if name != proxy_module.__name__}
    assert unscannable_modules() == {proxy_module.__name__: proxy_module} | {
        name: sys.modules[name] for name in already_unscannable}
    with modules_hidden_from_vllm_scan() as hidden:
        assert set(hidden) == {proxy_module.__name__} | already_unscannable
        assert not set(hidden) & set(sys.modules)
        for module in list(sys.modules.values()):  # vLLM's scan, now without an error
            for value in list(getattr(module, "__dict__", {}).values()):
                hasattr(value, "__dict__")
    assert sys.modules[proxy_module.__name__] is proxy_module
    assert already_unscannable <= set(sys.modules)


def test_the_modules_come_back_when_the_engine_fails_to_start(proxy_module):
    with pytest.raises(ValueError), modules_hidden_from_vllm_scan():
        raise ValueError("engine start failed")
    assert sys.modules[proxy_module.__name__] is proxy_module
