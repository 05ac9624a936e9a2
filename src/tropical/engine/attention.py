"""Attention of a flat mixed batch over the paged KV cache, planned once per forward for every layer.

Queries come in groups: all decodes together (one query each, contexts padded to the longest), and each
longer span alone. A group's context is gathered block by block from the cache (one contiguous copy per
block, not per token), except a prompt with nothing cached, which attends to its own fresh K/V and skips
the cache. Query heads that share a KV head ride along as extra query rows, so K/V are never repeated.
A long span's queries go in chunks, each reading keys only up to its last query: causal attention then
skips most of the masked half of the score matrix instead of computing it and throwing it away.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tropical.engine.batch import FlatBatch

QUERY_CHUNK = 128


@dataclass(slots=True)
class AttentionGroup:
    """`spans` sequences with `queries` new tokens each, at flat rows `rows`, attending to `width` keys
    of which the last query sees the first `context`.

    `blocks` [spans * width / block_size] are the cache blocks holding the context (None: the group's own
    new K/V, a fresh prompt). `mask` [spans, 1, queries * heads_per_kv, width] is additive (0 to attend,
    -inf not to) over the query rows of one KV head: each query once per head sharing it.
    """

    rows: slice | torch.Tensor
    spans: int
    queries: int
    context: int
    blocks: torch.Tensor | None
    mask: torch.Tensor


@dataclass(slots=True)
class AttentionPlan:
    """Every group of a forward pass, in no particular order; together they cover every flat row once."""

    groups: list[AttentionGroup]

    @classmethod
    def build(cls, batch: FlatBatch, block_size: int, dtype: torch.dtype, heads_per_kv: int) -> AttentionPlan:
        """Masks come in `dtype` and already repeated for the `heads_per_kv` query heads of a KV head,
        so no layer converts or expands them again."""
        layout = _Layout(block_size, heads_per_kv, dtype, batch.input_ids.device)
        decodes = [i for i, n in enumerate(batch.lengths) if n == 1]
        groups = [_decode_group(batch, decodes, layout)] if decodes else []
        groups += [_span_group(batch, i, layout) for i, n in enumerate(batch.lengths) if n > 1]
        return cls(groups)


@dataclass(frozen=True, slots=True)
class _Layout:
    """What shapes a plan's tensors beyond the batch itself."""

    block_size: int
    heads_per_kv: int
    dtype: torch.dtype
    device: torch.device

    def row_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """[spans, queries, width] bool -> additive [spans, 1, queries * heads_per_kv, width]."""
        spans, queries, width = allowed.shape
        rows = allowed.unsqueeze(2).expand(spans, queries, self.heads_per_kv, width)
        mask = torch.zeros(rows.shape, dtype=self.dtype, device=self.device).masked_fill_(~rows, -torch.inf)
        return mask.view(spans, 1, -1, width)


def _decode_group(batch: FlatBatch, spans: list[int], layout: _Layout) -> AttentionGroup:
    """One query per span; contexts padded to the longest with block 0 and masked out."""
    device = layout.device
    contexts = [batch.cached[i] + 1 for i in spans]
    width = -(-max(contexts) // layout.block_size)
    tables = [batch.block_tables[i][:width] for i in spans]
    blocks = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=device)
    keys = torch.arange(width * layout.block_size, device=device)
    allowed = keys < torch.tensor(contexts, device=device).unsqueeze(1)
    rows = _rows([batch.starts[i] for i in spans], device)
    mask = layout.row_mask(allowed.unsqueeze(1))
    return AttentionGroup(rows, len(spans), 1, width * layout.block_size, blocks.flatten(), mask)


def _span_group(batch: FlatBatch, i: int, layout: _Layout) -> AttentionGroup:
    """A multi-token span: query q sees keys up to cached + q; a fresh prompt needs no cache blocks."""
    device, block_size = layout.device, layout.block_size
    length, cached = batch.lengths[i], batch.cached[i]
    width = -(-(cached + length) // block_size) * block_size if cached else length
    queries = torch.arange(length, device=device).unsqueeze(1) + cached
    allowed = torch.arange(width, device=device).unsqueeze(0) <= queries
    blocks = None
    if cached:
        table = batch.block_tables[i][: width // block_size]
        blocks = torch.tensor(table, dtype=torch.long, device=device)
    rows = slice(batch.starts[i], batch.starts[i] + length)
    return AttentionGroup(rows, 1, length, cached + length, blocks, layout.row_mask(allowed.unsqueeze(0)))


def _rows(starts: list[int], device: torch.device) -> slice | torch.Tensor:
    """A slice when the rows are consecutive (the worker puts decodes first), saving a gather and scatter."""
    if starts == list(range(starts[0], starts[0] + len(starts))):
        return slice(starts[0], starts[0] + len(starts))
    return torch.tensor(starts, dtype=torch.long, device=device)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: AttentionPlan,
    k_blocks: torch.Tensor,
    v_blocks: torch.Tensor,
) -> torch.Tensor:
    """Attention output [tokens, heads, head_dim] for q [tokens, heads, head_dim].

    k, v [tokens, kv_heads, head_dim] are this pass's new keys and values (already in the cache);
    k_blocks, v_blocks [blocks, block_size, kv_heads, head_dim] are one layer of the cache.
    """
    out = q.new_empty(q.shape)
    for group in plan.groups:
        if group.blocks is None:
            keys, values = k[group.rows].unsqueeze(0), v[group.rows].unsqueeze(0)
        else:
            keys = _gather(k_blocks, group, q.dtype)
            values = _gather(v_blocks, group, q.dtype)
        queries = q[group.rows].view(group.spans, group.queries, *q.shape[1:])
        out[group.rows] = _grouped_query_attention(queries, keys, values, group).flatten(0, 1)
    return out


def _gather(blocks: torch.Tensor, group: AttentionGroup, dtype: torch.dtype) -> torch.Tensor:
    """[spans, width, kv_heads, head_dim] context of each span, copied a block at a time."""
    assert group.blocks is not None
    gathered = blocks.index_select(0, group.blocks)
    return gathered.view(group.spans, -1, *blocks.shape[2:]).to(dtype)


def _grouped_query_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: AttentionGroup
) -> torch.Tensor:
    """q [S, n, H, D] against k, v [S, W, KVH, D] under the group's row mask -> [S, n, H, D].

    The H / KVH query heads of each KV head become H / KVH times as many query rows of one head.
    """
    spans, n, heads, dim = q.shape
    kv_heads = k.shape[2]
    per_kv = heads // kv_heads
    rows = q.view(spans, n, kv_heads, per_kv, dim).transpose(1, 2).reshape(spans, kv_heads, -1, dim)
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    out = torch.empty_like(rows)
    for start in range(0, n, QUERY_CHUNK):
        stop = min(n, start + QUERY_CHUNK)
        chunk, keys = slice(start * per_kv, stop * per_kv), group.context - (n - stop)
        out[:, :, chunk] = F.scaled_dot_product_attention(
            rows[:, :, chunk], k[:, :, :keys], v[:, :, :keys], attn_mask=group.mask[:, :, chunk, :keys]
        )
    return out.view(spans, kv_heads, n, per_kv, dim).transpose(1, 2).reshape(spans, n, heads, dim)
