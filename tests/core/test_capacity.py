import pytest

from tropical.core.capacity import find_capacity


def step(threshold: float):
    return lambda scale: 1.0 if scale <= threshold else 0.5


@pytest.mark.parametrize("threshold", [0.013, 0.37, 1.0, 2.9, 17.0])
def test_bisection_finds_threshold_within_tolerance(threshold):
    result = find_capacity(step(threshold), rel_tol=0.01)
    assert result.rate_scale <= threshold
    assert result.rate_scale >= threshold * 0.99 - 1e-12
    assert all(a == (1.0 if s <= threshold else 0.5) for s, a in result.probes)


def test_capacity_is_zero_when_nothing_attains():
    assert find_capacity(lambda s: 0.0, min_scale=0.01).rate_scale == 0.0


def test_capacity_is_capped_when_everything_attains():
    assert find_capacity(lambda s: 1.0, max_scale=100).rate_scale == 64.0


def test_rejects_bad_target():
    with pytest.raises(ValueError, match="target"):
        find_capacity(step(1), target=1.5)
