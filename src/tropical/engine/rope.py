"""Rotary position embedding: frequencies for each RoPE scaling type, and cos/sin tables by position.

The frequency functions follow transformers' ROPE_INIT_FUNCTIONS (default, linear, llama3, dynamic, yarn),
so a checkpoint rotates its queries and keys here exactly as it did in training.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tropical.engine.config import ModelConfig, RopeScaling


def rope_parameters(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequency per rotary pair, factor on cos and sin); only yarn scales cos and sin."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = config.rope_scaling
    # Dynamic NTK raises the base only once a sequence outgrows max_position_embeddings, which the model
    # refuses; within range it is plain RoPE, as transformers computes it at init.
    if s is None or s.rope_type == "dynamic":
        return inv_freq, 1.0
    if s.rope_type == "linear":
        return inv_freq / s.factor, 1.0
    if s.rope_type == "llama3":
        return _llama3(inv_freq, s), 1.0
    return _yarn(inv_freq, s, config), _yarn_attention_factor(s)


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
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


def _yarn(inv_freq: torch.Tensor, s: RopeScaling, config: ModelConfig) -> torch.Tensor:
    """YaRN: interpolate (divide by `factor`) the dimensions that rotate fewer than beta_slow times over
    the original context, extrapolate those that rotate more than beta_fast times, ramp linearly between."""
    dim, base, context = config.head_dim, config.rope_theta, s.original_max_position_embeddings

    def dimension(rotations: float) -> float:
        return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension(s.beta_fast), dimension(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / ((high - low) or 0.001)).clamp(0, 1)
    return inv_freq / s.factor * ramp + inv_freq * (1 - ramp)


def _yarn_attention_factor(s: RopeScaling) -> float:
    """YaRN's softmax temperature fix, folded into cos and sin so q.k scales by its square."""
    if s.attention_factor is not None:
        return s.attention_factor
    if s.mscale and s.mscale_all_dim:
        return _mscale(s.factor, s.mscale) / _mscale(s.factor, s.mscale_all_dim)
    return _mscale(s.factor, 1.0)


def _mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class Rotary(nn.Module):
    """cos/sin tables for every position up to max_position_embeddings, looked up by absolute position.

    The tables are buffers, so `model.to(dtype)` converts them once instead of every forward.
    """

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        inv_freq, scale = rope_parameters(config)
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * scale, persistent=False)
        self.register_buffer("sin", emb.sin() * scale, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [tokens, 1, head_dim] of each position, broadcastable over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [tokens, heads, head_dim] by the angles in cos/sin (transformers' rotate_half layout)."""
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.cat((-x[..., half:], x[..., :half]), dim=-1), sin)
