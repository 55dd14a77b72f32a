"""The suite's own rules (conftest.py): in CI a skip for anything but a missing GPU fails the run, and every
long / e2e / bench test is also slow, so the fast subset (-m "not slow") leaves them all out."""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

SKIPS = '''
import pytest

def test_needs_a_package():
    pytest.skip("bwrap is not installed")

def test_needs_a_gpu():
    pytest.skip("torch sees no CUDA device here")

@pytest.mark.long
def test_long():
    pass
'''


def run_pytest(folder: Path, ci: bool, *args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(folder)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def test_in_ci_a_skip_for_a_missing_dependency_fails_the_run_and_a_missing_gpu_does_not(tmp_path):
    shutil.copy(Path(__file__).parent / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_skips.py").write_text(SKIPS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow\n    long\n    e2e\n    bench\n")
    outside = run_pytest(tmp_path, ci=False)
    assert outside.returncode == 0, outside.stdout
    inside = run_pytest(tmp_path, ci=True)
    assert inside.returncode == 1, inside.stdout
    assert "test_needs_a_package: Skipped: bwrap is not installed" in inside.stdout
    assert "test_needs_a_gpu" not in inside.stdout.split("a failure in CI")[1].split("short test summary")[0]
    fast = run_pytest(tmp_path, False, "-m", "not slow")
    assert "1 deselected" in fast.stdout  # the long test is slow too


SLOW_MARKS = {"slow", "long", "e2e", "bench"}
COST = re.compile(r"~?\d+(\.\d+)?\s*(-\s*\d+\s*)?(s|min|minutes|seconds)\b")
"""A cost in a docstring: "~45 s", "1-2 min", "4.5 minutes"."""


def marks_of(decorators: list[ast.expr]) -> set[str]:
    """The names of `pytest.mark.X` among decorators or a `pytestmark = ...` value."""
    names = set()
    for node in decorators:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
                names.add(sub.attr)
    return names


def slow_tests_without_a_cost() -> list[str]:
    """Every test marked slow (or long / e2e / bench, itself or by its module's pytestmark) whose docstring does
    not say what it costs."""
    missing = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marks = marks_of([node.value for node in tree.body if isinstance(node, ast.Assign)
                                 and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)])
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                if (module_marks | marks_of(node.decorator_list)) & SLOW_MARKS:
                    if not COST.search(ast.get_docstring(node) or ""):
                        missing.append(f"{path.name}::{node.name}")
    return missing


def test_every_slow_test_says_what_it_costs():
    """CI time is a budget: a slow test's docstring says what it costs here (and why it cannot be cheaper), so the
    next reader of scripts/test.sh's slowest list knows whether a number grew."""
    assert slow_tests_without_a_cost() == []
