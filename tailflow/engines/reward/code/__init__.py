"""The code reward: a response's program against a problem's tests, with the tests out of the program's reach.

`reward.py` scores (`CodeReward`); `runner.py` starts the test runner,
`verdict.py`, a process of its own that holds the tests and decides
(`names.py`: what of the program the tests see; `testcalls.py`: how a test
function is called; `errors.py`: what the program's exceptions become;
`passes.py`: which passes count); `remote.py` is its view of the program
(proxies that bring back plain data; `handles.py`: what a test may do with an
object of the program's); `wire.py` is that plain-data format; `serve.py` is
what runs beside the program inside the sandbox; `extract.py` finds the
program in the response.

The names below load on first use: the test runner is a short-lived process
that imports this package, and needs none of the scoring side.
"""


def __getattr__(name: str):
    if name == "CodeReward":
        from tailflow.engines.reward.code.reward import CodeReward

        return CodeReward
    if name in ("extract_program", "same_output"):
        from tailflow.engines.reward.code import extract

        return getattr(extract, name)
    raise AttributeError(f"module 'tailflow.engines.reward.code' has no attribute {name!r}")


__all__ = ["CodeReward", "extract_program", "same_output"]
