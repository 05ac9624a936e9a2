"""Model specs by name (shipped Hugging Face configs) or from a config.json on disk."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources
from pathlib import Path

from tropical.core.specs import ModelSpec

_SHIPPED = resources.files("tropical") / "data" / "models"


def shipped_models() -> list[str]:
    return sorted(p.name.removesuffix(".json") for p in _SHIPPED.iterdir() if p.name.endswith(".json"))


def load_model_spec(name_or_path: str, dtype_bytes: int = 2) -> ModelSpec:
    """A shipped model by name, or a config.json (or a directory holding one) on disk."""
    shipped = _SHIPPED / f"{name_or_path.lower()}.json"
    if shipped.is_file():
        return _spec(name_or_path.lower(), shipped.read_text(), str(shipped), dtype_bytes)
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"unknown model {name_or_path!r}: not a shipped model "
                         f"({', '.join(shipped_models())}) nor a config.json path")
    return _spec(path.parent.name or path.stem, path.read_text(), str(path), dtype_bytes)


def _spec(name: str, text: str, where: str, dtype_bytes: int) -> ModelSpec:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{where}: expected a JSON object")
    spec = ModelSpec.from_hf_config(name, config, dtype_bytes)
    override = config.get("tropical_max_context")
    if override is None:
        return spec
    return replace(spec, max_context=int(override))
