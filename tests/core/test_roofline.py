"""The roofline latency model: closed-form decode line, monotonicity, paper-scale magnitudes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tropical
from tropical.core.latency import roofline
from tropical.core.latency.iterations import decode_time, prefill_time
from tropical.core.latency.model import LatencyModel
from tropical.core.latency.roofline import Efficiency, OpEfficiency, RooflineModel
from tropical.core.latency.shape import BatchShape
from tropical.core.specs import A100_80GB, ModelSpec, ReplicaSpec

MODELS = Path(tropical.__file__).parent / "data" / "models"

# Round factors close to the A100 calibration; these tests check structure, not calibration.
EFFICIENCY = Efficiency(
    gemm=OpEfficiency(0.74, 0.81, 5e-6, 1.5), norm=OpEfficiency(memory=0.36, overhead=2e-6),
    rope=OpEfficiency(memory=0.45, overhead=2e-6), activation=OpEfficiency(memory=0.5, overhead=2e-6),
    residual=OpEfficiency(memory=0.9, overhead=1e-6),
    prefill_attention=OpEfficiency(0.6, 0.78, 1.6e-5, 4.0),
    decode_attention=OpEfficiency(memory=0.78, overhead=1.6e-5),
    all_reduce=OpEfficiency(memory=0.58, overhead=4.8e-5), transfer=OpEfficiency(memory=1.0, overhead=1.4e-5),
    prefill_tile_waste=650.0, decode_per_sequence=2.5e-9, iteration_overhead=2e-3)


def internlm2(tp: int = 2) -> RooflineModel:
    config = json.loads((MODELS / "internlm2-20b.json").read_text())
    spec = ModelSpec.from_hf_config("internlm2-20b", config)
    return RooflineModel(ReplicaSpec(spec, A100_80GB, tp), EFFICIENCY)


MODEL = internlm2()
spans = st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 16384)), max_size=4)
contexts = st.lists(st.integers(1, 32768), max_size=64)


def test_is_a_latency_model() -> None:
    assert isinstance(MODEL, LatencyModel)
    assert MODEL.iteration_time(BatchShape()) == 0.0


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(1, 512), per_sequence=st.integers(1, 200_000))
def test_decode_iteration_is_exactly_the_line(batch: int, per_sequence: int) -> None:
    context = batch * per_sequence
    intercept, slope = MODEL.decode_line(batch)
    assert MODEL.iteration_time(BatchShape.decode(batch, context)) == pytest.approx(
        intercept + slope * context, rel=1e-12)
    assert decode_time(MODEL, batch, context) == pytest.approx(
        MODEL.iteration_time(BatchShape.decode(batch, context)), rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(prefills=spans.filter(bool), batch=st.integers(1, 256), c1=st.integers(1, 10**6),
       extra=st.integers(0, 10**6))
def test_mixed_iterations_share_the_decode_slope(prefills: list[tuple[int, int]], batch: int,
                                                 c1: int, extra: int) -> None:
    """The general path prices decode context exactly as the cached line does."""
    base = BatchShape.of_spans(prefills, [])

    def mixed(context: int) -> float:
        return MODEL.iteration_time(BatchShape(base.prefill_tokens, base.prefill_pairs,
                                               base.prefill_cached, base.num_prefills, batch,
                                               context))

    _, slope = MODEL.decode_line(batch)
    assert mixed(c1 + extra) - mixed(c1) == pytest.approx(slope * extra, rel=1e-6, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(prefills=spans, decodes=contexts, new=st.tuples(st.integers(1, 4096), st.integers(0, 16384)),
       context=st.integers(1, 32768))
def test_more_work_never_costs_less(prefills: list[tuple[int, int]], decodes: list[int],
                                    new: tuple[int, int], context: int) -> None:
    before = MODEL.iteration_time(BatchShape.of_spans(prefills, decodes))
    assert MODEL.iteration_time(BatchShape.of_spans([*prefills, new], decodes)) > before
    assert MODEL.iteration_time(BatchShape.of_spans(prefills, [*decodes, context])) > before
    if prefills:
        (n, c), rest = prefills[0], prefills[1:]
        grown = BatchShape.of_spans([(n + 1, c), *rest], decodes)
        assert MODEL.iteration_time(grown) > before


@pytest.mark.parametrize("new", [16, 256, 2048])
def test_chunk_cost_grows_with_cached_tokens(new: int) -> None:
    costs = [prefill_time(MODEL, new, cached) for cached in (0, 1024, 8192, 65536)]
    assert costs == sorted(costs) and len(set(costs)) == len(costs)


@pytest.mark.parametrize("tokens", [2048, 4096])
def test_prefill_per_token_matches_the_paper_scale(tokens: int) -> None:
    """DESIGN.md: ≈ 0.085 ms per token on an A100 TP2 worker (GEMMs alone at ~75% of peak);
    attention, all-reduce and elementwise ops add about a quarter on top."""
    per_token = prefill_time(MODEL, tokens) / tokens
    assert 0.07e-3 < per_token < 0.13e-3


@pytest.mark.parametrize("batch", [16, 32])
def test_decode_iteration_matches_the_paper_scale(batch: int) -> None:
    """DESIGN.md: a decode iteration at batch 16-32 with ~8k context each costs 20-40 ms."""
    assert 20e-3 < decode_time(MODEL, batch, batch * 8192) < 40e-3


def test_long_context_decode_is_memory_bound() -> None:
    """The slope is the KV bytes of one token over the attention bandwidth, layer by layer."""
    _, slope = MODEL.decode_line(32)
    kv_bytes_per_shard = MODEL.replica.model.kv_bytes_per_token / 2
    assert slope == pytest.approx(kv_bytes_per_shard / (0.78 * A100_80GB.hbm_bandwidth))


def test_transfer_time_splits_across_shards() -> None:
    tp1, tp2 = internlm2(tp=1), MODEL
    assert tp2.transfer_time(0) == 0.0
    kv = tp2.replica.model.kv_bytes_per_token
    assert tp2.transfer_time(8192) == pytest.approx(1.4e-5 + 8192 * kv / 2 / 300e9)
    assert tp2.transfer_time(8192) < tp1.transfer_time(8192)


def test_tensor_parallelism_speeds_up_prefill() -> None:
    assert prefill_time(MODEL, 4096) < prefill_time(internlm2(tp=1), 4096)


def test_efficiency_round_trips_through_a_dict() -> None:
    assert Efficiency.from_dict(EFFICIENCY.to_dict()) == EFFICIENCY


@settings(max_examples=50, deadline=None)
@given(prefills=spans, decodes=contexts)
def test_a_prediction_does_not_depend_on_what_is_cached(prefills: list[tuple[int, int]],
                                                         decodes: list[int]) -> None:
    """The per-size caches of the dense part return what a cold model computes, also once a
    full cache has started over."""
    shape = BatchShape.of_spans(prefills, decodes)
    warm = MODEL.iteration_time(shape)
    assert MODEL.iteration_time(shape) == warm
    assert internlm2().iteration_time(shape) == warm


@settings(max_examples=50, deadline=None)
@given(prefills=spans.filter(bool), decodes=contexts.filter(bool))
def test_a_mixed_iteration_is_its_ops_summed(prefills: list[tuple[int, int]], decodes: list[int]) -> None:
    """The model prices a mixed batch from the op classes themselves (the decode attention's
    per-batch part cached): the same sum, to the last bit, as the ops computed afresh."""
    shape = BatchShape.of_spans(prefills, decodes)
    model = MODEL  # shared with every other example: its caches hold other batches' parts
    attention = (model._prefill.seconds(shape.prefill_tokens, shape.prefill_pairs, shape.prefill_cached)
                 + model._decode.seconds(shape.decode_count, shape.decode_context))
    dense = model._dense(shape.prefill_tokens + shape.decode_count, shape.num_prefills + shape.decode_count)
    assert model.iteration_time(shape) == dense + model._layers * attention


def test_the_layer_cache_lists_small_counts_and_starts_over_past_them_when_full(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Token counts below ``_LISTED_TOKENS`` are kept in a list indexed by the count, the rest in
    a dict that starts over when full; either way a prediction is what a cold model computes,
    in whatever order the counts come."""
    monkeypatch.setattr(roofline, "_CACHED_SHAPES", 4)
    monkeypatch.setattr(roofline, "_LISTED_TOKENS", 5)
    model, cold = internlm2(), internlm2()
    counts = [11, 1, 7, 4, 5, 2, 9, 3, 10, 6, 8, 1, 11]
    times = [model.iteration_time(BatchShape.prefill(n)) for n in counts]
    assert len(model._layer_seconds) <= 5 and len(model._long_layer_seconds) <= 4
    assert times == [cold.iteration_time(BatchShape.prefill(n)) for n in reversed(counts)][::-1]


@settings(max_examples=300, deadline=None)
@given(st.floats(0.0, 10.0), st.floats(0.0, 10.0), st.floats(1.0, 8.0))
def test_the_roofline_of_floats_is_the_power_formula_to_the_last_bit(compute, memory, sharpness):
    import numpy as np

    expected = (compute**sharpness + memory**sharpness) ** (1.0 / sharpness)
    assert roofline.soft_roofline_of(compute, memory, sharpness) == expected
    assert roofline.soft_roofline(compute, memory, sharpness) == expected
    rows = roofline.soft_roofline(np.array([compute, memory]), np.array([memory, compute]), sharpness)
    assert rows[0] == pytest.approx(expected)
