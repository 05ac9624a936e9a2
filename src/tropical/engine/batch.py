"""A step's work as spans of new tokens per sequence, flattened into the tensors one forward pass consumes.

Prefill, a prefill chunk and a decode are the same thing with different numbers (vLLM v1's idea): a span
of new tokens after `cached` tokens already in the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tropical.engine.kv_cache import PagedKVCache
from tropical.sched.step import Span


@dataclass(slots=True)
class FlatBatch:
    """All spans' new tokens concatenated, with where each lives in the flat order and in the cache."""

    spans: list[Span]
    input_ids: torch.Tensor
    positions: torch.Tensor
    starts: list[int]
    lengths: list[int]
    cached: list[int]
    slot_mapping: torch.Tensor
    block_tables: list[list[int]]

    @classmethod
    def build(cls, spans: list[Span], cache: PagedKVCache) -> FlatBatch:
        """Reserve cache blocks for every span (all or nothing) and lay the tokens out flat."""
        _reserve(spans, cache)
        starts, offset = [], 0
        for span in spans:
            starts.append(offset)
            offset += len(span.token_ids)
        device = cache.device
        ids = [t for span in spans for t in span.token_ids]
        positions = [p for span in spans for p in range(span.cached, span.total)]
        slots = [s for span in spans for s in cache.slots(span.seq_id, span.cached, span.total)]
        return cls(
            spans=list(spans),
            input_ids=torch.tensor(ids, dtype=torch.long, device=device),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
            starts=starts,
            lengths=[len(span.token_ids) for span in spans],
            cached=[span.cached for span in spans],
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            block_tables=[cache.block_table(span.seq_id) for span in spans],
        )

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def last_token_index(self) -> list[int]:
        """Flat index of each span's last new token: the one whose logits the caller samples."""
        return [start + length - 1 for start, length in zip(self.starts, self.lengths, strict=True)]


def _reserve(spans: list[Span], cache: PagedKVCache) -> None:
    """Start new sequences on their cached prefix, then check the whole batch fits before growing
    any sequence, so a failed build changes nothing."""
    seq_ids = [span.seq_id for span in spans]
    if len(set(seq_ids)) != len(seq_ids):
        raise ValueError("a batch holds at most one span per sequence")
    started = []
    try:
        for span in spans:
            if not cache.has(span.seq_id):
                cache.begin(span.seq_id, span.block_hashes, span.cached)
                started.append(span.seq_id)
        needed = sum(cache.blocks_needed(span.seq_id, span.total) for span in spans)
        if needed > cache.num_free_blocks:
            raise MemoryError(f"KV cache out of blocks: batch needs {needed}, {cache.num_free_blocks} free")
    except (MemoryError, ValueError):
        for seq_id in started:
            cache.free(seq_id)
        raise
    for span in spans:
        cache.ensure(span.seq_id, span.total)
