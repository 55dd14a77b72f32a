"""Code problems: the built-in task, and KodCode / APPS files (good rows, bad rows named by line and field, skip)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tailflow.engines.data.code_task import FAMILIES, builtin_code_problems, load_code_problems
from tailflow.engines.data.dataset import DatasetError
from tailflow.engines.data.problem import IOCase
from tailflow.engines.reward.code import CodeReward

DATA = Path(__file__).parent / "data"
FAMILY_MARKERS = ("sum multiplied", "places forward", "instead of multiples", "how many times the character",
                  "nth_prime", "largest of them", "gcd_all", "alphabetical order", "digit_power_sum",
                  "primes are below")


def fenced(code: str) -> str:
    return f"```python\n{code}\n```\n"


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("\n".join(row if isinstance(row, str) else json.dumps(row) for row in rows) + "\n")
    return path


# ---- the built-in task -----------------------------------------------------------------------

def test_builtin_task_is_deterministic_disjoint_and_mixes_test_kinds():
    train, held_out = builtin_code_problems(seed=3)
    assert len(train) == 400 and len(held_out) == 40
    assert len({p.prompt for p in train}) == 400
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    assert builtin_code_problems(seed=3) == (train, held_out)  # deterministic per seed
    assert builtin_code_problems(seed=4)[0] != train
    assert {bool(p.tests.asserts) for p in train} == {True, False}  # asserts and stdin/stdout both present
    assert all(p.solution and p.answer == "" and "```python" in p.prompt for p in train + held_out)
    assert len(FAMILIES) >= 10
    for split in (train, held_out):  # every family, in equal shares, in both splits
        shares = Counter(next(key for key in FAMILY_MARKERS if key in p.prompt) for p in split)
        assert set(shares) == set(FAMILY_MARKERS) and len(set(shares.values())) == 1, shares


def test_builtin_reference_solutions_pass_and_one_family_is_slow():
    train, held_out = builtin_code_problems(seed=0, num_train=30, num_eval=10)
    reward = CodeReward()
    results = {p.problem_id: reward.score_problem(fenced(p.solution), p) for p in train[:20] + held_out[:10]}
    assert all(r.correct for r in results.values()), [k for k, r in results.items() if not r.correct]
    slow = [results[p.problem_id].exec_s for p in train[:20] if "primes are below" in p.prompt]
    fast = sorted(results[p.problem_id].exec_s for p in train[:20] if "primes are below" not in p.prompt)
    # The adaptive timeout has a real run time to anchor on: the slow family takes several times what the
    # others take, on any machine (a relation, not a number of seconds).
    assert slow and max(slow) > 3 * fast[len(fast) // 2]


# ---- KodCode / APPS files --------------------------------------------------------------------

def test_sample_files_load_and_their_solutions_pass():
    kodcode = load_code_problems(DATA / "kodcode_sample.jsonl", "kodcode", id_field="question_id").problems
    apps = load_code_problems(DATA / "apps_sample.jsonl", "apps").problems
    assert [p.problem_id for p in kodcode] == ["kc-1", "kc-2"] and [p.problem_id for p in apps] == ["101", "102"]
    assert kodcode[0].tests.test_functions == ("test_positive", "test_negative")
    assert kodcode[0].tests.reference_time_s == 0.01 and kodcode[1].tests.reference_time_s is None
    assert apps[0].tests.io_cases[0] == IOCase("2 3\n", "6\n") and len(apps[1].tests.asserts) == 2
    assert "Starter code" in apps[1].prompt
    reward = CodeReward()
    for problem in kodcode + apps:
        assert reward.score_problem(fenced(problem.solution), problem).correct, problem.problem_id
    half = reward.score_problem(fenced("def add(a, b):\n    return abs(a) + abs(b)"), kodcode[0])
    assert half.reward == 0.5  # one of the two test functions passes


def test_default_ids_template_and_plain_function_call_tests(tmp_path):
    path = write_rows(tmp_path / "calls.jsonl", [
        {"question": "Double it.", "input_output": {"fn_name": "double", "inputs": [[2], [5]], "outputs": [4, 10]}},
    ])
    problem, = load_code_problems(path, "apps", prompt_template="Task: {prompt}").problems
    assert problem.problem_id == "calls-0" and problem.prompt == "Task: Double it."
    assert CodeReward().score_problem(fenced("def double(x):\n    return 2 * x"), problem).correct


def test_bad_kodcode_rows_name_file_line_and_field(tmp_path):
    path = write_rows(tmp_path / "bad.jsonl", [
        {"question": "ok", "test": "def test_a():\n    assert True"},
        {"question": "no tests", "test": "x = 1"},
        {"question": "broken", "test": "def test_a(:"},
        {"test": "def test_a():\n    pass"},
        "{not json",
        {"question": "slow", "test": "def test_a():\n    pass", "reference_time_s": "fast"},
    ])
    with pytest.raises(DatasetError, match=r"data.train_path: .*bad.jsonl: line 2: field 'test' defines no test_"):
        load_code_problems(path, "kodcode", source_name="data.train_path")
    loaded = load_code_problems(path, "kodcode", on_invalid="skip")
    assert len(loaded.problems) == 1 and loaded.num_skipped == 5
    assert loaded.skip_reasons == {"bad_tests": 2, "missing_field": 1, "invalid_json": 1, "bad_type": 1}
    assert "line 2: field 'test' defines no test_" in loaded.first_skip_messages["bad_tests"]
    assert "line 4" in loaded.first_skip_messages["missing_field"]
    assert "line 6: field 'reference_time_s'" in loaded.first_skip_messages["bad_type"]


def test_bad_apps_rows_name_line_and_field(tmp_path):
    cases = {
        "field 'input_output': 1 inputs and 0 outputs": {"question": "q", "input_output": {"inputs": ["1"], "outputs": []}},
        "field 'input_output' is not valid JSON": {"question": "q", "input_output": "{oops"},
        "missing field 'input_output'": {"question": "q"},
        "field 'input_output': stdin/stdout cases must be strings": {"question": "q", "input_output": {"inputs": [1], "outputs": [2]}},
        "field 'question' is empty": {"question": " ", "input_output": {"inputs": ["1"], "outputs": ["1"]}},
    }
    for expected, row in cases.items():
        path = write_rows(tmp_path / "apps.jsonl", [{"question": "fine", "input_output": {"inputs": ["1"],
                                                                                           "outputs": ["1"]}}, row])
        with pytest.raises(DatasetError, match=f"apps.jsonl: line 2: {expected}"):
            load_code_problems(path, "apps")
        assert len(load_code_problems(path, "apps", on_invalid="skip").problems) == 1


def test_files_with_no_valid_rows_and_unknown_styles_are_errors(tmp_path):
    path = write_rows(tmp_path / "none.jsonl", [{"question": "q", "test": "x = 1"}])
    with pytest.raises(DatasetError, match="no valid problems in 1 rows"):
        load_code_problems(path, "kodcode", on_invalid="skip")
    with pytest.raises(DatasetError, match="code_format must be 'kodcode' or 'apps'"):
        load_code_problems(path, "leetcode")
