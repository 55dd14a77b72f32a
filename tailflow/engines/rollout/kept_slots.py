"""Finished requests' KV slots kept for the request that continues them (multi-turn prefix reuse).

A multi-turn conversation is one request per model turn; each next turn's prompt is the whole conversation so far.
Its keys and values up to the end of the previous turn are already in that turn's slot, so the engine keeps the
slot (`Request.keep_slot`) and the continuing request (`Request.continues`) prefills only the appended tokens.

Kept slots sit packed at the top of the slot cache (rows num_slots-1, num_slots-2, ...), running ones at the
bottom (rows 0..B-1, `scheduler.py`), so decode still reads one contiguous block. Removing a kept slot moves the
lowest kept row into its hole (a `RowMove` the engine applies), as the scheduler does for running rows.
"""
from __future__ import annotations

from dataclasses import dataclass

from tailflow.engines.rollout.scheduler import RowMove


@dataclass(frozen=True)
class KeptSlot:
    request_id: str
    context_token_ids: tuple[int, ...]
    """The finished request's prompt and response: a continuing request's prompt must start with them."""
    num_cached: int
    """Positions 0..num_cached-1 hold keys and values (all of the context but its last token, never fed)."""
    weight_version: int
    """The weights that computed them: with other weights loaded since, the slot is not reused."""


class KeptSlots:
    """Which kept slot lives in which row; oldest first (the order they are given back in when room is needed)."""

    def __init__(self, num_slots: int, max_kept: int) -> None:
        if not 0 <= max_kept <= num_slots:
            raise ValueError(f"max_kept_slots must be in [0, num_slots={num_slots}], got {max_kept}")
        self.num_slots = num_slots
        self.max_kept = max_kept
        self.slots: dict[str, KeptSlot] = {}
        self.rows: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.slots)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.slots

    def get(self, request_id: str | None) -> KeptSlot | None:
        return self.slots.get(request_id) if request_id is not None else None

    def oldest(self) -> str | None:
        return next(iter(self.slots), None)

    def add(self, slot: KeptSlot) -> int:
        """Record `slot` in the next row down from the kept block; the caller has made room (`is_full`)."""
        if slot.request_id in self.slots or len(self.slots) >= self.max_kept:
            raise RuntimeError(f"kept slot {slot.request_id!r}: already kept, or {self.max_kept} kept already")
        row = self.num_slots - len(self.slots) - 1
        self.slots[slot.request_id] = slot
        self.rows[slot.request_id] = row
        return row

    def is_full(self) -> bool:
        return len(self.slots) >= self.max_kept

    def remove(self, request_id: str) -> tuple[KeptSlot, int, list[RowMove]]:
        """Forget a kept slot: (it, the row it was in, the move that refills that row from the kept block's
        lowest row). Read the row's keys and values before applying the move."""
        slot, row = self.slots.pop(request_id), self.rows.pop(request_id)
        lowest = self.num_slots - len(self.slots) - 1
        if row == lowest:
            return slot, row, []
        moved = next(rid for rid, r in self.rows.items() if r == lowest)
        self.rows[moved] = row
        return slot, row, [RowMove(lowest, row, self.slots[moved].num_cached)]

    def clear(self) -> None:
        self.slots.clear()
        self.rows.clear()
