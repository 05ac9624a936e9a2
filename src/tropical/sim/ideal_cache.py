"""Prefix hits on an ideal cluster-wide cache, for the bounds (DESIGN.md §6).

Every request of a trace, in arrival order, finds the run of its prefix blocks from the first
that an earlier request computed, and its hit is that run, at most all of its whole KV blocks
but the one holding its last token (as a worker's cache counts it). Unbounded, every reusable
prefix hits: no cache can reuse more. Bounded to the cluster's KV, blocks are evicted furthest
next use first (Belady's choice): a cache of that size under any policy of eviction would hit
about as much at most (the KV that running requests hold is not counted against it); or least
recently used first, as the engines' caches evict, for what such a cache reaches without
knowing the future; or, among those, the blocks used only once before the blocks used again
(a frequency-aware order, as SGLang's ``lfu`` eviction leans), for what a smarter order without
the future could add.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from tropical.workload.trace import TraceEntry

FURTHEST, LRU, REUSED = "furthest next use", "least recently used", "used again kept longer"


def ideal_hits(entries: Sequence[TraceEntry], block_size: int, capacity_tokens: int | None = None,
               eviction: str = FURTHEST) -> list[int]:
    """Each entry's cached prompt tokens on one cluster-wide cache (unbounded when
    ``capacity_tokens`` is None), evicting by ``eviction``."""
    following = _next_uses(entries)
    cached: dict[int, int] = {}
    uses: dict[int, int] = {}
    due: dict[int, float] = {}
    horizon: list[tuple[float, int]] = []
    size, hits = 0, []
    for i, entry in enumerate(entries):
        hits.append(_run(entry, cached, block_size))
        for j, key in enumerate(entry.prefix_blocks):
            tokens = entry.block_tokens(j)
            if key not in cached:
                cached[key] = tokens - tokens % block_size
                size += cached[key]
            uses[key] = uses.get(key, 0) + 1
            due[key] = _due(eviction, following[i][j], i, uses[key], len(entries))
            heapq.heappush(horizon, (-due[key], key))
        while capacity_tokens is not None and size > capacity_tokens:
            when, key = heapq.heappop(horizon)
            if key in cached and due[key] == -when:       # not a stale entry of the heap
                size -= cached.pop(key)
    return hits


def _due(eviction: str, next_use: float, now: int, uses: int, horizon: int) -> float:
    """A block's place in ``eviction``'s order: the largest goes first. Least recently used:
    the oldest use; used again kept longer: the same, after every block used only once."""
    if eviction == FURTHEST:
        return next_use
    return -now - (horizon if eviction == REUSED and uses > 1 else 0)


def _run(entry: TraceEntry, cached: dict[int, int], block_size: int) -> int:
    """Tokens of ``entry``'s prompt cached as a run of blocks from its first, capped."""
    tokens = 0
    for key in entry.prefix_blocks:
        if key not in cached:
            break
        tokens += cached[key]
    return min(tokens, (entry.input_len - 1) // block_size * block_size)


def _next_uses(entries: Sequence[TraceEntry]) -> list[list[float]]:
    """For each entry's each block, the index of the next entry naming the same key (inf if
    none)."""
    seen: dict[int, int] = {}
    following: list[list[float]] = [[math.inf] * len(e.prefix_blocks) for e in entries]
    for i in range(len(entries) - 1, -1, -1):
        for j, key in enumerate(entries[i].prefix_blocks):
            following[i][j] = seen.get(key, math.inf)
            seen[key] = i
    return following
