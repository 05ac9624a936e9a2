"""Which latency models say their predictions grow with the batch, and that those that say so do
in the ways Path 2's floors rely on (``sched.path2_floors``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_roofline import internlm2
from tests.factories import linear_model
from tropical.core.latency.adjusted import AdjustedModel
from tropical.core.latency.iterations import prefill_time
from tropical.core.latency.model import LatencyModel
from tropical.core.latency.noisy import NoisyModel
from tropical.core.latency.online import OnlineLatency
from tropical.core.latency.shape import BatchShape

MONOTONE: list[LatencyModel] = [internlm2(), linear_model(), AdjustedModel(internlm2(), 1.3, 0.002),
                                NoisyModel(internlm2(), 0.0, bias=0.1), OnlineLatency(internlm2(), 1.5, 0.7)]


def test_models_say_whether_they_are_monotone() -> None:
    assert all(model.monotone for model in MONOTONE)
    assert not NoisyModel(internlm2(), 0.1).monotone
    assert not linear_model(decode_intercept=0.05).monotone
    assert not AdjustedModel(linear_model(decode_intercept=0.05)).monotone


def test_a_fitted_model_whose_decode_intercept_outweighs_a_one_token_prompt_gets_faster_with_it() -> None:
    model = linear_model(decode_intercept=0.05)
    decodes = BatchShape.decode(8, 8_000)
    assert model.iteration_time(decodes.plus_prefill(1, 0)) < model.iteration_time(decodes)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(range(len(MONOTONE))), st.integers(0, 64), st.integers(0, 200_000),
       st.integers(1, 4_096), st.integers(2, 20_000), st.integers(0, 19_999))
def test_a_monotone_model_grows_as_the_floors_assume(which: int, batch: int, context: int, chunk: int,
                                                     prompt: int, cached: int) -> None:
    model = MONOTONE[which]
    decodes = BatchShape.decode(batch, context * batch // 64)
    base = model.iteration_time(decodes)
    assert model.iteration_time(decodes.plus_prefill(1, 0)) >= base
    assert model.iteration_time(decodes.plus_prefill(chunk + 1, 0)) >= model.iteration_time(
        decodes.plus_prefill(chunk, 0))
    assert model.iteration_time(BatchShape.decode(batch + 1, context * batch // 64 + 10)) >= base
    cached = min(cached, prompt - 2)
    more_cached = prefill_time(model, prompt - cached - 1, cached + 1)
    assert prefill_time(model, prompt - cached, cached) >= more_cached
