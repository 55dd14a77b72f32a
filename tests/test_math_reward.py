import pickle
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from math_verify import parse, verify

from tailflow.engines.data.arith import make_problem
from tailflow.engines.reward import MathReward, RewardResult
from tailflow.engines.reward.math import final_answer_text, is_answer_correct, is_literal_answer

SOLUTION = "23+45=68\n68+11=79\n#### 79"


@pytest.fixture(scope="module")
def reward():
    reward = MathReward()
    yield reward
    reward.close()


@pytest.mark.parametrize("response", [
    SOLUTION,
    "#### 79",
    "####79",
    "#### 079",
    "#### 79.0",
    "#### $79$",
    "#### \\boxed{79}",
    "  #### 79  ",
    SOLUTION + "\n\n  \n",
    "#### 12\n#### 79",  # only the last line counts
])
def test_right_answers_score_one(reward, response):
    assert reward.score(response, "79") == RewardResult(reward=1.0, correct=True, formatted=True)


@pytest.mark.parametrize("response", ["#### 80", "#### -79", "#### 7 9", "#### 790", "#### ", "####", "#### x"])
def test_wrong_answers_score_zero(reward, response):
    assert reward.score(response, "79") == RewardResult(reward=0.0, correct=False, formatted=True)


@pytest.mark.parametrize("response", [
    "23+45=68\n68+11=79",  # math-verify alone would extract 79 from this
    "23+45=68\n68+11=7",  # truncated
    "#### 79\n68+11=79",  # the marker line is not last
    "The answer is 79",
    "A:79",
    "",
    "\n \n",
])
def test_unformatted_responses_score_zero(reward, response):
    assert reward.score(response, "79") == RewardResult(reward=0.0, correct=False, formatted=False)


def test_marker_less_text_is_what_math_verify_would_accept():
    """The reason for the marker rule: math-verify falls back to the last number (our own check refuses the
    other numbers since issue 38, so math-verify is asked directly)."""
    assert verify(parse("79"), parse("23+45=68\n68+11=79"))
    assert not is_answer_correct("23+45=68\n68+11=79", "79")
    assert final_answer_text("23+45=68\n68+11=79", "####") is None


def test_format_reward_is_added_to_formatted_responses():
    reward = MathReward(format_reward=0.1)
    try:
        assert reward.score(SOLUTION, "79").reward == pytest.approx(1.1)
        assert reward.score("#### 80", "79").reward == pytest.approx(0.1)
        assert reward.score("23+45=68\n68+11=79", "79").reward == 0.0
    finally:
        reward.close()


def test_custom_marker():
    reward = MathReward(answer_marker="Answer:")
    try:
        assert reward.score("68+11=79\nAnswer: 79", "79").correct
        assert not reward.score("68+11=79\n#### 79", "79").formatted
    finally:
        reward.close()


def test_gold_answers_in_other_forms(reward):
    assert reward.score("#### 0.5", "1/2").correct
    assert reward.score("#### \\frac{1}{2}", "0.5").correct
    assert not reward.score("#### 79", "not a number").correct


def test_score_batch(reward):
    results = reward.score_batch([SOLUTION, "#### 80", "79"], ["79", "79", "79"])
    assert [r.correct for r in results] == [True, False, False]
    with pytest.raises(ValueError, match="2 texts but 1 gold"):
        reward.score_batch(["a", "b"], ["1"])


def test_scores_from_other_threads(reward):
    results, errors = {}, []

    def work(index: int) -> None:
        try:
            results[index] = reward.score_batch([SOLUTION, "#### 80"], ["79", "79"])
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert all([r.correct for r in results[i]] == [True, False] for i in range(4))


def test_a_runaway_check_times_out_and_the_reward_recovers():
    """verify() on 9^9^9^9 runs for minutes in one C-level power; it must not stall scoring.

    (The default literal-answer rule rejects the expression before math-verify
    sees it, so the timeout path is exercised with that rule off.)"""
    assert MathReward().score("#### 9^9^9^9", "79") == RewardResult(reward=0.0, correct=False, formatted=True)
    reward = MathReward(timeout_s=1.0, literal_answers_only=False)
    try:
        result = threading_result(lambda: reward.score("#### 9^9^9^9", "79"))
        assert result == RewardResult(reward=0.0, correct=False, formatted=True)
        assert reward.num_timeouts == 1
        assert reward.score(SOLUTION, "79").correct  # a fresh child took over
    finally:
        reward.close()


def threading_result(function):
    box = []
    thread = threading.Thread(target=lambda: box.append(function()))
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "scoring did not return"
    return box[0]


