"""What a worker's prefix cache did in an iteration, in the shape of vLLM's KV events, so the
router's model of each worker's cache follows the real one."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tropical.sched.prefix_cache import PrefixCache


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


def follow(model: PrefixCache, events: Iterable[KVEvent]) -> list[int]:
    """Bring the scheduler's ``model`` of a worker's cache in line with what the worker reports,
    before the model books the step the events come from: a block the worker evicted (and did not
    store again) leaves the model, which stores blocks itself as it books each prompt, as the
    worker does. Returns evicted blocks the model has referenced (where the two disagree)."""
    gone: dict[int, bool] = {}
    for event in events:
        for key in event.block_hashes:
            gone[key] = isinstance(event, BlockRemoved)
    return model.forget(key for key, removed in gone.items() if removed)
