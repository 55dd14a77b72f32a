"""Compact stand-ins for the per-token sequences of a simulated response.

The simulator knows lengths, never tokens: a completion carries `PlaceholderTokens` (n zeros stored as one
integer) for its tokens and log-probs, and, once it has been continued across a weight sync, `VersionRuns`
(the weight version of each token, stored as runs) for `token_weight_versions`. A simulated round holds
thousands of responses of up to 32k tokens; materialised tuples made a 32B round cost minutes.
"""
from __future__ import annotations

import itertools
from collections import abc
from typing import Iterator, Sequence


class PlaceholderTokens(abc.Sequence):
    """`n` zeros standing for tokens the simulator never produces, stored as one integer.

    `len()` is the response length, which is all the completion rule and the waste accounting read;
    indexing gives zeros.
    """

    __slots__ = ("_length",)

    def __init__(self, length: int) -> None:
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return PlaceholderTokens(len(range(*index.indices(self._length))))
        if not -self._length <= index < self._length:
            raise IndexError(index)
        return 0

    def __iter__(self) -> Iterator[int]:
        return itertools.repeat(0, self._length)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlaceholderTokens) and other._length == self._length

    def __hash__(self) -> int:
        return hash(("placeholder", self._length))

    def __repr__(self) -> str:
        return f"PlaceholderTokens({self._length})"


class VersionRuns(abc.Sequence):
    """Per-token weight versions as runs of (version, count), oldest first: what a response continued across
    weight syncs carries, without a tuple of one entry per token."""

    __slots__ = ("runs",)

    def __init__(self, runs: Sequence[tuple[int, int]]) -> None:
        merged: list[tuple[int, int]] = []
        for version, count in runs:
            if count <= 0:
                continue
            if merged and merged[-1][0] == version:
                merged[-1] = (version, merged[-1][1] + count)
            else:
                merged.append((version, count))
        self.runs = tuple(merged)

    @classmethod
    def of(cls, versions: Sequence[int]) -> "VersionRuns":
        """Runs of any per-token version sequence (a tuple, or runs already)."""
        if isinstance(versions, VersionRuns):
            return versions
        if versions and versions.count(versions[0]) == len(versions):  # the common case, at C speed
            return cls([(versions[0], len(versions))])
        return cls([(version, len(list(group))) for version, group in itertools.groupby(versions)])

    def then(self, version: int, count: int) -> "VersionRuns":
        return VersionRuns([*self.runs, (version, count)])

    def __len__(self) -> int:
        return sum(count for _, count in self.runs)

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(itertools.repeat(v, n) for v, n in self.runs)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self)[index]
        position = index + len(self) if index < 0 else index
        for version, count in self.runs:
            if 0 <= position < count:
                return version
            position -= count
        raise IndexError(index)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VersionRuns) and other.runs == self.runs

    def __hash__(self) -> int:
        return hash(("versions", self.runs))

    def __repr__(self) -> str:
        return f"VersionRuns({list(self.runs)})"
