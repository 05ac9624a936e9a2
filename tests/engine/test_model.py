"""The flat paged forward pass matches transformers' LlamaForCausalLM, however the tokens are batched."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tropical.engine.attention import QUERY_CHUNK
from tropical.engine.batch import FlatBatch, Span
from tropical.engine.config import ModelConfig
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.model import LlamaModel
from tropical.engine.sampling import SamplingParams, sample, step_generator

HF_KWARGS = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)


@pytest.fixture(scope="module")
def hf() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**HF_KWARGS, tie_word_embeddings=False)).eval()


@pytest.fixture(scope="module")
def model(hf: LlamaForCausalLM) -> LlamaModel:
    return _load(hf)


def _load(hf: LlamaForCausalLM, dtype: torch.dtype = torch.float32) -> LlamaModel:
    ours = LlamaModel(ModelConfig.from_hf(hf.config.to_dict()))
    ours.load_state_dict(hf.state_dict())
    return ours.to(dtype).eval()


def _cache(model: LlamaModel, blocks: int = 32, dtype: torch.dtype = torch.float32) -> PagedKVCache:
    return PagedKVCache(model.config, num_blocks=blocks, block_size=4, dtype=dtype)


def _run(model: LlamaModel, cache: PagedKVCache, spans: list[Span]) -> torch.Tensor:
    return model(FlatBatch.build(spans, cache), cache)


@torch.no_grad()
def _hf_logits(hf: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids])).logits[0]


def _prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_full_prefill_matches_transformers(hf: LlamaForCausalLM, model: LlamaModel) -> None:
    ids = _prompt(20)
    logits = _run(model, _cache(model), [Span("a", ids, 0)])
    assert logits.shape == (1, 128)
    assert (logits[0] - _hf_logits(hf, ids)[-1]).abs().max() <= 1e-4


def test_chunked_prefill_matches_transformers(hf: LlamaForCausalLM, model: LlamaModel) -> None:
    ids, cache = _prompt(20), _cache(model)
    _run(model, cache, [Span("a", ids[:12], 0)])
    logits = _run(model, cache, [Span("a", ids[12:], 12)])
    assert (logits[0] - _hf_logits(hf, ids)[-1]).abs().max() <= 1e-4


@pytest.mark.parametrize("cached", [0, 40])
def test_spans_longer_than_a_query_chunk_match_transformers(
    hf: LlamaForCausalLM, model: LlamaModel, cached: int
) -> None:
    ids, cache = _prompt(cached + QUERY_CHUNK + 60), _cache(model, blocks=64)
    if cached:
        _run(model, cache, [Span("a", ids[:cached], 0)])
    logits = _run(model, cache, [Span("a", ids[cached:], cached)])
    assert (logits[0] - _hf_logits(hf, ids)[-1]).abs().max() <= 1e-4


def test_greedy_decode_from_cache_matches_transformers(hf: LlamaForCausalLM, model: LlamaModel) -> None:
    ids, cache = _prompt(20), _cache(model)
    logits = _run(model, cache, [Span("a", ids, 0)])
    for _ in range(5):
        ids.append(int(logits[0].argmax()))
        logits = _run(model, cache, [Span("a", ids[-1:], len(ids) - 1)])
        assert (logits[0] - _hf_logits(hf, ids)[-1]).abs().max() <= 1e-4


def _prime(model: LlamaModel, cache: PagedKVCache, prefixes: dict[str, list[int]]) -> None:
    for seq_id, ids in prefixes.items():
        _run(model, cache, [Span(seq_id, ids, 0)])


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [2, 0, 3, 1]], ids=["decodes-last", "interleaved"])
def test_mixed_batch_equals_each_span_alone(model: LlamaModel, order: list[int]) -> None:
    prefixes = {"chunk": _prompt(6, 2), "d1": _prompt(7, 3), "d2": _prompt(13, 4)}
    spans = [
        Span("prefill", _prompt(10, 5), 0),
        Span("chunk", _prompt(5, 6), 6),
        Span("d1", [17], 7),
        Span("d2", [42], 13),
    ]
    spans = [spans[i] for i in order]
    mixed_cache, alone_cache = _cache(model), _cache(model)
    _prime(model, mixed_cache, prefixes)
    _prime(model, alone_cache, prefixes)
    mixed = _run(model, mixed_cache, spans)
    alone = torch.cat([_run(model, alone_cache, [span]) for span in spans])
    assert (mixed - alone).abs().max() <= 1e-5


def _greedy(model: LlamaModel, cache: PagedKVCache, seq_id: str, last: int, cached: int) -> list[int]:
    tokens = []
    for step in range(5):
        logits = _run(model, cache, [Span(seq_id, [last], cached + step)])
        last = int(logits[0].argmax())
        tokens.append(last)
    return tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exported_kv_continues_identically_on_another_instance(
    hf: LlamaForCausalLM, dtype: torch.dtype
) -> None:
    model = _load(hf, dtype)
    ids, source = _prompt(20), _cache(model, dtype=dtype)
    first = int(_run(model, source, [Span("a", ids, 0)])[0].argmax())
    target_model, target = _load(hf, dtype), _cache(model, dtype=dtype)
    buffer = source.export("a", len(ids))
    assert buffer.dtype == dtype
    target.import_("b", buffer)
    assert _greedy(target_model, target, "b", first, len(ids)) == _greedy(model, source, "a", first, len(ids))


def test_bfloat16_model_and_cache_stay_close_to_float32(hf: LlamaForCausalLM, model: LlamaModel) -> None:
    low = _load(hf, torch.bfloat16)
    ids, exact_cache, low_cache = _prompt(20), _cache(model), _cache(low, dtype=torch.bfloat16)
    exact = _run(model, exact_cache, [Span("a", ids, 0)])
    approx = _run(low, low_cache, [Span("a", ids, 0)])
    for step in range(5):
        assert approx.dtype == low_cache.k.dtype == torch.bfloat16
        assert (approx.float() - exact).abs().max() <= 0.03 * exact.abs().max()
        assert int(approx.argmax()) == int(exact.argmax())
        token = [int(exact.argmax())]
        exact = _run(model, exact_cache, [Span("a", token, len(ids) + step)])
        approx = _run(low, low_cache, [Span("a", token, len(ids) + step)])


def test_state_dict_keeps_transformers_names_and_values(hf: LlamaForCausalLM, model: LlamaModel) -> None:
    ours, theirs = model.state_dict(), hf.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in theirs)


def test_tied_checkpoint_loads_without_lm_head() -> None:
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**HF_KWARGS, tie_word_embeddings=True)).eval()
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    ours = LlamaModel(ModelConfig.from_hf(hf.config.to_dict()))
    ours.load_state_dict(state)
    ids = _prompt(9)
    logits = _run(ours.eval(), _cache(ours), [Span("a", ids, 0)])
    assert (logits[0] - _hf_logits(hf, ids)[-1]).abs().max() <= 1e-4


def test_positions_beyond_max_position_embeddings_are_refused(model: LlamaModel) -> None:
    with pytest.raises(ValueError, match="max_position_embeddings"):
        _run(model, _cache(model, blocks=80), [Span("a", [1], 256)])


def test_config_names_a_missing_field() -> None:
    with pytest.raises(ValueError, match="intermediate_size"):
        ModelConfig.from_hf({k: v for k, v in HF_KWARGS.items() if k != "intermediate_size"})


def test_config_reads_old_style_rope_fields() -> None:
    config = ModelConfig.from_hf(
        {**HF_KWARGS, "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2}}
    )
    assert config.rope_theta == 500000.0
    assert config.rope_scaling is not None and config.rope_scaling.factor == 2.0
    assert config.head_dim == 16 and config.num_key_value_heads == 2


def test_greedy_picks_argmax() -> None:
    logits = torch.tensor([[0.1, 3.0, -1.0], [5.0, 0.0, 4.9]])
    assert sample(logits, [SamplingParams()] * 2, [None, None]) == [1, 0]


def _seeded(seed: int, **kwargs: float) -> list[int]:
    logits = torch.randn(4, 128, generator=torch.Generator().manual_seed(7))
    params = [SamplingParams(temperature=1.0, seed=seed, **kwargs) for _ in range(4)]
    return sample(logits, params, [step_generator(p, 0) for p in params])


def test_same_seed_gives_same_tokens() -> None:
    assert _seeded(3, top_p=0.9) == _seeded(3, top_p=0.9)
    assert len({tuple(_seeded(seed)) for seed in range(5)}) > 1


def test_top_k_one_equals_greedy() -> None:
    logits = torch.randn(4, 128, generator=torch.Generator().manual_seed(7))
    assert _seeded(3, top_k=1) == logits.argmax(-1).tolist()


def test_tiny_top_p_equals_greedy() -> None:
    logits = torch.randn(4, 128, generator=torch.Generator().manual_seed(7))
    assert _seeded(3, top_p=1e-6) == logits.argmax(-1).tolist()


@pytest.mark.parametrize(
    "kwargs", [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"seed": -2}]
)
def test_bad_sampling_params_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
