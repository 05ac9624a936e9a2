"""The ideal cluster-wide caches behind the cache-aware bounds: unbounded, every reusable prefix
hits; bounded, what each eviction order keeps."""

from __future__ import annotations

from tropical.sim.ideal_cache import FURTHEST, LRU, REUSED, ideal_hits
from tropical.workload.trace import PREFIX_BLOCK_TOKENS, TraceEntry

B = PREFIX_BLOCK_TOKENS


def entry(*keys: int, tokens: int | None = None) -> TraceEntry:
    return TraceEntry(0.0, tokens or len(keys) * B, 1, keys)


def test_unbounded_every_reusable_prefix_hits_up_to_the_first_miss_and_below_the_last_token() -> None:
    trace = [entry(1, 2, 3), entry(1, 2, 9), entry(1, 5, 3), entry(1, 2, 3)]
    assert ideal_hits(trace, 16) == [0, 2 * B, B, 3 * B - 16]


def test_a_bounded_cache_keeps_what_its_eviction_order_keeps() -> None:
    """Room for two blocks: after a, b, c the furthest-next-use cache has dropped b (wanted last)
    and keeps each new block out, so a and then c hit; least recently used dropped a, and each
    request's new pair pushes out what the next one wants, so nothing hits."""
    trace = [entry(10), entry(20), entry(30), entry(10, 40), entry(30, 50), entry(20, 60)]
    furthest = ideal_hits(trace, 16, 2 * B, FURTHEST)
    lru = ideal_hits(trace, 16, 2 * B, LRU)
    assert furthest[3:] == [B, B, 0]
    assert lru[3:] == [0, 0, 0]
    unbounded = ideal_hits(trace, 16)
    assert all(f <= u and r <= u for f, r, u in zip(furthest, lru, unbounded, strict=True))


def test_a_frequency_aware_order_keeps_a_block_used_again_over_newer_ones_used_once() -> None:
    """Room for two blocks: block 10 is used twice, then 20 and 30 once each. Least recently
    used drops 10 (the oldest) for 30, so 10's next use misses; used again kept longer drops
    20 instead, and 10 hits."""
    trace = [entry(10), entry(10), entry(20), entry(30), entry(10)]
    assert ideal_hits(trace, 16, 2 * B, LRU)[4] == 0
    assert ideal_hits(trace, 16, 2 * B, REUSED)[4] == B - 16
