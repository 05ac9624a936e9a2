"""Preallocated paged KV cache: fixed-size blocks handed to sequences on demand, so memory never fragments."""

from __future__ import annotations

from collections.abc import Hashable

import torch

from tropical.engine.config import ModelConfig


class PagedKVCache:
    """K and V of every layer as [layers, blocks, block_size, kv_heads, head_dim], plus block ownership."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be positive")
        shape = (
            config.num_hidden_layers,
            num_blocks,
            block_size,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[Hashable, list[int]] = {}

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, seq_id: Hashable, tokens: int) -> int:
        """Extra blocks `ensure(seq_id, tokens)` would take; lets callers check a whole batch up front."""
        have = len(self._tables.get(seq_id, ()))
        return max(0, -(-tokens // self.block_size) - have)

    def ensure(self, seq_id: Hashable, tokens: int) -> None:
        """Grow the sequence's blocks to hold `tokens` tokens; all or nothing."""
        needed = self.blocks_needed(seq_id, tokens)
        if needed > len(self._free):
            raise MemoryError(
                f"KV cache out of blocks: sequence {seq_id!r} needs {needed} more for {tokens} tokens, "
                f"{len(self._free)} of {self.num_blocks} free"
            )
        table = self._tables.setdefault(seq_id, [])
        table.extend(self._free.pop() for _ in range(needed))

    def free(self, seq_id: Hashable) -> None:
        """Return the sequence's blocks ; unknown ids are ignored so finishing twice is harmless."""
        self._free.extend(reversed(self._tables.pop(seq_id, [])))

    def has(self, seq_id: Hashable) -> bool:
        return seq_id in self._tables

    def block_table(self, seq_id: Hashable) -> list[int]:
        return list(self._tables[seq_id])

    def slots(self, seq_id: Hashable, start: int, stop: int) -> list[int]:
        """Flat cache slots (block * block_size + offset) of token positions [start, stop)."""
        table, size = self._tables[seq_id], self.block_size
        if stop > len(table) * size:
            raise IndexError(f"sequence {seq_id!r} holds {len(table) * size} slots, asked for {stop}")
        return [table[p // size] * size + p % size for p in range(start, stop)]

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V as [slots, kv_heads, head_dim] views, indexed by slot."""
        return self.k[layer].flatten(0, 1), self.v[layer].flatten(0, 1)

    def export(self, seq_id: Hashable, tokens: int) -> torch.Tensor:
        """A compact copy [layers, 2, tokens, kv_heads, head_dim] of the sequence's first `tokens` tokens."""
        index = torch.tensor(self.slots(seq_id, 0, tokens), device=self.device)
        k = self.k.flatten(1, 2)[:, index]
        v = self.v.flatten(1, 2)[:, index]
        return torch.stack((k, v), dim=1)

    def import_(self, seq_id: Hashable, buffer: torch.Tensor) -> None:
        """Allocate blocks for an exported buffer and write it, so a request can continue on this cache."""
        if self.has(seq_id):
            raise ValueError(f"sequence {seq_id!r} already has blocks in this cache")
        expected = (self.k.shape[0], 2, buffer.shape[2], *self.k.shape[3:])
        if tuple(buffer.shape) != expected:
            raise ValueError(
                f"KV buffer shape {tuple(buffer.shape)} does not fit this cache, expected {expected}"
            )
        tokens = buffer.shape[2]
        self.ensure(seq_id, tokens)
        index = torch.tensor(self.slots(seq_id, 0, tokens), device=self.device)
        self.k.flatten(1, 2)[:, index] = buffer[:, 0].to(self.k)
        self.v.flatten(1, 2)[:, index] = buffer[:, 1].to(self.v)
