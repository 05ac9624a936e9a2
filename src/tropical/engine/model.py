"""Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU) running one flat pass over a mixed batch of spans.

Parameter names match Hugging Face's LlamaForCausalLM, so its state dict loads as is. Linear layers see all
new tokens concatenated; only attention looks at span boundaries, reading keys through the paged cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tropical.engine.batch import FlatBatch
from tropical.engine.config import ModelConfig, RopeScaling
from tropical.engine.kv_cache import PagedKVCache


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as transformers does, so bf16 runs stay close to it."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies per rotary pair, with linear or llama3 scaling applied."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    return _llama3_inv_freq(inv_freq, scaling)


def _llama3_inv_freq(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, blend smoothly in between."""
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rotary(nn.Module):
    """cos/sin tables for every position up to max_position_embeddings, looked up by absolute position."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, rope_inv_freq(config))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x [tokens, heads, head_dim] by each token's position."""
        cos = self.cos[positions].unsqueeze(1).to(x.dtype)
        sin = self.sin[positions].unsqueeze(1).to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


@dataclass(slots=True)
class AttentionPlan:
    """Which cache slots each query attends to; built once per forward and shared by every layer."""

    decode_tokens: torch.Tensor
    decode_slots: torch.Tensor
    decode_mask: torch.Tensor
    prefills: list[tuple[int, int, torch.Tensor, torch.Tensor]]

    @classmethod
    def build(cls, batch: FlatBatch, block_size: int) -> AttentionPlan:
        """Decode spans go into one padded group; longer spans each get a causal mask offset by `cached`."""
        device = batch.input_ids.device
        decodes = [i for i, n in enumerate(batch.lengths) if n == 1]
        contexts = [_context_slots(batch.block_tables[i], batch.cached[i] + 1, block_size) for i in decodes]
        width = max((len(c) for c in contexts), default=0)
        slots = [c + [0] * (width - len(c)) for c in contexts]
        mask = [[True] * len(c) + [False] * (width - len(c)) for c in contexts]
        prefills = [cls._prefill(batch, i, block_size) for i, n in enumerate(batch.lengths) if n > 1]
        return cls(
            decode_tokens=torch.tensor([batch.starts[i] for i in decodes], dtype=torch.long, device=device),
            decode_slots=torch.tensor(slots, dtype=torch.long, device=device).reshape(len(decodes), width),
            decode_mask=torch.tensor(mask, dtype=torch.bool, device=device).reshape(
                len(decodes), 1, 1, width
            ),
            prefills=prefills,
        )

    @staticmethod
    def _prefill(batch: FlatBatch, i: int, block_size: int) -> tuple[int, int, torch.Tensor, torch.Tensor]:
        """(start, length, context slots, mask): query q sees keys up to cached + q."""
        device = batch.input_ids.device
        length, cached = batch.lengths[i], batch.cached[i]
        slots = _context_slots(batch.block_tables[i], cached + length, block_size)
        queries = torch.arange(length, device=device).unsqueeze(1) + cached
        mask = torch.arange(cached + length, device=device).unsqueeze(0) <= queries
        return batch.starts[i], length, torch.tensor(slots, dtype=torch.long, device=device), mask


def _context_slots(table: list[int], tokens: int, block_size: int) -> list[int]:
    return [table[p // block_size] * block_size + p % block_size for p in range(tokens)]


class Attention(nn.Module):
    """GQA self-attention that writes new K/V into the paged cache and reads context back through it."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, batch: FlatBatch, plan: AttentionPlan, cache: PagedKVCache, rotary: Rotary
    ) -> torch.Tensor:
        q = rotary(self.q_proj(x).view(-1, self.heads, self.head_dim), batch.positions)
        k = rotary(self.k_proj(x).view(-1, self.kv_heads, self.head_dim), batch.positions)
        v = self.v_proj(x).view(-1, self.kv_heads, self.head_dim)
        k_cache, v_cache = cache.flat(self.layer)
        k_cache[batch.slot_mapping] = k.to(k_cache.dtype)
        v_cache[batch.slot_mapping] = v.to(v_cache.dtype)
        out = torch.empty_like(q)
        if len(plan.decode_tokens):
            out[plan.decode_tokens] = self._decode(q[plan.decode_tokens], plan, k_cache, v_cache)
        for start, length, slots, mask in plan.prefills:
            out[start : start + length] = _attend(
                q[start : start + length], k_cache[slots], v_cache[slots], mask
            )
        return self.o_proj(out.flatten(1))

    def _decode(
        self, q: torch.Tensor, plan: AttentionPlan, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """All single-token spans at once: keys padded to the longest context and masked."""
        k = k_cache[plan.decode_slots].transpose(1, 2).to(q.dtype)
        v = v_cache[plan.decode_slots].transpose(1, 2).to(q.dtype)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), k, v, attn_mask=plan.decode_mask, enable_gqa=True
        )
        return out.squeeze(2)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One span: q [n, H, D] against k, v [ctx, KVH, D] under a [n, ctx] mask."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1).to(q.dtype),
        v.transpose(0, 1).to(q.dtype),
        attn_mask=mask,
        enable_gqa=True,
    )
    return out.transpose(0, 1)


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention then MLP."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, batch: FlatBatch, plan: AttentionPlan, cache: PagedKVCache, rotary: Rotary
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), batch, plan, cache, rotary)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """The `model.` part of LlamaForCausalLM: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = Rotary(config)


class LlamaModel(nn.Module):
    """Causal LM over a FlatBatch: returns logits of each span's last new token."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_load_state_dict_pre_hook(_fill_hf_state_dict)

    @torch.inference_mode()
    def forward(self, batch: FlatBatch, cache: PagedKVCache) -> torch.Tensor:
        """[num_spans, vocab] logits; writes every new token's K/V into `cache` on the way."""
        self._check_positions(batch)
        plan = AttentionPlan.build(batch, cache.block_size)
        x = self.model.embed_tokens(batch.input_ids)
        for layer in self.model.layers:
            x = layer(x, batch, plan, cache, self.model.rotary)
        last = torch.tensor(batch.last_token_index, dtype=torch.long, device=x.device)
        return self.lm_head(self.model.norm(x[last]))

    def _check_positions(self, batch: FlatBatch) -> None:
        longest = max(span.total for span in batch.spans)
        if longest > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence of {longest} tokens exceeds max_position_embeddings "
                f"({self.config.max_position_embeddings})"
            )


def _fill_hf_state_dict(
    module: LlamaModel, state_dict: dict[str, torch.Tensor], prefix: str, *_: object
) -> None:
    """Tied checkpoints omit lm_head.weight, and older ones carry a rotary inv_freq buffer we recompute."""
    head, embed = prefix + "lm_head.weight", prefix + "model.embed_tokens.weight"
    if module.config.tie_word_embeddings and head not in state_dict and embed in state_dict:
        state_dict[head] = state_dict[embed]
    for key in [k for k in state_dict if k.endswith("rotary_emb.inv_freq")]:
        del state_dict[key]
