"""Paged KV cache and batch flattening: block accounting, all-or-nothing growth, export/import."""

from __future__ import annotations

import pytest
import torch

from tropical.engine.batch import FlatBatch, Span
from tropical.engine.config import ModelConfig
from tropical.engine.kv_cache import PagedKVCache

CONFIG = ModelConfig(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=4,
    intermediate_size=32,
    vocab_size=64,
)


def _cache(blocks: int = 4) -> PagedKVCache:
    return PagedKVCache(CONFIG, num_blocks=blocks, block_size=4)


def test_storage_is_preallocated_per_layer_and_block() -> None:
    cache = _cache()
    assert cache.k.shape == cache.v.shape == (2, 4, 4, 2, 4)
    assert cache.num_free_blocks == 4 and cache.used_blocks == 0


def test_ensure_grows_by_whole_blocks_only_when_needed() -> None:
    cache = _cache()
    cache.ensure("a", 5)
    assert len(cache.block_table("a")) == 2
    cache.ensure("a", 8)
    assert len(cache.block_table("a")) == 2
    cache.ensure("a", 9)
    assert len(cache.block_table("a")) == 3 and cache.used_blocks == 3


def test_out_of_blocks_raises_and_changes_nothing() -> None:
    cache = _cache()
    cache.ensure("a", 6)
    table = cache.block_table("a")
    with pytest.raises(MemoryError, match="out of blocks"):
        cache.ensure("a", 17)
    with pytest.raises(MemoryError, match="out of blocks"):
        cache.ensure("b", 9)
    assert cache.block_table("a") == table
    assert not cache.has("b") and cache.num_free_blocks == 2


def test_free_returns_blocks_for_reuse() -> None:
    cache = _cache()
    cache.ensure("a", 16)
    cache.free("a")
    cache.free("a")
    assert cache.num_free_blocks == 4 and not cache.has("a")
    cache.ensure("b", 16)
    assert sorted(cache.block_table("b")) == [0, 1, 2, 3]


def test_export_then_import_copies_kv_into_other_blocks() -> None:
    source, target = _cache(), _cache(blocks=6)
    target.ensure("other", 8)
    source.ensure("a", 7)
    for layer in range(2):
        k, v = source.flat(layer)
        slots = torch.tensor(source.slots("a", 0, 7))
        k[slots] = torch.randn(7, 2, 4)
        v[slots] = torch.randn(7, 2, 4)
    buffer = source.export("a", 7)
    assert buffer.shape == (2, 2, 7, 2, 4) and buffer.is_contiguous()
    target.import_("a", buffer)
    assert torch.equal(target.export("a", 7), buffer)
    assert set(target.block_table("a")).isdisjoint(target.block_table("other"))


def test_import_refuses_a_wrong_shape_or_a_known_sequence() -> None:
    cache = _cache()
    with pytest.raises(ValueError, match="shape"):
        cache.import_("a", torch.zeros(2, 2, 3, 2, 5))
    cache.ensure("a", 1)
    with pytest.raises(ValueError, match="already"):
        cache.import_("a", torch.zeros(2, 2, 3, 2, 4))


def test_flat_batch_lays_spans_out_with_positions_and_slots() -> None:
    cache = _cache()
    cache.ensure("dec", 3)
    batch = FlatBatch.build([Span("pre", [1, 2, 3, 4, 5], 0), Span("dec", [9], 3)], cache)
    assert batch.input_ids.tolist() == [1, 2, 3, 4, 5, 9]
    assert batch.positions.tolist() == [0, 1, 2, 3, 4, 3]
    assert batch.starts == [0, 5] and batch.lengths == [5, 1] and batch.cached == [0, 3]
    assert batch.last_token_index == [4, 5]
    pre, dec = batch.block_tables
    expected = [pre[0] * 4 + i for i in range(4)] + [pre[1] * 4, dec[0] * 4 + 3]
    assert batch.slot_mapping.tolist() == expected


def test_flat_batch_that_does_not_fit_reserves_nothing() -> None:
    cache = _cache()
    with pytest.raises(MemoryError):
        FlatBatch.build([Span("a", [1] * 8, 0), Span("b", [1] * 9, 0)], cache)
    assert cache.num_free_blocks == 4 and not cache.has("a")


def test_bad_spans_are_refused() -> None:
    with pytest.raises(ValueError, match="no new tokens"):
        Span("a", [], 0)
    with pytest.raises(ValueError, match="one span per sequence"):
        FlatBatch.build([Span("a", [1], 0), Span("a", [2], 1)], _cache())
