"""Online correction: a profile scaled by what the iterations it predicted really took."""

import pytest

from tests.factories import linear_model
from tropical.core.latency.noisy import NoisyModel
from tropical.core.latency.online import OnlineLatency
from tropical.core.latency.shape import BatchShape

TRUTH = linear_model()


def test_mixed_iterations_teach_the_prefill_part_once_the_decode_part_is_known():
    online = OnlineLatency(NoisyModel(TRUTH, 0.0, bias=-0.2))          # 20% optimistic
    decode = BatchShape.decode(8, 8000)
    mixed = decode.plus_prefill(700, 0)
    for _ in range(60):
        online.observe(decode, TRUTH.iteration_time(decode))
        online.observe(mixed, TRUTH.iteration_time(mixed))
    assert online.decode_scale == pytest.approx(1.25, rel=1e-3)
    assert online.prefill_scale == pytest.approx(1.25, rel=1e-3)
    assert online.iteration_time(mixed) == pytest.approx(TRUTH.iteration_time(mixed), rel=1e-3)


def test_an_exact_profile_stays_exact():
    online = OnlineLatency(TRUTH)
    shape = BatchShape.decode(4, 1000).plus_prefill(300, 100)
    online.observe(shape, TRUTH.iteration_time(shape))
    assert online.iteration_time(shape) == pytest.approx(TRUTH.iteration_time(shape))
