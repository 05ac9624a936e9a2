"""Preallocated paged KV cache: fixed-size blocks handed to sequences on demand, so memory never fragments.

Full prompt blocks named by their chained hash (``block_hash``) stay cached after their sequence ends
(see ``BlockPool``); a sequence that starts with a cached run of its prompt's names reuses those blocks
instead of computing them. Tokens it recomputes inside the run (a hit stops one token short of its
prompt) are written again into the shared block, with the values the block already holds.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from tropical.engine.block_pool import BlockPool
from tropical.engine.config import ModelConfig
from tropical.engine.kv_events import KVEvent


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
        self.pool = BlockPool(num_blocks, block_size)
        self._tables: dict[Hashable, list[int]] = {}
        self._stored: dict[Hashable, int] = {}

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence references (cached ones count: they are evicted when needed)."""
        return self.pool.num_free

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.pool.num_free

    @property
    def cached_hashes(self) -> set[int]:
        """Names of the prompt blocks cached now, referenced or not."""
        return self.pool.cached_hashes

    def take_events(self) -> list[KVEvent]:
        """What entered and left the cache since the last call."""
        return self.pool.take_events()

    def blocks_needed(self, seq_id: Hashable, tokens: int) -> int:
        """Extra blocks `ensure(seq_id, tokens)` would take; lets callers check a whole batch up front."""
        have = len(self._tables.get(seq_id, ()))
        return max(0, -(-tokens // self.block_size) - have)

    def ensure(self, seq_id: Hashable, tokens: int) -> None:
        """Grow the sequence's blocks to hold `tokens` tokens; all or nothing."""
        needed = self.blocks_needed(seq_id, tokens)
        if needed > self.pool.num_free:
            raise MemoryError(
                f"KV cache out of blocks: sequence {seq_id!r} needs {needed} more for {tokens} tokens, "
                f"{self.pool.num_free} of {self.num_blocks} free"
            )
        self._tables.setdefault(seq_id, []).extend(self.pool.allocate(needed))

    def begin(self, seq_id: Hashable, block_hashes: tuple[int, ...], cached: int) -> None:
        """A new sequence starts on the cached run of its prompt's blocks (``block_hashes``), which
        must cover the ``cached`` tokens its planner counted as computed (a sequence that names no
        blocks gets fresh ones for them)."""
        run = self.pool.cached_run(block_hashes)
        if block_hashes and len(run) * self.block_size < cached:
            self.pool.free(run[::-1])
            raise ValueError(f"sequence {seq_id!r} starts after {cached} cached tokens, but only "
                             f"{len(run) * self.block_size} of its prompt are cached here")
        self._tables[seq_id] = run
        self._stored[seq_id] = len(run)

    def store(self, seq_id: Hashable, tokens: int, block_hashes: tuple[int, ...]) -> None:
        """The sequence's first ``tokens`` tokens are computed: the full prompt blocks among them
        enter the cache."""
        full = min(tokens // self.block_size, len(block_hashes))
        start = self._stored.get(seq_id, 0)
        if full > start:
            self.pool.store(self._tables[seq_id], start, block_hashes[:full])
            self._stored[seq_id] = full

    def free(self, seq_id: Hashable) -> None:
        """Drop the sequence's blocks, tail first (cached ones stay cached); unknown ids are
        ignored so finishing twice is harmless."""
        self._stored.pop(seq_id, None)
        self.pool.free(self._tables.pop(seq_id, [])[::-1])

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

    def export(self, seq_id: Hashable, tokens: int, start: int = 0) -> torch.Tensor:
        """A compact copy [layers, 2, tokens, kv_heads, head_dim] of the sequence's `tokens` tokens from
        position `start` on (a target that has the first `start` cached needs only the rest)."""
        index = torch.tensor(self.slots(seq_id, start, start + tokens), dtype=torch.long, device=self.device)
        k = self.k.flatten(1, 2)[:, index]
        v = self.v.flatten(1, 2)[:, index]
        return torch.stack((k, v), dim=1)

    def import_(self, seq_id: Hashable, buffer: torch.Tensor, start: int = 0,
                block_hashes: tuple[int, ...] = ()) -> None:
        """Write an exported buffer of the sequence's tokens from `start` on into its blocks, so a
        request can continue on this cache: the first `start` come from this cache's run of
        `block_hashes`, and the full prompt blocks received enter the cache."""
        if self.has(seq_id):
            raise ValueError(f"sequence {seq_id!r} already has blocks in this cache")
        expected = (self.k.shape[0], 2, buffer.shape[2], *self.k.shape[3:])
        if tuple(buffer.shape) != expected:
            raise ValueError(
                f"KV buffer shape {tuple(buffer.shape)} does not fit this cache, expected {expected}"
            )
        tokens = start + buffer.shape[2]
        self.begin(seq_id, block_hashes, start)
        try:
            self.ensure(seq_id, tokens)
        except MemoryError:
            self.free(seq_id)
            raise
        index = torch.tensor(self.slots(seq_id, start, tokens), dtype=torch.long, device=self.device)
        self.k.flatten(1, 2)[:, index] = buffer[:, 0].to(self.k)
        self.v.flatten(1, 2)[:, index] = buffer[:, 1].to(self.v)
        self.store(seq_id, tokens, block_hashes)
