import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.factories import linear_model
from tropical.core.latency.fitted import FittedModel
from tropical.core.latency.iterations import decode_time, prefill_time
from tropical.core.latency.shape import BatchShape


def test_profile_round_trips_through_its_dict():
    model = linear_model()
    assert FittedModel.from_dict(model.to_dict()) == model


def test_profile_of_another_format_is_refused():
    with pytest.raises(ValueError, match="format"):
        FittedModel.from_dict({"format": "other"})


def test_negative_coefficient_is_refused():
    data = linear_model().to_dict() | {"decode_per_seq": -1}
    with pytest.raises(ValueError, match="decode_per_seq"):
        FittedModel.from_dict(data)


def test_prefill_is_quadratic_in_length_without_cache():
    model = linear_model()
    assert prefill_time(model, 1000) == pytest.approx(0.01 + 0.1 + 1e-8 * 1000 * 1001)


@given(st.integers(1, 300), st.integers(0, 10**7))
def test_decode_iteration_is_the_decode_line(batch, context):
    model = linear_model()
    assert model.iteration_time(BatchShape.decode(batch, context)) == pytest.approx(
        decode_time(model, batch, context))


def test_mixed_iteration_adds_decode_marginal_to_prefill():
    model = linear_model()
    mixed = BatchShape.of_spans([(100, 0)], [500, 700])
    assert model.iteration_time(mixed) == pytest.approx(
        prefill_time(model, 100) + 1e-6 * 1200 + 1e-4 * 2)
