"""A policy's repeated live runs against their twins: each real number as its mean and min..max
over the repeats, the simulated number as the mean of the repeats' twins.

One live run cannot separate a modelling error from run-to-run noise on a shared machine; the
spread over repeats can: a simulated value inside min..max is as close as the server is to itself.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tropical.fidelity.compare import (
    METRICS,
    STREAM_METRICS,
    Comparison,
    nullable,
    relative_error,
    values,
)
from tropical.fidelity.paths import PathComparison, merge

GOODPUT = "goodput_rps"
STREAM_GOODPUT = "stream_goodput_rps"
GOODPUTS = (GOODPUT, STREAM_GOODPUT)
NUMBERS = (*METRICS, *GOODPUTS, *STREAM_METRICS)


@dataclass(frozen=True, slots=True)
class Spread:
    """The mean of one number over repeats, and the lowest and highest repeat (NaNs left out).
    The mean is kept within them: the mean of equal floats can round an ulp outside."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        finite = [x for x in samples if not math.isnan(x)]
        if not finite:
            return cls(math.nan, math.nan, math.nan)
        low, high = min(finite), max(finite)
        return cls(min(max(statistics.fmean(finite), low), high), low, high)

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def relative_width(self) -> float:
        """(high - low) / mean: how far apart the repeats landed, as a share of their mean."""
        return (self.high - self.low) / self.mean if self.mean else math.nan

    def as_dict(self) -> dict[str, float | None]:
        return _nulls({"mean": self.mean, "min": self.low, "max": self.high})


@dataclass(frozen=True, slots=True)
class PolicyRepeats:
    """One policy's repeats, in the order they ran."""

    policy: str
    runs: tuple[Comparison, ...]

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError(f"policy {self.policy!r}: no runs to summarize")

    def real(self) -> dict[str, Spread]:
        """Each metric and goodput over the live repeats."""
        per_run = [with_goodputs(values(c.real), c.goodput_rps) for c in self.runs]
        return {m: Spread.of([run[m] for run in per_run]) for m in NUMBERS}

    def sim(self) -> dict[str, float]:
        """Each metric and goodput averaged over the repeats' twins (each with its run's overheads)."""
        per_run = [with_goodputs(values(c.adjusted), c.sim_goodput_rps) for c in self.runs]
        return {m: Spread.of([run[m] for run in per_run]).mean for m in NUMBERS}

    def errors(self) -> dict[str, float]:
        """(sim - real mean) / real mean of each metric and goodput."""
        real, sim = self.real(), self.sim()
        return {m: relative_error(real[m].mean, sim[m]) for m in real}

    def drift_width(self) -> float:
        """The twins' P90 TTFT spread from speed alone (``Comparison.drift_width``), averaged
        over the repeats."""
        return Spread.of([c.drift_width for c in self.runs]).mean

    def profile_ratio(self) -> Spread:
        """How fast the host ran against the profile over the repeats (``Comparison.profile_ratio``)."""
        return Spread.of([c.profile_ratio for c in self.runs])

    def paths(self) -> PathComparison:
        return merge([c.paths for c in self.runs])

    def hit_rates(self) -> tuple[Spread, float]:
        """The server's prefix hit rate over the repeats, and the twins' mean."""
        return Spread.of([c.hit_rate for c in self.runs]), Spread.of([c.sim_hit_rate for c in self.runs]).mean

    def as_dict(self) -> dict[str, object]:
        real, sim, err = self.real(), self.sim(), self.errors()
        live, twin = self.hit_rates()
        return {"policy": self.policy, "repeats": len(self.runs),
                "prefix_hit_rate": {"real": live.as_dict(), "sim": nullable(twin)},
                "real": {m: s.as_dict() for m, s in real.items()}, "sim": _nulls(sim),
                "relative_error": _nulls(err), **_nulls({"ttft_p90_drift_width": self.drift_width()}),
                "sim_within_spread": {m: real[m].contains(sim[m]) for m in real},
                "paths": self.paths().as_dict(), "runs": [c.as_dict() for c in self.runs]}


def with_goodputs(flat: dict[str, float], goodput: float) -> dict[str, float]:
    """``flat`` and both goodputs: requests attaining per second, and stream-attaining per second.
    Both count over the same requests and span, so the second is the first scaled by the share
    of attaining requests that also stream-attain."""
    stream = goodput * flat["stream_attainment"] / flat["attainment"] if flat["attainment"] else 0.0
    return flat | {GOODPUT: goodput, STREAM_GOODPUT: stream}


def median_abs_error(policies: Sequence[PolicyRepeats]) -> float:
    """Median |relative error| over every reported latency and attainment number of every policy."""
    errors = [abs(e) for p in policies for m, e in p.errors().items() if m in METRICS and not math.isnan(e)]
    return statistics.median(errors) if errors else math.nan


def path_agreement(policies: Sequence[PolicyRepeats]) -> float:
    """Share of all compared requests, over every policy and repeat, that took the same path."""
    return merge([p.paths() for p in policies]).agreement


def _nulls(numbers: dict[str, float]) -> dict[str, float | None]:
    return {k: nullable(v) for k, v in numbers.items()}
