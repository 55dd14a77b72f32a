"""Problems from a local JSONL or Parquet file, checked row by row.

Every bad row gives an error naming the config key, the file, the row and the
field (`data.train_path: /d/train.jsonl: line 7: missing field 'question';
fields present: ['q', 'answer']`), or, with `on_invalid="skip"`, is skipped
and counted by reason. A missing file, an unreadable format and a file with no
valid rows are errors in both modes.

Rows are JSONL lines (1-based line numbers; blank lines ignored) or Parquet
rows (0-based). Without `id_field`, a problem's id is `<file stem>-<row
index>`, the row index counting every non-blank row, valid or not, so
skipping rows never renames the others. The prompt stored is
`prompt_template.format(prompt=<field value>)`.
"""
from __future__ import annotations

import json
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

from tailflow.engines.data.problem import Problem

JSONL_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)


class DatasetError(ValueError):
    pass


@dataclass
class LoadedProblems:
    problems: list[Problem]
    num_skipped: int = 0
    skip_reasons: dict[str, int] = field(default_factory=dict)
    """Skipped rows by reason: invalid_json, not_an_object, missing_field, bad_type, empty_prompt,
    bad_answer, duplicate_id, prompt_too_long."""
    first_skip_messages: dict[str, str] = field(default_factory=dict)
    """For each reason, the full message of the first row skipped for it."""

    def record_invalid(self, reason: str, message: str, on_invalid: str) -> None:
        """A bad row: an error naming it (`on_invalid="error"`), or skipped and counted by reason."""
        if on_invalid == "error":
            raise DatasetError(message) from None  # called inside `except _InvalidRow`: no chained traceback
        self.num_skipped += 1
        self.skip_reasons[reason] = self.skip_reasons.get(reason, 0) + 1
        self.first_skip_messages.setdefault(reason, message)


@dataclass(frozen=True)
class _RowSpec:
    prompt_field: str
    answer_field: str
    id_field: str | None
    solution_field: str | None
    prompt_template: str
    tokenizer: Any
    max_prompt_tokens: int | None

    def problem(self, record: dict, default_id: str, seen_ids: set[str]) -> Problem:
        prompt = _require_text(record, self.prompt_field, "empty_prompt")
        answer = _answer_text(record, self.answer_field)
        problem_id = _id_text(record, self.id_field) if self.id_field else default_id
        if problem_id in seen_ids:
            raise _InvalidRow("duplicate_id", f"field '{self.id_field}': duplicate problem id {problem_id!r}")
        solution = _optional_text(record, self.solution_field) if self.solution_field else None
        prompt = _templated_prompt(prompt, self.prompt_template, self.tokenizer, self.max_prompt_tokens,
                                   self.prompt_field)
        return Problem(problem_id=problem_id, prompt=prompt, answer=answer, solution=solution)


