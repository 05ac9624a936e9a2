import pytest
from hypothesis import given
from hypothesis import strategies as st

from tropical.sim.decode_run import DecodeRun


def stepwise(run: DecodeRun, k: int) -> float:
    return sum(run.intercept + run.slope * (run.context + i * run.batch) for i in range(k))


@given(st.integers(1, 500), st.integers(1, 64), st.integers(0, 10**6))
def test_closed_form_equals_sum_of_iterations(steps, batch, context):
    run = DecodeRun(steps, batch, context, intercept=0.02, slope=3e-8)
    assert run.duration == pytest.approx(stepwise(run, steps), rel=1e-9)
    assert run.iteration(steps) == pytest.approx(stepwise(run, steps) - stepwise(run, steps - 1))


@given(st.integers(2, 500), st.integers(1, 64), st.integers(0, 10**6), st.floats(0, 1))
def test_cut_lands_on_first_boundary_at_or_after_offset(steps, batch, context, fraction):
    run = DecodeRun(steps, batch, context, intercept=0.02, slope=3e-8)
    offset = fraction * run.duration
    cut = run.cut_at(offset)
    assert cut.duration >= offset - 1e-12
    assert cut.steps == 1 or run.elapsed(cut.steps - 1) < offset


def test_cut_with_flat_iterations():
    run = DecodeRun(10, 4, 0, intercept=0.5, slope=0.0)
    assert run.cut_at(1.2).steps == 3
    assert run.cut_at(0.0).steps == 1
