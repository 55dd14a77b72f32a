"""The code reward: a response's program against a problem's tests, with the tests out of the program's reach.

`reward.py` scores (`CodeReward`); `verdict.py` is the test runner, a process
of its own that holds the tests and decides; `remote.py` is its view of the
program (proxies that bring back plain data); `wire.py` is that plain-data
format; `serve.py` is what runs beside the program inside the sandbox.
"""
from tailflow.engines.reward.code.reward import CodeReward, extract_program, same_output

__all__ = ["CodeReward", "extract_program", "same_output"]
