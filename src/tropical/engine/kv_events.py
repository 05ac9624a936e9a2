"""What a worker's prefix cache did in an iteration, in the shape of vLLM's KV events, so the
router's model of each worker's cache follows the real one."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks entered the cache: ``block_hashes`` in prompt order, chained after
    ``parent_block_hash`` (None: they start a prompt)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Cached blocks were evicted to make room: their KV is gone."""

    block_hashes: tuple[int, ...]


KVEvent = BlockStored | BlockRemoved


def replay(events: Iterable[KVEvent], cached: Iterable[int] = ()) -> set[int]:
    """The block hashes a cache holds after ``events``, starting from ``cached``."""
    held = set(cached)
    for event in events:
        if isinstance(event, BlockStored):
            held.update(event.block_hashes)
        else:
            held.difference_update(event.block_hashes)
    return held
