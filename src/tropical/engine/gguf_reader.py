"""Read a llama-architecture GGUF file into an HF-style config, HF-named tensors and a vocab.

The model code knows only HF names and layouts; this module is the one place that knows how
llama.cpp renames, reverses, quantizes and permutes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize

SUPPORTED_ARCHITECTURES = ("llama",)
Q = GGMLQuantizationType
SUPPORTED_TYPES = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K})

GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
IGNORED_TENSORS = frozenset({"rope_freqs.weight"})
BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


@dataclass
class GGUFVocab:
    """Tokenizer data as GGUF stores it (tokenizer.ggml.* and tokenizer.chat_template)."""

    tokens: list[str]
    scores: list[float] = field(default_factory=list)
    token_types: list[int] = field(default_factory=list)
    merges: list[str] = field(default_factory=list)
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    chat_template: str | None = None
    model: str = "gpt2"
    pre: str | None = None


def load_gguf(
    path: str | Path, dtype: torch.dtype = torch.float32
) -> tuple[dict, dict[str, torch.Tensor], GGUFVocab]:
    """Return (HF-style config, HF-named dequantized state dict, vocab) for a llama GGUF."""
    path = Path(path)
    reader = open_reader(path)
    meta = Metadata(reader, path)
    vocab = read_vocab(meta)
    tensors = {t.name: t for t in reader.tensors}
    config = build_config(meta, vocab, tied="output.weight" not in tensors)
    state = {}
    for name, tensor in tensors.items():
        if name in IGNORED_TENSORS:
            continue
        hf_name = hf_tensor_name(name, path)
        state[hf_name] = to_hf_layout(hf_name, dequantize_tensor(tensor, path), config).to(dtype)
    return config, state, vocab


def open_reader(path: Path) -> GGUFReader:
    """Open the file, turning the reader's assorted failures into one ValueError."""
    if not path.is_file():
        raise ValueError(f"GGUF file not found: {path}")
    try:
        return GGUFReader(path)
    except Exception as e:
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from e


@dataclass
class Metadata:
    """Typed access to GGUF key/value metadata with errors that name the file and key."""

    reader: GGUFReader
    path: Path

    def get(self, key: str, default: Any = None) -> Any:
        field_ = self.reader.get_field(key)
        return default if field_ is None else field_.contents()

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ValueError(f"{self.path} lacks metadata field {key}")
        return value


def read_vocab(meta: Metadata) -> GGUFVocab:
    """Collect the tokenizer fields; the token list is required since it sets vocab_size."""
    return GGUFVocab(
        tokens=meta.require("tokenizer.ggml.tokens"),
        scores=meta.get("tokenizer.ggml.scores", []),
        token_types=meta.get("tokenizer.ggml.token_type", []),
        merges=meta.get("tokenizer.ggml.merges", []),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
        model=meta.get("tokenizer.ggml.model", "gpt2"),
        pre=meta.get("tokenizer.ggml.pre"),
    )


def build_config(meta: Metadata, vocab: GGUFVocab, tied: bool) -> dict:
    """Translate llama.* metadata into the keys a HF LlamaConfig uses."""
    arch = meta.require("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{meta.path}: unsupported architecture {arch!r}"
                         f" (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    heads = int(meta.require(f"{arch}.attention.head_count"))
    hidden = int(meta.require(f"{arch}.embedding_length"))
    rope_theta = as_decimal(meta.get(f"{arch}.rope.freq_base", 10000.0))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(meta.require(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(meta.require(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
        "rms_norm_eps": as_decimal(meta.require(f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "max_position_embeddings": int(meta.require(f"{arch}.context_length")),
        "vocab_size": len(vocab.tokens),
        "tie_word_embeddings": tied,
        "bos_token_id": vocab.bos_token_id,
        "eos_token_id": vocab.eos_token_id,
    }


def as_decimal(value: float) -> float:
    """Undo float32 storage noise (9.99999974e-06 -> 1e-05) so configs read like HF ones."""
    return float(f"{float(value):.7g}")


def hf_tensor_name(name: str, path: Path) -> str:
    """Map a llama.cpp tensor name to its HF parameter name."""
    base, _, suffix = name.rpartition(".")
    if base in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[base]}.{suffix}"
    match = BLOCK_RE.fullmatch(name)
    if match is None or match.group(2) not in BLOCK_NAMES:
        raise ValueError(f"{path}: unknown tensor {name!r}")
    layer, part, suffix = match.groups()
    return f"model.layers.{layer}.{BLOCK_NAMES[part]}.{suffix}"


def dequantize_tensor(tensor: ReaderTensor, path: Path) -> torch.Tensor:
    """Dequantize to float32 in HF dim order (GGUF lists dims innermost first)."""
    if tensor.tensor_type not in SUPPORTED_TYPES:
        raise ValueError(f"{path}: tensor {tensor.name} has unsupported type {tensor.tensor_type.name}")
    values = dequantize(np.asarray(tensor.data), tensor.tensor_type)
    shape = tuple(int(d) for d in reversed(tensor.shape))
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))


def to_hf_layout(hf_name: str, weight: torch.Tensor, config: dict) -> torch.Tensor:
    """Undo convert_hf_to_gguf's rotary permutation of q_proj and k_proj rows."""
    if hf_name.endswith("self_attn.q_proj.weight"):
        return unpermute(weight, config["num_attention_heads"])
    if hf_name.endswith("self_attn.k_proj.weight"):
        return unpermute(weight, config["num_key_value_heads"])
    return weight


def unpermute(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's permute: per head, interleaved rotary pairs back to two halves."""
    rows = weight.shape[0]
    split = weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
    return split.transpose(1, 2).reshape(weight.shape).contiguous()
