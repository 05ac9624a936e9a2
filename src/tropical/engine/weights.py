"""Load a Hugging Face model directory: config.json plus (possibly sharded) safetensors.

No hub access: the directory must already hold the files. Parameter names stay the HF ones so
the model code has one naming scheme for both HF directories and GGUF files.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

REQUIRED_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def load_hf_dir(
    path: str | Path, dtype: torch.dtype | None = None
) -> tuple[dict, dict[str, torch.Tensor]]:
    """Return (config dict, state dict); `dtype` converts floating tensors when given."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"model directory not found: {root}")
    config = read_config(root / "config.json")
    state = read_safetensors(root)
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    return config, state


def read_config(path: Path) -> dict:
    """Parse config.json and check the fields every decoder needs, so errors name the file."""
    if not path.is_file():
        raise ValueError(f"config.json missing in {path.parent}")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed JSON in {path}: {e}") from e
    if not isinstance(config, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    missing = [k for k in REQUIRED_CONFIG_KEYS if k not in config]
    if missing:
        raise ValueError(f"{path} lacks required field(s): {', '.join(missing)}")
    return config


def read_safetensors(root: Path) -> dict[str, torch.Tensor]:
    """Merge every *.safetensors shard in `root` into one state dict."""
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {root}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        shard = load_file(str(file))
        clash = state.keys() & shard.keys()
        if clash:
            raise ValueError(f"{file} repeats tensor(s) already loaded: {sorted(clash)[:3]}")
        state.update(shard)
    return state
