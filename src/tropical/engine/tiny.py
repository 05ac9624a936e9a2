"""A tiny seeded random-weight Llama written as a Hugging Face directory.

Tests and demos need a real model directory (config, safetensors, tokenizer, chat template) that loads in
well under a second and needs no download; its text is gibberish, but every code path is the real one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", EOS_TOKEN]
VOCAB_SIZE = 512
SEED_KEY = "tropical_tiny_random_seed"
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}
CORPUS = [
    "The quick brown fox jumps over the lazy dog. A serving system turns prompts into tokens, runs the "
    "model over them, and streams the answer back one token at a time.",
    "Paris is the capital of France. Berlin is the capital of Germany. Rome is the capital of Italy, and "
    "Madrid is the capital of Spain. Each city has a long history and many museums.",
    "Large language models read text as tokens. The first pass over a prompt is called prefill; every "
    "later pass that adds one token is called decode. Prefill is bound by compute, decode by memory.",
    "A paged cache keeps the keys and values of every token in fixed-size blocks, so memory is handed "
    "out on demand and never fragments. When a request finishes, its blocks return to the free list.",
    "The weather today is mild, with a light breeze from the west and a few clouds in the afternoon. "
    "Tomorrow should be warmer, and the weekend looks sunny for a walk in the park or along the river.",
    "What is the answer? Hello there, how are you? I am fine, thank you. Please tell me a short story "
    "about a small robot who learns to paint pictures of the sea, the sky and the mountains at dawn.",
]


def build_tiny_random(directory: Path, seed: int = 0) -> Path:
    """Write the model into `directory` unless it already holds one built with `seed`; returns it."""
    directory = Path(directory)
    if _holds_model(directory, seed):
        return directory
    if directory.exists() and any(directory.iterdir()):
        raise ValueError(f"{directory} is not empty and does not hold a tiny-random model with seed {seed}")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        _write(staging, seed)
        _publish(staging, directory, seed)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def _holds_model(directory: Path, seed: int) -> bool:
    """A finished build has every file and records its seed; a rename publishes all of them at once."""
    if not all((directory / name).is_file() for name in FILES):
        return False
    try:
        return json.loads((directory / "config.json").read_text()).get(SEED_KEY) == seed
    except json.JSONDecodeError:
        return False


def _publish(staging: Path, directory: Path, seed: int) -> None:
    """Rename the finished build into place; losing a race to an identical build is fine."""
    if directory.exists() and not any(directory.iterdir()):
        directory.rmdir()
    try:
        os.rename(staging, directory)
    except OSError:
        if not _holds_model(directory, seed):
            raise


def _write(root: Path, seed: int) -> None:
    tokenizer = train_tokenizer()
    config = model_config(tokenizer, seed)
    tokenizer.save(str(root / "tokenizer.json"))
    save_file(random_weights(config, seed), str(root / "model.safetensors"))
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2))
    (root / "config.json").write_text(json.dumps(config, indent=2))


def train_tokenizer() -> RawTokenizer:
    """Byte-level BPE trained on CORPUS; the trainer breaks ties by pair, so the result is reproducible."""
    tokenizer = RawTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    return tokenizer


def model_config(tokenizer: RawTokenizer, seed: int) -> dict:
    eos = tokenizer.token_to_id(EOS_TOKEN)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **SHAPE,
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "eos_token_id": eos,
        SEED_KEY: seed,
    }


def tokenizer_config() -> dict:
    return {"eos_token": EOS_TOKEN, "bos_token": None, "chat_template": CHATML_TEMPLATE}


def random_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """HF-named tensors: N(0, 0.02) matrices and unit norms, like a freshly initialised LlamaForCausalLM."""
    generator = torch.Generator().manual_seed(seed)
    return {name: _init(shape, generator) for name, shape in tensor_shapes(config).items()}


def _init(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    if len(shape) == 1:
        return torch.ones(shape)
    return torch.randn(shape, generator=generator) * 0.02


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (q, hidden),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.o_proj.weight": (hidden, q),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes
