import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tailflow.engines.data.arith import default_splits
from tailflow.engines.data.dataset import DatasetError, load_problems
from tailflow.engines.data.problem import Problem
from tailflow.engines.data.tokenizer import build_char_tokenizer


def save_problems_jsonl(problems, path: Path) -> Path:
    """`prompt`, `answer`, `id`, `solution` per line: what `load_problems(path, id_field="id",
    solution_field="solution")` reads back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer, "id": p.problem_id,
                                        "solution": p.solution}, ensure_ascii=False) + "\n" for p in problems))
    return path


def write_jsonl(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def assert_names(error: pytest.ExceptionInfo, *parts: str) -> None:
    message = str(error.value)
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"


def test_jsonl_round_trip_of_the_default_task(tmp_path):
    train, _ = default_splits(num_train=50, num_eval=5, seed=0)
    path = save_problems_jsonl(train, tmp_path / "sub" / "train.jsonl")
    loaded = load_problems(path, id_field="id", solution_field="solution")
    assert loaded.problems == train
    assert loaded.num_skipped == 0 and loaded.skip_reasons == {}


def test_jsonl_custom_fields_template_and_default_ids(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", [
        {"question": "1+2", "final": 3},
        "",
        {"question": "2+2", "final": "4", "extra": True},
    ])
    loaded = load_problems(path, prompt_field="question", answer_field="final", prompt_template="Q: {prompt}\nA:")
    assert loaded.problems == [
        Problem("gsm-0", "Q: 1+2\nA:", "3"),
        Problem("gsm-1", "Q: 2+2\nA:", "4"),
    ]


def test_parquet_round_trip_with_custom_field_names(tmp_path):
    path = tmp_path / "math.parquet"
    table = pa.table({
        "uid": ["a", "b"], "problem": ["3+4\n", "5+6\n"], "gold": ["7", "11"], "worked": ["3+4=7\n#### 7", None],
    })
    pq.write_table(table, path)
    loaded = load_problems(
        path, prompt_field="problem", answer_field="gold", id_field="uid", solution_field="worked"
    )
    assert loaded.problems == [Problem("a", "3+4\n", "7", "3+4=7\n#### 7"), Problem("b", "5+6\n", "11", None)]


def test_missing_file_names_the_config_key(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError) as error:
        load_problems(path, source_name="data.train_path")
    assert str(error.value) == f"data.train_path: {path} does not exist"


def test_unknown_suffix_is_an_error(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("prompt,answer\n1+1,2\n")
    with pytest.raises(DatasetError) as error:
        load_problems(path)
    assert_names(error, str(path), "'.csv'", ".jsonl", ".parquet")


def test_unreadable_parquet_is_an_error_even_when_skipping(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_text("not parquet")
    with pytest.raises(DatasetError) as error:
        load_problems(path, on_invalid="skip")
    assert_names(error, str(path), "Parquet")


def test_invalid_json_line(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}, '{"prompt": "2+2", '])
    with pytest.raises(DatasetError) as error:
        load_problems(path)
    assert_names(error, str(path), "line 2", "invalid JSON")


def test_json_array_file_gets_a_hint(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"prompt": "1+1", "answer": "2"}], indent=1))
    with pytest.raises(DatasetError) as error:
        load_problems(path)
    assert_names(error, str(path), "line 1", "one JSON object per line")


def test_missing_field_lists_the_fields_present(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}, {"q": "2+2", "answer": "4"}])
    with pytest.raises(DatasetError) as error:
        load_problems(path, source_name="data.eval_path")
    assert_names(error, "data.eval_path", str(path), "line 2", "missing field 'prompt'", "['answer', 'q']")


def test_missing_parquet_column_names_the_row_and_field(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["1+1"], "solution": ["2"]}), path)
    with pytest.raises(DatasetError) as error:
        load_problems(path)
    assert_names(error, str(path), "row 0", "missing field 'answer'", "['prompt', 'solution']")


@pytest.mark.parametrize("prompt", ["", "   \n"])
def test_empty_prompt(tmp_path, prompt):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}, {"prompt": prompt, "answer": "4"}])
    with pytest.raises(DatasetError) as error:
        load_problems(path)
    assert_names(error, str(path), "line 2", "field 'prompt' is empty")


@pytest.mark.parametrize("answer", [None, "", ["4"], True])
def test_bad_answer(tmp_path, answer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "2+2", "answer": answer}])
    with pytest.raises(DatasetError) as error:
        load_problems(path)
    assert_names(error, str(path), "line 1", "field 'answer'")


def test_numeric_answers_become_strings(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "2+2", "answer": 4}, {"prompt": "1/2", "answer": 0.5}])
    assert [p.answer for p in load_problems(path).problems] == ["4", "0.5"]


def test_non_string_prompt_and_non_object_row(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": 12, "answer": "4"}])
    with pytest.raises(DatasetError) as error:
        load_problems(path)
    assert_names(error, str(path), "line 1", "field 'prompt' must be a string", "int")
    path = write_jsonl(tmp_path / "e.jsonl", [[1, 2]])
    with pytest.raises(DatasetError) as error:
        load_problems(path)
    assert_names(error, str(path), "line 1", "expected a JSON object")


def test_duplicate_ids(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": 1, "prompt": "a", "answer": "1"}, {"id": 1, "prompt": "b", "answer": "2"}])
    with pytest.raises(DatasetError) as error:
        load_problems(path, id_field="id")
    assert_names(error, str(path), "line 2", "field 'id'", "duplicate")


def test_prompt_too_long_counts_template_tokens(tmp_path):
    tokenizer = build_char_tokenizer()
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}, {"prompt": "12+34+56", "answer": "102"}])
    loaded = load_problems(path, prompt_template="{prompt}\n", tokenizer=tokenizer, max_prompt_tokens=4, on_invalid="skip")
    assert [p.prompt for p in loaded.problems] == ["1+1\n"]  # 4 chars fit exactly; the newline counts
    assert loaded.skip_reasons == {"prompt_too_long": 1}
    with pytest.raises(DatasetError) as error:
        load_problems(path, prompt_template="{prompt}\n", tokenizer=tokenizer, max_prompt_tokens=4, on_invalid="error")
    assert_names(error, str(path), "line 2", "field 'prompt'", "9 tokens", "max_prompt_tokens=4")


def test_prompt_too_long_error_mode(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "12+34+56", "answer": "102"}])
    with pytest.raises(DatasetError) as error:
        load_problems(path, tokenizer=build_char_tokenizer(), max_prompt_tokens=3)
    assert_names(error, str(path), "line 1", "field 'prompt'", "8 tokens")


def test_max_prompt_tokens_needs_a_tokenizer(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}])
    with pytest.raises(DatasetError, match="needs a tokenizer"):
        load_problems(path, max_prompt_tokens=3)


def test_bad_template(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}])
    for template in ["no field", "{prompt} {other}", "{prompt"]:
        with pytest.raises(DatasetError, match="prompt_template"):
            load_problems(path, prompt_template=template)


def test_skip_mode_counts_reasons_and_keeps_ids_stable(tmp_path):
    path = write_jsonl(tmp_path / "mix.jsonl", [
        {"prompt": "1+1", "answer": "2"},
        "{broken",
        {"q": "x", "answer": "1"},
        {"prompt": " ", "answer": "1"},
        {"prompt": "2+2", "answer": None},
        {"prompt": "12+34+56", "answer": "102"},
        {"prompt": "3+3", "answer": 6},
    ])
    loaded = load_problems(path, tokenizer=build_char_tokenizer(), max_prompt_tokens=5, on_invalid="skip")
    assert [(p.problem_id, p.answer) for p in loaded.problems] == [("mix-0", "2"), ("mix-6", "6")]
    assert loaded.num_skipped == 5
    assert loaded.skip_reasons == {
        "invalid_json": 1, "missing_field": 1, "empty_prompt": 1, "bad_answer": 1, "prompt_too_long": 1,
    }
    assert "line 3" in loaded.first_skip_messages["missing_field"]


def test_zero_valid_rows_is_an_error_even_when_skipping(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"q": "x"}, {"q": "y"}])
    with pytest.raises(DatasetError) as error:
        load_problems(path, on_invalid="skip")
    assert_names(error, str(path), "no valid problems", "2 rows", "missing_field")


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n")
    with pytest.raises(DatasetError) as error:
        load_problems(path, on_invalid="skip", source_name="data.train_path")
    assert_names(error, "data.train_path", str(path), "empty")


def test_bad_on_invalid_value(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1", "answer": "2"}])
    with pytest.raises(DatasetError, match="on_invalid"):
        load_problems(path, on_invalid="ignore")
