"""Write a loaded model as a Hugging Face directory, so other servers (vLLM, transformers) run its weights.

The built-in SmolLM2 ships only as a GGUF that most servers cannot read; comparing against them needs the
very tensors and tokenizer our engine serves, in the layout LlamaForCausalLM and AutoTokenizer expect.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from tropical.engine.config import ModelConfig
from tropical.engine.loader import LoadedModel

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def save_hf_dir(loaded: LoadedModel, path: str | Path) -> Path:
    """Write config.json, model.safetensors, the tokenizer files and generation_config.json into `path`."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = loaded.tokenizer
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": _one_or_list(tokenizer.eos_token_ids)}
    dtype = next(loaded.model.parameters()).dtype
    _write_json(root / "config.json", hf_config(loaded.config, dtype) | ids)
    _write_json(root / "generation_config.json", ids)
    _write_json(root / "tokenizer_config.json", tokenizer_config(loaded))
    tokenizer.raw.save(str(root / "tokenizer.json"))
    save_file(hf_state_dict(loaded), str(root / "model.safetensors"), metadata={"format": "pt"})
    return root


def hf_config(config: ModelConfig, dtype: torch.dtype) -> dict:
    """LlamaConfig keys; rope_parameters is transformers 5's layout, rope_theta the older readers'."""
    rope = {"rope_type": "default"}
    if config.rope_scaling is not None:
        rope = {k: v for k, v in asdict(config.rope_scaling).items() if v is not None}
    fields = asdict(config)
    del fields["rope_scaling"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **fields,
        "rope_parameters": rope | {"rope_theta": config.rope_theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "dtype": DTYPE_NAMES[dtype],
    }


def hf_state_dict(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    """HF-named CPU tensors, each with its own storage (safetensors refuses views of the fused
    projections); a tied head is left out, as transformers saves it."""
    state = loaded.model.state_dict()
    if loaded.config.tie_word_embeddings:
        del state["lm_head.weight"]
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}


def tokenizer_config(loaded: LoadedModel) -> dict:
    """Special tokens by text and the chat template; the class loads tokenizer.json exactly as written."""
    tokenizer = loaded.tokenizer
    config: dict = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": loaded.config.max_position_embeddings,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    if tokenizer.bos_token_id is not None:
        config["bos_token"] = tokenizer.token_text(tokenizer.bos_token_id)
    if tokenizer.eos_token_ids:
        config["eos_token"] = tokenizer.token_text(tokenizer.eos_token_ids[0])
    if tokenizer.chat_template is not None:
        config["chat_template"] = tokenizer.chat_template
    return config


def _one_or_list(ids: list[int]) -> int | list[int] | None:
    return ids[0] if len(ids) == 1 else (ids or None)


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
