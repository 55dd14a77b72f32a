"""Final answers with several values: split them, and compare the whole list as the gold writes it.

math-verify reads a gold `-1, 4` as its last value (or as -1.4), so `#### 4`
would score and the full correct answer would not. Here an answer is split
at its top-level commas (not inside brackets, braces or parentheses) into
items, after `$...$` / `\\boxed{...}` are peeled off:

    "-1, 4"          a set: order free          "\\{-1, 4\\}", "{-1, 4}"  a set
    "(1, 2)", "[1, 2]"  a tuple: order matters    "(1, 2]"  one value (an interval)
    "1,000", "12,345.5"  one number (thousands separators)

A gold with one item is compared as before, whole. A gold with several is
matched by a response with exactly as many items: in order for a tuple, as a
perfect matching (a multiset) for a set; each pair is compared by the
caller's `same_value` (math-verify). A partial list, an extra item or a
hedge ("4, -1, 7" for "-1, 4") scores 0.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

WRAPPERS = (re.compile(r"\$(.*)\$"), re.compile(r"\\boxed\{(.*)\}"))
"""Presentation around an answer (`$79$`, `\\boxed{79}`), peeled off before it is read."""
THOUSANDS = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")
GROUP_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
DIGIT_RUN = re.compile(r"\d+")
OPENERS, CLOSERS = "([{", ")]}"
MAX_ITEMS = 32


@dataclass(frozen=True)
class AnswerParts:
    items: tuple[str, ...]
    ordered: bool
    """A tuple (order matters) rather than a set; a single item is ordered."""


def unwrapped(text: str) -> str:
    """The text inside any `$...$` / `\\boxed{...}` wrappers, outermost first."""
    text = text.strip()
    for wrapper in WRAPPERS:
        match = wrapper.fullmatch(text)
        if match:
            text = match.group(1).strip()
    return text


def split_top_level(text: str) -> list[str] | None:
    """The parts between top-level commas; None when the brackets do not balance."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in OPENERS:
            depth += 1
        elif char in CLOSERS:
            depth -= 1
            if depth < 0:
                return None
        elif char == "," and depth == 0:
            parts.append(text[start:index].strip())
            start = index + 1
    return None if depth else [*parts, text[start:].strip()]


def outer_brackets(text: str) -> tuple[str, str] | None:
    """(kind, inside) when the whole text is one bracketed group: "set" for braces, "tuple" for () and []."""
    for opener, closer, kind in (("\\{", "\\}", "set"), ("{", "}", "set"), ("(", ")", "tuple"), ("[", "]", "tuple")):
        if text.startswith(opener) and text.endswith(closer) and len(text) >= len(opener) + len(closer):
            inside = text[len(opener):len(text) - len(closer)]
            if split_top_level(inside) is not None:
                return kind, inside
    return None


def split_answer(text: str) -> AnswerParts:
    text = unwrapped(text)
    if THOUSANDS.fullmatch(text):
        return AnswerParts((text,), True)
    bracketed = outer_brackets(text)
    kind, inside = bracketed if bracketed else ("set", text)
    items = split_top_level(inside)
    if items is None or len(items) < 2:
        return AnswerParts((text,), True)
    return AnswerParts(tuple(items), kind == "tuple")


def same_answer(answer: str, gold: str, same_value: Callable[[str, str], bool]) -> bool:
    """Whether `answer` gives the gold's values: whole for a one-item gold, item by item otherwise."""
    gold_parts, answer_parts = split_answer(gold), split_answer(answer)
    if len(gold_parts.items) == 1:
        return len(answer_parts.items) == 1 and same_value(answer, gold)
    if len(answer_parts.items) != len(gold_parts.items) or len(gold_parts.items) > MAX_ITEMS:
        return False
    if gold_parts.ordered:
        return all(same_value(a, g) for a, g in zip(answer_parts.items, gold_parts.items))
    return perfect_matching(answer_parts.items, gold_parts.items, same_value)


def perfect_matching(answers: tuple[str, ...], golds: tuple[str, ...], same_value) -> bool:
    """Every gold item paired with a different answer item it equals (augmenting paths; n is small)."""
    equal = [[same_value(a, g) for a in answers] for g in golds]
    owner: dict[int, int] = {}

    def assign(gold: int, seen: set[int]) -> bool:
        for answer in range(len(answers)):
            if equal[gold][answer] and answer not in seen:
                seen.add(answer)
                if answer not in owner or assign(owner[answer], seen):
                    owner[answer] = gold
                    return True
        return False
    return all(assign(gold, set()) for gold in range(len(golds)))


def numbers_written(text: str) -> Counter:
    """The numbers `text` writes, as its runs of digits (thousands separators joined, leading zeros dropped):
    "3 and 7" writes 3 and 7; "1,000" and "01000" write 1000; "\\frac{1}{2}" writes 1 and 2."""
    return Counter(run.lstrip("0") or "0" for run in DIGIT_RUN.findall(GROUP_SEPARATOR.sub("", text)))


def writes_one_value(answer: str, read: str) -> bool:
    """Whether every number `answer` writes is part of `read`, the text a parser took as its one value.

    math-verify reads a single value out of any text: the last number of "3 and 7", "3 or 7", "3; 7",
    "x = 3 or x = 7", "3 \\pm 7". So a listed answer would score for a gold equal to its last value. A number
    the answer writes outside what was read is another value; a single-valued gold (or one item of a list)
    accepts a single value only. "x = 7", "7 cm", "\\boxed{7}" write nothing but the 7 that is read."""
    return not numbers_written(answer) - numbers_written(read)
