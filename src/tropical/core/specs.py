"""Model, hardware and worker specs: the numbers every latency prediction starts from.

Pure data: a ModelSpec is built from the dict of a Hugging Face ``config.json`` (reading the
file is the caller's job), so the simulator and the server size things the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GIB = 2**30
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A Llama-family decoder's shape, enough to count parameters, FLOPs and KV bytes."""

    name: str
    num_layers: int
    hidden: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_context: int
    tied_embeddings: bool = False
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden", "num_q_heads", "num_kv_heads", "head_dim",
                     "intermediate", "vocab", "max_context", "dtype_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model {self.name!r}: {name} must be positive")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"model {self.name!r}: num_q_heads must be a multiple of num_kv_heads")

    @classmethod
    def from_hf_config(cls, name: str, config: dict[str, Any], dtype_bytes: int = 2) -> ModelSpec:
        """Read the fields of a Hugging Face config.json (Llama, InternLM, InternLM2, SmolLM); the
        one reader of its dimensions (the engine's ModelConfig takes them from here)."""
        missing = [key for key in _REQUIRED if config.get(key) is None]
        if missing:
            raise ValueError(f"model {name!r}: config.json lacks the field(s) {', '.join(missing)}")
        hidden = int(config["hidden_size"])
        q_heads = int(config["num_attention_heads"])
        return cls(
            name=name,
            num_layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            num_q_heads=q_heads,
            num_kv_heads=int(config.get("num_key_value_heads") or q_heads),
            head_dim=int(config.get("head_dim") or hidden // q_heads),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            max_context=_max_context(config),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            dtype_bytes=dtype_bytes,
        )

    @property
    def q_dim(self) -> int:
        return self.num_q_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        attn = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return attn + mlp + 2 * self.hidden

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.num_layers * self.layer_params + embeddings + self.hidden

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Key and value vectors of one token across all layers."""
        return 2 * self.num_layers * self.kv_dim * self.dtype_bytes


def _max_context(config: dict[str, Any]) -> int:
    """Context window including linear/dynamic RoPE scaling, as InternLM2's 200K config states."""
    base = int(config.get("max_position_embeddings", 4096))
    scaling = config.get("rope_scaling") or {}
    factor = float(scaling.get("factor", 1.0)) if isinstance(scaling, dict) else 1.0
    return int(base * max(factor, 1.0))


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator: dense half-precision peak, memory size and bandwidth, its link to other
    GPUs, and its link to host memory (PCIe, one direction: what a host-memory KV tier loads
    over)."""

    name: str
    peak_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    link_bandwidth: float
    host_bandwidth: float

    def __post_init__(self) -> None:
        for name in ("peak_flops", "hbm_bytes", "hbm_bandwidth", "link_bandwidth", "host_bandwidth"):
            if getattr(self, name) <= 0:
                raise ValueError(f"hardware {self.name!r}: {name} must be positive")


A100_80GB = HardwareSpec("a100-80gb", peak_flops=312e12, hbm_bytes=80 * GIB,
                         hbm_bandwidth=2.039e12, link_bandwidth=300e9, host_bandwidth=31.5e9)
H100_80GB = HardwareSpec("h100-80gb", peak_flops=989e12, hbm_bytes=80 * GIB,
                         hbm_bandwidth=3.35e12, link_bandwidth=450e9, host_bandwidth=63e9)
HARDWARE: dict[str, HardwareSpec] = {hw.name: hw for hw in (A100_80GB, H100_80GB)}


def hardware(name: str) -> HardwareSpec:
    """Look a GPU up by name ('a100', 'a100-80gb', 'h100', ...)."""
    key = name.lower()
    matches = [hw for hw_name, hw in HARDWARE.items() if hw_name == key or hw_name.startswith(key + "-")]
    if len(matches) != 1:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(HARDWARE))}")
    return matches[0]


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One model replica: a model on ``tp`` GPUs of one kind (tensor parallel)."""

    model: ModelSpec
    gpu: HardwareSpec
    tp: int = 1
    memory_utilization: float = 0.9
    activation_reserve: float = field(default=0.0)

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError("tensor parallel degree must be at least 1")
        if not 0 < self.memory_utilization <= 1:
            raise ValueError("memory_utilization must lie in (0, 1]")
        if self.kv_capacity_tokens <= 0:
            raise ValueError(
                f"{self.model.name} does not fit on {self.tp}x {self.gpu.name}: "
                f"weights need {self.model.weight_bytes / GIB:.1f} GiB")

    @property
    def kv_capacity_bytes(self) -> float:
        """HBM left for the KV cache: the usable share of memory minus weights and activations."""
        usable = self.tp * self.gpu.hbm_bytes * self.memory_utilization
        return usable - self.model.weight_bytes - self.activation_reserve

    @property
    def kv_capacity_tokens(self) -> int:
        return int(self.kv_capacity_bytes // self.model.kv_bytes_per_token)

    @property
    def host_load_seconds_per_token(self) -> float:
        """Time to load one token's KV from host memory, every GPU of the replica loading its
        shard over its own PCIe link at the link's rate."""
        return self.model.kv_bytes_per_token / (self.tp * self.gpu.host_bandwidth)