class _InvalidRow(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def load_problems(
    path: str | os.PathLike,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    id_field: str | None = None,
    solution_field: str | None = None,
    prompt_template: str = "{prompt}",
    tokenizer=None,
    max_prompt_tokens: int | None = None,
    on_invalid: Literal["error", "skip"] = "error",
    source_name: str = "data",
) -> LoadedProblems:
    """`source_name` is the config key the path came from (e.g. "data.train_path"); every message starts with it."""
    spec = _RowSpec(prompt_field, answer_field, id_field, solution_field, prompt_template, tokenizer, max_prompt_tokens)
    return _load_rows(path, source_name, on_invalid, spec)


def _load_rows(path: str | os.PathLike, source_name: str, on_invalid: str, rules) -> LoadedProblems:
    """The loop of both file loaders. `rules` (a `_RowSpec`, or code_task's `_CodeRowRules`) holds the prompt
    template, tokenizer and max_prompt_tokens, and turns each row object into a Problem."""
    path = Path(path)
    where = f"{source_name}: {path}"
    _check_arguments(where, rules.prompt_template, rules.tokenizer, rules.max_prompt_tokens, on_invalid)
    loaded, seen_ids, num_rows = LoadedProblems(problems=[]), set(), 0
    for index, label, record in _read_rows(path, where):
        num_rows += 1
        try:
            problem = rules.problem(_row_object(record), f"{path.stem}-{index}", seen_ids)
        except _InvalidRow as invalid:
            loaded.record_invalid(invalid.reason, f"{where}: {label}: {invalid}", on_invalid)
            continue
        seen_ids.add(problem.problem_id)
        loaded.problems.append(problem)
    if num_rows == 0:
        raise DatasetError(f"{where} is empty: no rows")
    if not loaded.problems:
        raise DatasetError(f"{where}: no valid problems in {num_rows} rows; skipped by reason: {loaded.skip_reasons}")
    return loaded


def _check_arguments(where: str, prompt_template: str, tokenizer, max_prompt_tokens, on_invalid: str) -> None:
    if on_invalid not in ("error", "skip"):
        raise DatasetError(f"{where}: on_invalid must be 'error' or 'skip', got {on_invalid!r}")
    try:
        is_template_ok = "{prompt}" in prompt_template and bool(prompt_template.format(prompt="x"))
    except (KeyError, IndexError, ValueError):
        is_template_ok = False
    if not is_template_ok:
        raise DatasetError(
            f"{where}: prompt_template must contain '{{prompt}}' and no other fields, got {prompt_template!r}"
        )
    if max_prompt_tokens is not None and tokenizer is None:
        raise DatasetError(f"{where}: max_prompt_tokens={max_prompt_tokens} needs a tokenizer to count tokens")


def _read_rows(path: Path, where: str) -> Iterator[tuple[int, str, Any]]:
    """(row index, row label for messages, record) per row; an `_InvalidRow` stands in for an unreadable record."""
    if not path.exists():
        raise DatasetError(f"{where} does not exist")
    if not path.is_file():
        raise DatasetError(f"{where} is not a file")
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return _read_jsonl(path)
    if suffix in PARQUET_SUFFIXES:
        return _read_parquet(path, where)
    expected = f"JSON lines ({', '.join(JSONL_SUFFIXES)}) or Parquet ({', '.join(PARQUET_SUFFIXES)})"
    raise DatasetError(f"{where}: unknown format {path.suffix!r}; expected {expected}")


def _read_jsonl(path: Path) -> Iterator[tuple[int, str, Any]]:
    index = 0
    with open(path, "rb") as lines:
        for line_number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            yield index, f"line {line_number}", _decode_json_line(raw, line_number)
            index += 1


def _decode_json_line(raw: bytes, line_number: int) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        return _InvalidRow("invalid_json", f"not UTF-8 text ({error})")
    except json.JSONDecodeError as error:
        is_array = line_number == 1 and raw.lstrip().startswith(b"[")
        hint = " (the file must hold one JSON object per line, not a JSON array)" if is_array else ""
        return _InvalidRow("invalid_json", f"invalid JSON: {error.msg} at column {error.colno}{hint}")


def _read_parquet(path: Path, where: str) -> Iterator[tuple[int, str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{where}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        parquet = pq.ParquetFile(path)
    except Exception as error:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise DatasetError(f"{where}: cannot read as Parquet: {error}") from None
    index = 0
    for batch in parquet.iter_batches():
        for record in batch.to_pylist():
            yield index, f"row {index} (0-based)", record
            index += 1


def _row_object(record: Any) -> dict:
    if isinstance(record, _InvalidRow):
        raise record
    if not isinstance(record, dict):
        raise _InvalidRow("not_an_object", f"expected a JSON object, got {type(record).__name__}")
    return record


def _templated_prompt(raw: str, prompt_template: str, tokenizer, max_prompt_tokens: int | None, field_name: str) -> str:
    """`prompt_template` around the row's prompt; an `_InvalidRow` naming `field_name` if over `max_prompt_tokens`."""
    prompt = prompt_template.format(prompt=raw)
    if max_prompt_tokens is not None:
        num_tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if num_tokens > max_prompt_tokens:
            raise _InvalidRow("prompt_too_long", f"field '{field_name}': prompt is {num_tokens} tokens (with the "
                                                 f"template), over max_prompt_tokens={max_prompt_tokens}")
    return prompt


def _field(record: dict, name: str) -> Any:
    if name not in record:
        raise _InvalidRow("missing_field", f"missing field '{name}'; fields present: {sorted(record)}")
    return record[name]


def _require_text(record: dict, name: str, empty_reason: str) -> str:
    value = _field(record, name)
    if not isinstance(value, str):
        raise _InvalidRow("bad_type", f"field '{name}' must be a string, got {_describe(value)}")
    if not value.strip():
        raise _InvalidRow(empty_reason, f"field '{name}' is empty")
    return value


def _answer_text(record: dict, name: str) -> str:
    value = _field(record, name)
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        expected = "a non-empty string or a number"
        raise _InvalidRow("bad_answer", f"field '{name}' must be {expected}, got {_describe(value)}")
    return value.strip()


def _id_text(record: dict, name: str) -> str:
    value = _field(record, name)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        expected = "a non-empty string or an integer"
        raise _InvalidRow("bad_type", f"field '{name}' (the problem id) must be {expected}, got {_describe(value)}")
    return value


def _optional_text(record: dict, name: str) -> str | None:
    value = _field(record, name)
    if value is not None and not isinstance(value, str):
        raise _InvalidRow("bad_type", f"field '{name}' must be a string or null, got {_describe(value)}")
    return value


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"
