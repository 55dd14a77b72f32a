from hypothesis import given, settings, strategies as st

from tailflow.engines.data.arith import ArithmeticTask, default_splits, make_problem
from tailflow.engines.data.cursor import DataCursor, draw_prompts
from tailflow.engines.data.tokenizer import build_char_tokenizer
from tailflow.engines.reward.scoring import group_completions
from tailflow.engines.rollout.protocol import FinishReason, Request, SamplingParams
from tailflow.engines.rollout.requests import greedy_requests, sampling_requests


def test_default_task_is_long_tailed_and_splits_are_disjoint():
    train, held_out = default_splits(5000, 300, seed=0)
    tokenizer = build_char_tokenizer()
    lengths = sorted(len(tokenizer(p.solution)["input_ids"]) + 1 for p in train)
    median = lengths[len(lengths) // 2]
    assert lengths[0] <= 20 and lengths[-1] >= 200
    assert lengths[-1] / median >= 8
    assert len(held_out) == 300
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}


def test_reference_solution_adds_up():
    problem = make_problem([23, 45, 11], "p")
    assert problem.prompt == "23+45+11\n"
    assert problem.solution == "23+45=68\n68+11=79\n#### 79"
    assert problem.answer == "79"


def test_tokenizer_round_trips_beside_a_qwen2_model(tmp_path):
    """AutoTokenizer loads a qwen2 checkpoint's tokenizer as Qwen2Tokenizer: the ids must not change."""
    from transformers import AutoTokenizer

    from tailflow.engines.models import tiny_qwen2_config

    tokenizer = build_char_tokenizer()
    text = ArithmeticTask().generate(1, 3, "x")[0].prompt + "12+3=15\n#### 15 -2*3:?"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tokenizer.unk_token_id not in ids
    tokenizer.save_pretrained(tmp_path)
    tiny_qwen2_config(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id).save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(text, add_special_tokens=False)["input_ids"] == ids
    assert reloaded.decode(ids) == text
    assert (reloaded.eos_token_id, reloaded.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.integers(5, 60))
def test_cursor_draws_every_problem_once_per_epoch(draw_sizes, num_problems):
    problems = ArithmeticTask().generate(num_problems, 0, "t")
    cursor, drawn = DataCursor(), []
    for size in draw_sizes:
        drawn.extend(p.problem_id for p in draw_prompts(problems, cursor, size, seed=1))
    assert cursor.num_drawn == len(drawn) == sum(draw_sizes)
    for epoch_start in range(0, len(drawn) - num_problems + 1, num_problems):
        assert len(set(drawn[epoch_start : epoch_start + num_problems])) == num_problems
    # the same draws from a cursor restored mid-way continue identically
    replay, restored = DataCursor(), None
    for index, size in enumerate(draw_sizes):
        draw_prompts(problems, replay, size, seed=1)
        if index == 0:
            restored = DataCursor(**replay.__dict__)
    tail = [p.problem_id for size in draw_sizes[1:] for p in draw_prompts(problems, restored, size, seed=1)]
    assert tail == drawn[draw_sizes[0] :]


def test_requests_are_seeded_per_problem_and_index():
    tokenizer = build_char_tokenizer()
    problems = ArithmeticTask().generate(3, 0, "t")
    requests = sampling_requests(problems, 4, SamplingParams(max_new_tokens=9), tokenizer, seed=0, iteration=2)
    # launch order: response k of every problem in turn, so the last problem is not left waiting for slots
    assert [r.request_id for r in requests[:4]] == [f"{p.problem_id}#0" for p in problems] + [f"{problems[0].problem_id}#1"]
    assert len({r.params.seed for r in requests}) == 12
    again = sampling_requests(problems[1:], 4, SamplingParams(max_new_tokens=9), tokenizer, seed=0, iteration=2)
    seed_of = {r.request_id: r.params.seed for r in requests}
    assert all(r.params.seed == seed_of[r.request_id] for r in again)  # a request's seed ignores its neighbours
    other_iteration = sampling_requests(problems, 4, SamplingParams(), tokenizer, seed=0, iteration=3)
    assert other_iteration[0].params.seed != requests[0].params.seed
    greedy = greedy_requests(problems, 50, tokenizer)
    assert all(r.params.temperature == 0 and r.params.max_new_tokens == 50 for r in greedy)


def test_completions_group_back_to_their_problem_in_index_order():
    problems = ArithmeticTask().generate(2, 0, "t")
    keys = [(problems[1].problem_id, 1), (problems[0].problem_id, 0), (problems[1].problem_id, 0)]
    requests = [Request.for_problem(problem_id, k, (1,)) for problem_id, k in keys]
    completions = [r.completion((2,), (-0.1,), FinishReason.EOS, 0) for r in requests]
    grouped = group_completions(problems, completions)
    assert [c.request_id for c in grouped[problems[1].problem_id]] == [requests[2].request_id,
                                                                       requests[0].request_id]
    assert [(c.problem_id, c.index) for c in grouped[problems[1].problem_id]] == [keys[2], keys[0]]


def test_requests_carry_their_identity_as_fields_not_in_their_id():
    """A problem id may hold '#': identity is never parsed out of the request id."""
    request = Request.for_problem("apps#12", 3, (1, 2))
    completion = request.completion((5,), (-0.5,), FinishReason.EOS, 0)
    assert (completion.problem_id, completion.index) == ("apps#12", 3)
    bare = Request("r7", (1,))
    assert bare.problem_id == "r7" and bare.index == 0  # a request with no group is its own
