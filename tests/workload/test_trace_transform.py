"""Rate and length scaling and slicing: pure, and arrivals stay re-based."""

from __future__ import annotations

import numpy as np
import pytest

from tropical.workload.trace import Trace, TraceEntry
from tropical.workload.transform import (
    LengthBounds,
    at_rate,
    bound_lengths,
    poisson_arrivals,
    scale_lengths,
    scale_rate,
    spread_ticks,
    take,
)

TRACE = Trace(
    "t",
    tuple(
        TraceEntry(t, inp, out, (0, i))
        for i, (t, inp, out) in enumerate(
            [(0.0, 1000, 10), (1.0, 3, 1), (1.0, 2000, 100), (4.0, 7, 2), (10.0, 512, 5)]
        )
    ),
)


def _arrivals(trace: Trace) -> list[float]:
    return [e.arrival for e in trace.entries]


def test_scale_rate_two_halves_inter_arrival_times() -> None:
    faster = scale_rate(TRACE, 2.0)
    assert _arrivals(faster) == [0.0, 0.5, 0.5, 2.0, 5.0]
    assert faster.mean_rate == pytest.approx(2 * TRACE.mean_rate)
    assert [(e.input_len, e.prefix_blocks) for e in faster.entries] == [
        (e.input_len, e.prefix_blocks) for e in TRACE.entries
    ]
    assert faster.name == TRACE.name
    assert _arrivals(TRACE)[-1] == 10.0  # the input is untouched


@pytest.mark.parametrize("bad", [0.0, -2.0, float("nan"), float("inf")])
def test_scales_reject_non_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="rate_scale must be a finite number > 0"):
        scale_rate(TRACE, bad)
    with pytest.raises(ValueError, match="length_scale must be a finite number > 0"):
        scale_lengths(TRACE, bad)


def test_scale_lengths_rounds_keeps_one_token_and_drops_prefix_blocks() -> None:
    half = scale_lengths(TRACE, 0.5)
    assert [(e.input_len, e.output_len) for e in half.entries] == [
        (500, 5),
        (2, 1),
        (1000, 50),
        (4, 1),
        (256, 2),
    ]
    assert all(e.prefix_blocks == () for e in half.entries)
    assert _arrivals(half) == _arrivals(TRACE)
    assert scale_lengths(TRACE, 0.0001).entries[0].input_len == 1
    assert scale_lengths(TRACE, 1.0) == TRACE


def test_take_by_count() -> None:
    assert _arrivals(take(TRACE, limit=3)) == [0.0, 1.0, 1.0]
    assert len(take(TRACE, limit=0)) == 0
    assert take(TRACE, limit=99) == TRACE


def test_take_by_window_rebases_to_zero() -> None:
    window = take(TRACE, start_s=1.0, end_s=10.0)  # [1, 10): excludes the request at 10
    assert _arrivals(window) == [0.0, 0.0, 3.0]
    assert [e.input_len for e in window.entries] == [3, 2000, 7]
    assert _arrivals(take(TRACE, start_s=0.5)) == [0.0, 0.0, 3.0, 9.0]
    assert _arrivals(take(TRACE, end_s=1.0)) == [0.0]
    assert _arrivals(take(TRACE, start_s=2.0, limit=1)) == [0.0]
    assert take(TRACE, limit=1, start_s=4.0).entries[0].input_len == 7
    assert len(take(TRACE, start_s=11.0)) == 0


def test_take_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="limit"):
        take(TRACE, limit=-1)
    with pytest.raises(ValueError, match="before start_s"):
        take(TRACE, start_s=5.0, end_s=1.0)


def test_spread_ticks_separates_shared_timestamps_within_their_tick() -> None:
    spread = _arrivals(spread_ticks(TRACE, seed=1))
    assert spread[0] == 0.0 and spread[3:] == [4.0, 10.0]
    assert 1.0 <= spread[1] <= spread[2] < 4.0
    assert spread[1] != spread[2]
    assert spread_ticks(TRACE, seed=1) == spread_ticks(TRACE, seed=1)


def test_spread_ticks_keeps_lengths_and_order() -> None:
    spread = spread_ticks(TRACE, seed=3)
    assert [(e.input_len, e.output_len) for e in spread.entries] == [
        (e.input_len, e.output_len) for e in TRACE.entries]


def test_poisson_arrivals_keep_the_mean_rate_roughly() -> None:
    long = Trace("p", tuple(TraceEntry(float(i), 10, 2) for i in range(2000)))
    poisson = poisson_arrivals(long, seed=0)
    assert poisson.mean_rate == pytest.approx(long.mean_rate, rel=0.1)
    assert _arrivals(poisson) == sorted(_arrivals(poisson))


UNTIMED = Trace("u", tuple(TraceEntry(0.0, 100, 10) for _ in range(20_000)), timed=False)


@pytest.mark.parametrize("cv", [1.0, 3.0, 0.5])
def test_at_rate_gives_the_rate_and_the_gap_cv(cv: float) -> None:
    timed = at_rate(UNTIMED, rate=5.0, cv=cv, seed=7)
    gaps = np.diff(_arrivals(timed))
    assert timed.timed and timed.entries[0].arrival == 0.0 and gaps.min() >= 0
    assert timed.mean_rate == pytest.approx(5.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)
    assert timed == at_rate(UNTIMED, 5.0, cv, seed=7) != at_rate(UNTIMED, 5.0, cv, seed=8)


@pytest.mark.parametrize(("rate", "cv", "name"), [(0.0, 1.0, "rate"), (1.0, float("nan"), "arrival_cv")])
def test_at_rate_rejects_bad_rate_and_cv(rate: float, cv: float, name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a finite number > 0"):
        at_rate(UNTIMED, rate, cv)


def test_bound_lengths_clamps_inputs_and_outputs_and_keeps_every_request() -> None:
    bounded = bound_lengths(TRACE, LengthBounds(min_input=5, max_input=1500, min_output=2, max_output=50))
    assert [(e.input_len, e.output_len) for e in bounded.entries] == [
        (1000, 10), (5, 2), (1500, 50), (7, 2), (512, 5)]
    assert _arrivals(bounded) == _arrivals(TRACE)
    assert bound_lengths(TRACE, LengthBounds(max_output=3)).entries[0].output_len == 3
    assert bound_lengths(TRACE, LengthBounds()) == TRACE


@pytest.mark.parametrize(("bounds", "what"), [
    ({"min_input": 0}, "--min-input must be >= 1"),
    ({"min_output": 9, "max_output": 3}, "--min-output \\(9\\) is above"),
])
def test_length_bounds_reject_impossible_ranges(bounds: dict, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        LengthBounds(**bounds)
