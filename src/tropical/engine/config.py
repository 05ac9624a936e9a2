"""Model shape read from a Hugging Face Llama-style config.json, so the engine never imports transformers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tropical.core.specs import ModelSpec

_SCALING_TYPES = ("linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """How RoPE frequencies are stretched for long contexts; mirrors transformers' rope types of that name.

    llama3 reads the freq factors, yarn the betas and attention scaling; both the original context.
    """

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    @classmethod
    def from_hf(cls, scaling: dict[str, Any] | None, max_positions: int) -> RopeScaling | None:
        """None for plain RoPE; old configs say "type", new ones "rope_type"."""
        if not scaling:
            return None
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type == "default":
            return None
        if rope_type not in _SCALING_TYPES:
            raise ValueError(f"unsupported rope scaling {rope_type!r}; supported: {_SCALING_TYPES}")
        if "factor" not in scaling:
            raise ValueError("rope scaling is missing 'factor'")
        factor = float(scaling["factor"])
        original = int(scaling.get("original_max_position_embeddings") or max_positions)
        if rope_type == "llama3":
            return cls("llama3", factor, float(scaling.get("low_freq_factor", 1.0)),
                       float(scaling.get("high_freq_factor", 4.0)), original)
        if rope_type == "yarn":
            return cls("yarn", factor, original_max_position_embeddings=original,
                       beta_fast=float(scaling.get("beta_fast") or 32.0),
                       beta_slow=float(scaling.get("beta_slow") or 1.0),
                       attention_factor=_optional_float(scaling.get("attention_factor")),
                       mscale=_optional_float(scaling.get("mscale")),
                       mscale_all_dim=_optional_float(scaling.get("mscale_all_dim")),
                       truncate=bool(scaling.get("truncate", True)))
        return cls(rope_type, factor)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The numbers the forward pass and the KV cache need; defaults follow transformers' LlamaConfig."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelConfig:
        """Accepts both the old (rope_theta, rope_scaling) and the transformers 5 (rope_parameters)
        layout; the dimensions come from core's ModelSpec, the one reader of them."""
        shape = ModelSpec.from_hf_config(str(config.get("_name_or_path") or "model"), config)
        max_positions = int(config.get("max_position_embeddings") or 2048)
        rope = config.get("rope_parameters") or {}
        scaling = config.get("rope_scaling") or rope
        return cls(
            hidden_size=shape.hidden,
            num_hidden_layers=shape.num_layers,
            num_attention_heads=shape.num_q_heads,
            num_key_value_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            intermediate_size=shape.intermediate,
            vocab_size=shape.vocab,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(config.get("rope_theta") or rope.get("rope_theta", 10000.0)),
            rope_scaling=RopeScaling.from_hf(scaling, max_positions),
            tie_word_embeddings=shape.tied_embeddings,
            max_position_embeddings=max_positions,
        )
