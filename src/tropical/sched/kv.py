"""KV-cache accounting in fixed-size blocks: the only memory a worker hands out.

Requests reserve blocks before they run and never exceed the pool, so nothing over-commits:
a request that does not fit waits.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class KVPool:
    """Free and used blocks of one worker's KV cache."""

    capacity_blocks: int
    block_size: int = 16
    used_blocks: int = 0

    def __post_init__(self) -> None:
        if self.capacity_blocks <= 0 or self.block_size <= 0:
            raise ValueError("a KV pool needs a positive capacity and block size")

    @classmethod
    def for_tokens(cls, tokens: int, block_size: int = 16) -> KVPool:
        return cls(capacity_blocks=tokens // block_size, block_size=block_size)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def fits(self, tokens: int, watermark: float = 1.0) -> bool:
        """Would reserving ``tokens`` keep usage within ``watermark`` of capacity?"""
        return self.used_blocks + self.blocks_for(tokens) <= self.capacity_blocks * watermark

    def reserve(self, tokens: int) -> int:
        blocks = self.blocks_for(tokens)
        if self.used_blocks + blocks > self.capacity_blocks:
            raise MemoryError(f"KV pool full: {blocks} blocks asked, "
                              f"{self.capacity_blocks - self.used_blocks} free")
        self.used_blocks += blocks
        return blocks

    def release(self, blocks: int) -> None:
        assert 0 <= blocks <= self.used_blocks, "releasing blocks that were never reserved"
        self.used_blocks -= blocks

    @property
    def capacity_tokens(self) -> int:
        return self.capacity_blocks * self.block_size
