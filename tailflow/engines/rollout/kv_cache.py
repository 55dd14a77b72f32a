"""Preallocated per-slot KV cache whose running rows are always slots 0..B-1.

Each slot holds one request's keys and values at positions 0..max_seq_len-1.
The scheduler keeps the running requests packed into the first B slots (a
finished row's slot is refilled by moving the last row into it), so decode
attention reads a plain view `k[layer, :B, :, :L]`: no gather copies every
step, and the key length L is trimmed to the longest running row.
"""
from __future__ import annotations

import torch


class SlotKVCache:
    """Keys and values, each [num_layers, num_slots, num_kv_heads, max_seq_len, head_dim]."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        """Allocated once, up front, on `device`: nothing is allocated per step (a sleeping engine drops the
        whole cache and allocates a new one when it wakes)."""
        shape = (num_layers, num_slots, num_kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def write_prefill(self, layer: int, first_row: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store [n, kv_heads, T, head_dim] prompt keys/values at positions 0..T-1 of rows first_row.."""
        n, _, length, _ = k.shape
        self.k[layer, first_row:first_row + n, :, :length] = k
        self.v[layer, first_row:first_row + n, :, :length] = v

    def decode_index(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Flat index [B * kv_heads] of (row, head, position) in one layer's [slots*kv_heads*max_seq_len, head_dim]."""
        _, _, num_kv_heads, max_seq_len, _ = self.k.shape
        heads = torch.arange(num_kv_heads, device=rows.device)
        return ((rows[:, None] * num_kv_heads + heads) * max_seq_len + positions[:, None]).reshape(-1)

    def write_decode(self, layer: int, index: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one [B, kv_heads, head_dim] key/value per row at `decode_index` (each row's own position)."""
        head_dim = k.shape[-1]
        self.k[layer].view(-1, head_dim).index_copy_(0, index, k.reshape(-1, head_dim))
        self.v[layer].view(-1, head_dim).index_copy_(0, index, v.reshape(-1, head_dim))

    def view(self, layer: int, num_rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [num_rows, kv_heads, length, head_dim] of the first rows (views, no copy)."""
        return self.k[layer, :num_rows, :, :length], self.v[layer, :num_rows, :, :length]

    def move(self, src_row: int, dst_row: int, length: int) -> None:
        """Copy a row's first `length` positions (all layers) into another slot, to keep rows packed."""
        self.k[:, dst_row, :, :length] = self.k[:, src_row, :, :length]
        self.v[:, dst_row, :, :length] = self.v[:, src_row, :, :length]

    def read_row(self, row: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of a row's first `length` positions (all layers): a kept slot changing rows while the rows
        around it move (`native.py`); allocates one row's worth, unlike everything else here."""
        return self.k[:, row, :, :length].clone(), self.v[:, row, :, :length].clone()

    def write_row(self, row: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Put back what `read_row` copied, into (maybe another) row."""
        length = k.shape[2]
        self.k[:, row, :, :length] = k
        self.v[:, row, :, :length] = v