def test_reward_pickles_without_its_child(reward):
    reward.score(SOLUTION, "79")
    copy = pickle.loads(pickle.dumps(reward))
    try:
        assert copy.score(SOLUTION, "79").correct
    finally:
        copy.close()


def test_invalid_settings():
    with pytest.raises(ValueError):
        MathReward(answer_marker=" ")
    with pytest.raises(ValueError):
        MathReward(timeout_s=0)
    with pytest.raises(ValueError):
        MathReward(format_reward=float("nan"))


@settings(max_examples=60, deadline=None)
@given(
    terms=st.lists(st.integers(min_value=0, max_value=999), min_size=2, max_size=20),
    delta=st.integers(min_value=-1000, max_value=1000).filter(lambda d: d != 0),
)
def test_reference_solutions_score_one_and_changed_answers_zero(reward, terms, delta):
    problem = make_problem(terms, "p")
    assert reward.score(problem.solution, problem.answer).reward == 1.0
    body, _, _ = problem.solution.rpartition("\n")
    changed = f"{body}\n#### {int(problem.answer) + delta}"
    assert reward.score(changed, problem.answer).reward == 0.0


@pytest.mark.parametrize("copied", ["23+45+11", "80-1", "x=79", "9^2-2", "79*1", "79\\times1", "158/2",
                                    "\\frac{158}{2}", "\\dfrac{158}{2}", "\\boxed{158/2}", "$79\\cdot1$", "79/1",
                                    "7.9e1", "\\sqrt{6241}"])
def test_expressions_after_the_marker_do_not_count(copied):
    """math-verify says '#### 23+45+11' equals 79: the policy must not win by copying the prompt."""
    reward = MathReward()
    assert not reward.score(f"#### {copied}", "79").correct
    assert reward.score("#### 79", "79").correct
    assert reward.score("#### -5", "-5").correct
    assert MathReward(literal_answers_only=False).score("#### 23+45+11", "79").correct


def test_a_killed_checker_process_does_not_change_a_reward():
    """The child that runs math-verify dies (killed from outside): the check is asked again of a fresh
    child, so the right answer still scores right and nothing counts as an error."""
    import os
    import signal

    reward = MathReward()
    try:
        assert reward.score(SOLUTION, "79").correct
        os.kill(reward._checker._process.pid, signal.SIGKILL)
        reward._checker._process.wait()
        assert reward.score(SOLUTION, "79").correct
        assert (reward.num_errors, reward.num_timeouts) == (0, 0)
    finally:
        reward.close()


@pytest.mark.parametrize("copied", ["79\\times1", "158/2", "\\frac{158}{2}"])
def test_quotients_and_products_equal_to_the_answer_are_a_hole_only_without_the_literal_rule(copied):
    """Why the rule exists: math-verify itself says these equal 79 (issue 11), so without the rule a policy
    earns reward by copying a product or quotient from the prompt. (For `79\\times1` it reads only the 79, which
    our own check refuses since issue 38: "1" is a second number; math-verify is asked directly.)"""
    assert verify(parse("79"), parse(copied))
    assert not MathReward().score(f"#### {copied}", "79").correct


@pytest.mark.parametrize("answer, gold", [
    ("1/2", "0.5"),
    ("-3/4", "-0.75"),
    ("\\frac{1}{2}", "1/2"),
    ("-\\frac{3}{4}", "-0.75"),
    ("$-79$", "-79"),
    ("\\boxed{-79}", "-79"),
    ("$\\boxed{7/2}$", "3.5"),
    ("0.25", "1/4"),
])
def test_numbers_in_every_accepted_form_score_one(reward, answer, gold):
    assert reward.score(f"#### {answer}", gold) == RewardResult(reward=1.0, correct=True, formatted=True)


@pytest.mark.parametrize("text, is_literal", [
    ("79", True), ("-79", True), ("079", True), ("79.0", True), ("0.5", True),
    ("3/4", True), ("-3/4", True), ("\\frac{3}{4}", True), ("$79$", True), ("\\boxed{79}", True),
    ("158/2", False),  # gcd 2: a quotient, not a number's own spelling
    ("6/4", False), ("0/5", False), ("79/1", False), ("\\frac{158}{2}", False),
    ("79\\times1", False), ("79*1", False), ("--79", False), ("+79", False), ("79.", False), (".5", False),
    ("1,000", False), ("7 9", False), ("", False), ("$$", False), ("\\boxed{}", False), ("x", False),
])
def test_is_literal_answer(text, is_literal):
    assert is_literal_answer(text) is is_literal
