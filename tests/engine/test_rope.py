"""RoPE frequencies and cos/sin scale match transformers' for every scaling type we read from a config."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tropical.engine.batch import FlatBatch, Span
from tropical.engine.config import ModelConfig
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.model import LlamaModel
from tropical.engine.rope import rope_parameters

HF_KWARGS = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}

SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": YARN,
    "yarn-betas-untruncated": {**YARN, "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False},
    "yarn-mscale": {**YARN, "mscale": 0.707, "mscale_all_dim": 1.0},
    "yarn-attention-factor": {**YARN, "attention_factor": 1.25},
}


def _hf_config(scaling: dict[str, float | str | bool], theta: float = 10000.0) -> LlamaConfig:
    return LlamaConfig(**HF_KWARGS, rope_parameters={**scaling, "rope_theta": theta})


@pytest.mark.parametrize("scaling", SCALINGS.values(), ids=SCALINGS.keys())
def test_rope_parameters_match_transformers(scaling: dict[str, float | str | bool]) -> None:
    expected, expected_scale = ROPE_INIT_FUNCTIONS[str(scaling["rope_type"])](_hf_config(scaling), "cpu")
    actual, scale = rope_parameters(ModelConfig.from_hf({**HF_KWARGS, "rope_scaling": scaling}))
    assert torch.allclose(actual, expected)
    assert scale == pytest.approx(expected_scale)


def test_yarn_scales_attention_and_stretches_only_slow_dimensions() -> None:
    plain, _ = rope_parameters(ModelConfig.from_hf(HF_KWARGS))
    yarn, scale = rope_parameters(ModelConfig.from_hf({**HF_KWARGS, "rope_scaling": YARN}))
    assert scale > 1
    assert yarn[0] == plain[0] and torch.allclose(yarn[-1], plain[-1] / 4)


def test_unknown_rope_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported rope scaling 'longrope'"):
        ModelConfig.from_hf({**HF_KWARGS, "rope_scaling": {"rope_type": "longrope", "factor": 2.0}})


@torch.no_grad()
def test_yarn_model_matches_transformers_through_the_cache() -> None:
    torch.manual_seed(0)
    hf = LlamaForCausalLM(_hf_config(YARN)).eval()
    ours = LlamaModel(ModelConfig.from_hf(hf.config.to_dict()))
    ours.load_state_dict(hf.state_dict())
    ids = torch.randint(0, 128, (90,), generator=torch.Generator().manual_seed(1)).tolist()
    cache = PagedKVCache(ours.config, num_blocks=32, block_size=4)
    ours.eval()(FlatBatch.build([Span("a", ids[:-1], 0)], cache), cache)
    logits = ours(FlatBatch.build([Span("a", ids[-1:], len(ids) - 1)], cache), cache)
    assert (logits[0] - hf(torch.tensor([ids])).logits[0, -1]).abs().max() <= 1e-4
