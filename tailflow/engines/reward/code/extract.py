"""The text side of the code reward: the program in a response, and whether two outputs match.

`extract_program` scans once from left to right with `str.find` (linear in
the response's length): a regular expression for the same fences backtracked
quadratically on a long run of spaces after a fence (60 KB took seconds,
before the time budget even started).
"""
from __future__ import annotations

import re

FENCE = "```"
LANGUAGE = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")
PYTHON_TAGS = ("python", "py", "python3")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of each fenced block in order: a fence, a tag and the rest of that line, then the
    body up to the next fence; the search goes on after the closing fence."""
    blocks, position = [], 0
    while True:
        opening = text.find(FENCE, position)
        if opening < 0:
            return blocks
        line_end = text.find("\n", opening + len(FENCE))
        if line_end < 0:
            return blocks
        closing = text.find(FENCE, line_end + 1)
        if closing < 0:
            return blocks
        language = LANGUAGE.match(text, opening + len(FENCE), line_end).group(1)
        blocks.append((language, text[line_end + 1:closing]))
        position = closing + len(FENCE)


def extract_program(response_text: str) -> tuple[str, bool]:
    """(program, whether it came from a fenced block): the last ```python block, else the last ``` block,
    else the whole response."""
    blocks = fenced_blocks(response_text)
    python_blocks = [body for language, body in blocks if language.lower() in PYTHON_TAGS]
    if python_blocks:
        return python_blocks[-1], True
    if blocks:
        return blocks[-1][1], True
    return response_text, False


def same_output(actual: str, expected: str) -> bool:
    """Line by line, trailing whitespace and trailing blank lines ignored."""
    def lines(text: str) -> list[str]:
        stripped = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while stripped and not stripped[-1]:
            stripped.pop()
        return stripped
    return lines(actual) == lines(expected)
