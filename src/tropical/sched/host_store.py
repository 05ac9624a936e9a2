"""Prefix blocks kept in host memory under the workers' KV pools: one store per worker (LMCache's
local CPU backend, vLLM's CPU offloading) or one the whole cluster shares (Mooncake's store,
LMCache with a shared backend, Dynamo's KVBM), which any worker loads from.

Pure bookkeeping in KV blocks, keyed as the prefix cache keys them. A block enters when a pool
evicts it and stays (a load copies it out) until the store needs the room, least recently stored
or loaded first. ``puts`` and ``evictions`` count keys that entered and left, so that a cache
knows when a run it walked over the store may have grown or shrunk.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass(slots=True)
class HostStore:
    """Keys and their KV blocks, least recently used first; ``held`` sums the blocks, never
    above ``capacity``."""

    capacity: int
    shared: bool = False
    keys: OrderedDict[Hashable, int] = field(default_factory=OrderedDict)
    held: int = 0
    puts: int = 0
    evictions: int = 0

    def __post_init__(self) -> None:
        if self.capacity < 0:
            raise ValueError(f"a host store holds at least 0 KV blocks, not {self.capacity}")

    def blocks(self, key: Hashable) -> int:
        """KV blocks of ``key`` here (-1: not here)."""
        return self.keys.get(key, -1) if self.held else -1

    def put(self, key: Hashable, blocks: int) -> list[Hashable]:
        """Keep ``key`` (or mark it used now, if kept); returns the keys evicted for room."""
        if key in self.keys:
            self.keys.move_to_end(key)
            return []
        self.keys[key] = blocks
        self.held += blocks
        self.puts += 1
        gone: list[Hashable] = []
        while self.held > self.capacity:
            old, size = self.keys.popitem(last=False)
            self.held -= size
            self.evictions += 1
            gone.append(old)
        return gone

    def touch(self, key: Hashable) -> None:
        """``key`` was loaded: it leaves last."""
        self.keys.move_to_end(key)
