"""Repeats: real numbers as mean and min..max over live runs, simulated as the mean of the twins."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.factories import linear_model, make_request
from tropical.core.latency.adjusted import AdjustedModel
from tropical.core.metrics import summarize
from tropical.fidelity.compare import Comparison
from tropical.fidelity.paths import PathComparison
from tropical.fidelity.repeats import GOODPUT, PolicyRepeats, Spread, median_abs_error, path_agreement


def served(ttft: float) -> list:
    """One request whose TTFT is ``ttft`` and whose TPOT is 0.05 s; it attains a 1 s TTFT SLO."""
    req = make_request(0, 0.0, output=3)
    req.first_token, req.finish, req.generated = ttft, ttft + 0.1, 3
    return [req]


def run(policy: str, real_ttft: float, sim_ttft: float, goodput: tuple[float, float] = (1.0, 1.0),
        paths: PathComparison | None = None) -> Comparison:
    sim = summarize(served(sim_ttft))
    return Comparison(policy, summarize(served(real_ttft)), sim, sim, (AdjustedModel(linear_model()),), 0.0,
                      goodput[0], goodput[1], paths or PathComparison(10, 10, None))


def test_spread_is_mean_min_max_without_nans() -> None:
    spread = Spread.of([1.0, math.nan, 3.0])
    assert (spread.mean, spread.low, spread.high) == (2.0, 1.0, 3.0)
    assert spread.contains(3.0) and not spread.contains(3.5)
    assert spread.relative_width == 1.0
    assert math.isnan(Spread.of([math.nan]).mean)


def test_equal_repeats_have_their_value_as_mean_low_and_high() -> None:
    """Three equal floats can average an ulp below their value; the spread must still hold it
    (a negative whisker stopped the study's figure)."""
    value = 0.8444218515250481
    spread = Spread.of([value] * 3)
    assert spread.mean == spread.low == spread.high == value
    assert spread.contains(value) and spread.relative_width == 0


def test_real_is_the_spread_of_repeats_and_sim_the_mean_of_their_twins() -> None:
    p = PolicyRepeats("chunked", (run("chunked", 0.4, 0.5, (1.0, 2.0)), run("chunked", 0.6, 0.7, (3.0, 2.0))))
    real, sim, err = p.real(), p.sim(), p.errors()
    ttft = real["ttft_p50_s"]
    assert (ttft.mean, ttft.low, ttft.high) == pytest.approx((0.5, 0.4, 0.6))
    assert sim["ttft_p50_s"] == pytest.approx(0.6) and err["ttft_p50_s"] == pytest.approx(0.2)
    assert real[GOODPUT].mean == 2.0 and sim[GOODPUT] == 2.0 and err[GOODPUT] == 0.0
    within = p.as_dict()["sim_within_spread"]
    assert within["ttft_p50_s"] is True and within["tpot_p50_s"] is True


def test_a_simulated_value_outside_every_repeat_is_flagged() -> None:
    p = PolicyRepeats("colocated", (run("colocated", 0.4, 0.9), run("colocated", 0.5, 0.9)))
    assert p.as_dict()["sim_within_spread"]["ttft_p90_s"] is False


def test_median_error_and_path_agreement_span_all_policies() -> None:
    exact = PolicyRepeats("chunked", (run("chunked", 0.5, 0.5, (1.0, 9.0), PathComparison(10, 9, None)),))
    late = PolicyRepeats("disagg", (run("disagg", 0.5, 2.0, paths=PathComparison(10, 7, None)),))
    # late: TTFT p50 and p90 +300%, TPOT 0, attainment -100% (2 s misses the 1 s SLO); goodput is not counted
    assert median_abs_error([late]) == pytest.approx(1.0)
    assert median_abs_error([exact, late]) == pytest.approx(0.0)
    assert path_agreement([exact, late]) == pytest.approx(16 / 20)


def test_a_policy_needs_at_least_one_run() -> None:
    with pytest.raises(ValueError, match="no runs"):
        PolicyRepeats("tropical", ())


def test_the_twins_drift_width_is_how_far_speed_alone_moves_their_p90_ttft() -> None:
    steady, chaotic = run("chunked", 0.5, 0.5), run("chunked", 0.5, 0.5)
    steady = replace(steady, drift_ttft_p90_s=(0.49, 0.51))
    chaotic = replace(chaotic, drift_ttft_p90_s=(0.4, 0.65))
    assert steady.drift_width == pytest.approx(0.04) and chaotic.drift_width == pytest.approx(0.5)
    assert PolicyRepeats("chunked", (steady, chaotic)).drift_width() == pytest.approx(0.27)
