"""Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU) running one flat pass over a mixed batch of spans.

Parameter names match Hugging Face's LlamaForCausalLM, so its state dict loads as is. Linear layers see all
new tokens concatenated; only attention looks at span boundaries, reading keys through the paged cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tropical.engine.attention import AttentionPlan, attend
from tropical.engine.batch import FlatBatch
from tropical.engine.config import ModelConfig
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.rope import Rotary, rotate


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


def _fuse_projections(module: nn.Module, fused: str, parts: dict[str, int]) -> None:
    """Let `module.<fused>` hold several bias-free projections of one input, stacked in `parts` order
    (name -> output rows), while its state dicts keep Hugging Face's separate names: one matmul instead
    of several, and checkpoints load and save as if the projections were apart."""

    def join(_: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str, *__: object) -> None:
        keys = [f"{prefix}{name}.weight" for name in parts]
        if all(key in state_dict for key in keys):
            state_dict[f"{prefix}{fused}.weight"] = torch.cat([state_dict.pop(key) for key in keys])

    def split(_: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str, __: object) -> None:
        weight = state_dict.pop(f"{prefix}{fused}.weight")
        for name, part in zip(parts, weight.split(list(parts.values())), strict=True):
            state_dict[f"{prefix}{name}.weight"] = part

    module.register_load_state_dict_pre_hook(join)
    module.register_state_dict_post_hook(split)


@dataclass(slots=True)
class StepContext:
    """What every layer of one forward pass shares, built once: rotary angles, attention plan, cache."""

    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    plan: AttentionPlan
    cache: PagedKVCache


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
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, q + 2 * kv, bias=False)
        self.o_proj = nn.Linear(q, config.hidden_size, bias=False)
        _fuse_projections(self, "qkv_proj", {"q_proj": q, "k_proj": kv, "v_proj": kv})

    def forward(self, x: torch.Tensor, step: StepContext) -> torch.Tensor:
        qkv = self.qkv_proj(x).view(x.shape[0], self.heads + 2 * self.kv_heads, self.head_dim)
        # q and k sit side by side in the fused output, so one rotation covers both.
        rotated = self.heads + self.kv_heads
        qk = rotate(qkv[:, :rotated], step.cos, step.sin)
        q, k, v = qk[:, : self.heads], qk[:, self.heads :], qkv[:, rotated:]
        k_blocks, v_blocks = step.cache.k[self.layer], step.cache.v[self.layer]
        k_blocks.flatten(0, 1).index_copy_(0, step.slots, k.to(k_blocks.dtype))
        v_blocks.flatten(0, 1).index_copy_(0, step.slots, v.to(v_blocks.dtype))
        return self.o_proj(attend(q, k, v, step.plan, k_blocks, v_blocks).flatten(1))


class MLP(nn.Module):
    """SwiGLU feed-forward, gate and up projections in one matmul."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, config.hidden_size, bias=False)
        _fuse_projections(self, "gate_up_proj", {"gate_proj": inter, "up_proj": inter})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention then MLP."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, step: StepContext) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), step)
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
    def forward(self, batch: FlatBatch, cache: PagedKVCache, also: list[int] | None = None) -> torch.Tensor:
        """[num_spans, vocab] logits of each span's last token, then those of the flat token
        indices ``also`` names (prompt logprobs); writes every new token's K/V into `cache`."""
        self._check_positions(batch)
        x = self.model.embed_tokens(batch.input_ids)
        step = self._step_context(batch, cache, x.dtype)
        for layer in self.model.layers:
            x = layer(x, step)
        index = batch.last_token_index + also if also else batch.last_token_index
        last = torch.tensor(index, dtype=torch.long, device=x.device)
        return self.lm_head(self.model.norm(x[last]))

    def _step_context(self, batch: FlatBatch, cache: PagedKVCache, dtype: torch.dtype) -> StepContext:
        heads_per_kv = self.config.num_attention_heads // self.config.num_key_value_heads
        cos, sin = self.model.rotary(batch.positions)
        plan = AttentionPlan.build(batch, cache.block_size, dtype, heads_per_kv)
        return StepContext(cos, sin, batch.slot_mapping, plan, cache)

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
