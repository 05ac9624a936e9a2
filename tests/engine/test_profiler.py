"""The profiler fits a loadable, non-negative FittedModel to the tiny engine (no timing thresholds)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from tropical.calibration.store import load_profile
from tropical.core.latency.fitted import FittedModel
from tropical.core.latency.shape import BatchShape
from tropical.engine.config import ModelConfig
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.model import LlamaModel
from tropical.engine.profiler import (
    FIT_ERROR_KEY,
    ProfileResult,
    Sample,
    fit_samples,
    nnls,
    profile_engine,
    write_profile,
)

CONFIG = ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, intermediate_size=128, vocab_size=96, max_position_embeddings=256)


@pytest.fixture(scope="module")
def result() -> ProfileResult:
    torch.manual_seed(0)
    model = LlamaModel(CONFIG).eval()
    return profile_engine(model, PagedKVCache(CONFIG, num_blocks=128, block_size=16), )


def test_coefficients_non_negative(result: ProfileResult) -> None:
    """Timings may fall with a feature (noise on a fast host): the fit clamps its coefficient to
    zero, where least squares would go negative (here exactly -1e-7 s per token of context) and
    FittedModel would refuse the profile."""
    falling = [Sample("decode", BatchShape.decode(b, c), 0.01 + 1e-4 * b - 1e-7 * c)
               for b in (1, 4, 16) for c in (100, 1000, 4000)]
    prefills = [Sample("prefill", BatchShape.prefill(n), 0.005 + 1e-5 * n) for n in (16, 64, 256)]
    clamped = fit_samples(falling + prefills, 1.0, 1e9, 0.0).model
    assert clamped.decode_per_context == 0 and clamped.decode_intercept > 0 and clamped.decode_per_seq > 0
    assert all(v >= 0 for v in asdict(result.model).values())
    assert result.model.transfer_bandwidth > 0
    assert result.model.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4


def test_fit_errors_finite(result: ProfileResult) -> None:
    assert set(result.errors) == {"prefill", "decode", "mixed"}
    for error in result.errors.values():
        assert math.isfinite(error.median_pct) and math.isfinite(error.max_pct)
        assert 0 <= error.median_pct <= error.max_pct
    assert {s.kind for s in result.samples} == {"prefill", "decode", "mixed"}


def test_written_profile_loads(result: ProfileResult, tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    write_profile(result, path)
    assert set(json.loads(path.read_text())[FIT_ERROR_KEY]) == {"prefill", "decode", "mixed"}
    assert load_profile(path) == result.model
    assert FittedModel.from_dict(result.model.to_dict()) == result.model


def test_cache_too_small_is_refused() -> None:
    model = LlamaModel(CONFIG).eval()
    with pytest.raises(ValueError, match="KV cache of at least"):
        profile_engine(model, PagedKVCache(CONFIG, num_blocks=4, block_size=16), )


def test_nnls_recovers_and_clamps() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(0.1, 1.0, (30, 3))
    assert np.allclose(nnls(a, a @ np.array([1.0, 2.0, 0.5])), [1.0, 2.0, 0.5])
    x = nnls(a, a @ np.array([1.0, -2.0, 0.5]))
    assert (x >= 0).all() and x[1] == 0
