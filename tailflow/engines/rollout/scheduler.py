"""Which requests run: a FIFO queue feeding a fixed number of slots, kept packed.

Running sequences occupy slots 0..B-1 in `running` order. When some finish
or are aborted, the last rows move into the holes (`RowMove`s that the engine
applies to the KV cache), so the running set stays one contiguous block.
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

from tailflow.engines.rollout.sequence import Sequence, SequenceStatus


class RowMove(NamedTuple):
    src_row: int
    dst_row: int
    length: int
    """Cached positions to copy."""


def prefill_chunks(lengths: list[int], max_padding: int = 32, max_tokens: int = 16384) -> list[tuple[int, int]]:
    """Split ascending `lengths` into [start, end) runs prefilled as one padded batch.

    A run is closed when widening it to the next length would pad more than
    `max_padding` tokens: a padded token costs a token's compute, a new run
    costs one more forward's fixed overhead (worth roughly that many tokens).
    It is also closed before it would hold more than `max_tokens` padded
    tokens (a lone longer prompt is a run of its own): a prefill's activations
    grow with its tokens, and 256 prompts of 8k tokens in one forward would
    not fit in any GPU's memory.
    """
    chunks, start, total = [], 0, 0
    for index, length in enumerate(lengths):
        widened = (index - start + 1) * length
        if index > start and (widened - (total + length) > max_padding or widened > max_tokens):
            chunks.append((start, index))
            start, total = index, 0
        total += length
    if lengths:
        chunks.append((start, len(lengths)))
    return chunks


class Scheduler:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def in_flight_ids(self) -> set[str]:
        return {seq.request_id for seq in self.waiting} | {seq.request_id for seq in self.running}

    def check_new(self, requests, validate) -> None:
        """`validate(request, seen)` every request before any is queued; `seen` holds the ids in flight and
        those earlier in the batch, so a duplicate is refused."""
        seen = self.in_flight_ids()
        for request in requests:
            validate(request, seen)
            seen.add(request.request_id)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self, num_usable_slots: int | None = None) -> list[Sequence]:
        """Move waiting sequences (FIFO) into free slots; they take rows len(running).. onwards.

        `num_usable_slots` (default: all) leaves out the slots kept for continuations (`kept_slots.py`).
        Within one admission the rows are ordered by context length (prompt and any prefix), so that
        prefill chunks of neighbouring rows pad little (see `prefill_chunks`); sequences continuing a kept slot
        come last (they are not prefilled in chunks).
        """
        limit = self.num_slots if num_usable_slots is None else num_usable_slots
        admitted = []
        while self.waiting and len(self.running) + len(admitted) < limit:
            seq = self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            admitted.append(seq)
        admitted.sort(key=lambda seq: (seq.kept_kv is not None, seq.num_prompt_tokens + len(seq.token_ids)))
        self.running.extend(admitted)
        return admitted

    def release(self, seqs: list[Sequence]) -> list[RowMove]:
        """Remove running `seqs`, filling each hole with the current last row.

        Holes are filled from the highest row down, so a row still to be
        removed is never the one moved.
        """
        rows = sorted((self.running.index(seq) for seq in seqs), reverse=True)
        moves = []
        for row in rows:
            last = self.running.pop()
            last_row = len(self.running)
            if row != last_row:
                self.running[row].status = SequenceStatus.FINISHED
                self.running[row] = last
                moves.append(RowMove(last_row, row, last.num_cached))
            else:
                last.status = SequenceStatus.FINISHED
        return moves

    def remove_waiting(self, request_ids: set[str]) -> list[Sequence]:
        removed = [seq for seq in self.waiting if seq.request_id in request_ids]
        self.waiting = deque(seq for seq in self.waiting if seq.request_id not in request_ids)
        for seq in removed:
            seq.status = SequenceStatus.FINISHED
        return removed
