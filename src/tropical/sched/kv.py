"""KV-cache accounting in fixed-size blocks: the only memory a worker hands out.

Requests reserve blocks before they run and never exceed the pool, so nothing over-commits:
a request that does not fit waits. With a prefix cache, blocks of computed prompts outlive their
requests: referenced ones count as used, unreferenced ones as free (evicted when room is needed).
"""

from __future__ import annotations

from dataclasses import dataclass

from tropical.core.request import Request
from tropical.sched.prefix_cache import PrefixCache


@dataclass(slots=True)
class KVPool:
    """Free and used blocks of one worker's KV cache, and its prefix cache if it keeps one.

    Invariant: ``used_blocks`` plus the cache's ``free_blocks`` never exceed ``capacity_blocks``.
    """

    capacity_blocks: int
    block_size: int = 16
    used_blocks: int = 0
    cache: PrefixCache | None = None

    def __post_init__(self) -> None:
        if self.capacity_blocks <= 0 or self.block_size <= 0:
            raise ValueError("a KV pool needs a positive capacity and block size")

    @classmethod
    def for_tokens(cls, tokens: int, block_size: int = 16, prefix_cache: bool = False) -> KVPool:
        return cls(capacity_blocks=tokens // block_size, block_size=block_size,
                   cache=PrefixCache(block_size) if prefix_cache else None)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def fits(self, tokens: int, watermark: float = 1.0, revived: int = 0) -> bool:
        """Would reserving ``tokens`` (and referencing ``revived`` free cached blocks) keep usage
        within ``watermark`` of capacity? Unreferenced cached blocks count as free."""
        return self.used_blocks + revived + self.blocks_for(tokens) <= self.capacity_blocks * watermark

    def room_tokens(self) -> int:
        """The most tokens that ``fits`` (watermark 1): the free blocks' tokens, so that a sum of
        prompts can stop as soon as it is past them."""
        return (self.capacity_blocks - self.used_blocks) * self.block_size

    def reserve(self, tokens: int) -> int:
        blocks = self.blocks_for(tokens)
        if self.used_blocks + blocks > self.capacity_blocks:
            raise MemoryError(f"KV pool full: {blocks} blocks asked, "
                              f"{self.capacity_blocks - self.used_blocks} free")
        if self.cache is not None:
            self.cache.evict(self.used_blocks + blocks + self.cache.free_blocks - self.capacity_blocks)
        self.used_blocks += blocks
        return blocks

    def release(self, blocks: int) -> None:
        assert 0 <= blocks <= self.used_blocks, "releasing blocks that were never reserved"
        self.used_blocks -= blocks

    def pin(self, req: Request) -> int:
        """Reference the run of ``req``'s prompt cached here; returns its tokens (0 without a
        cache)."""
        if self.cache is None:
            return 0
        self.used_blocks += self.cache.pin(req)
        if self.cache.host is not None:     # blocks loaded from host memory take room
            self.cache.evict(self.used_blocks + self.cache.free_blocks - self.capacity_blocks)
        return self.held_tokens(req)

    def store(self, req: Request, tokens: int) -> int:
        """``req``'s first ``tokens`` prompt tokens are computed here: their full prefix blocks
        enter the cache. Returns the blocks of ``req``'s own reservation the cache now holds."""
        if self.cache is None or not req.prefix:
            return 0
        moved, copies, revived = self.cache.store(req, tokens)
        self.used_blocks += revived - copies
        return moved

    def held_tokens(self, req: Request) -> int:
        """Prompt tokens of ``req`` in cached blocks it references here (0 without a cache)."""
        return 0 if self.cache is None else self.cache.held_tokens(req)

    def unpin(self, req: Request) -> None:
        """``req`` leaves: its cached blocks stay cached, free once nobody references them."""
        if self.cache is not None:
            self.used_blocks -= self.cache.release(req)

    @property
    def capacity_tokens(self) -> int:
        return self.capacity_blocks * self.block_size
