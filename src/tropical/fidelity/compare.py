"""How far the simulator's numbers are from the real server's, metric by metric."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tropical.core.latency.adjusted import AdjustedModel
from tropical.core.latency.fitted import FittedModel
from tropical.core.latency.model import LatencyModel
from tropical.core.metrics import Summary
from tropical.fidelity.paths import PathComparison

METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "attainment")
STREAM_METRICS = ("itl_p50_s", "itl_p99_s", "stall_share", "stream_attainment")
"""What users feel between tokens: reported real beside simulated, not in the error goals (a
stall share of 0 has no relative error, and the twin prices each chunk, not each token); stream
attainment also asks that no gap between two tokens exceed the TBT SLO."""
DRIFT = (0.98, 1.02)
"""Speeds, relative to a run's measured one, that bound how fast a repeat of it may run: the
published study's per-worker speeds varied about this much between repeats."""


def values(summary: Summary) -> dict[str, float]:
    numbers = {name: v for name, v in summary.as_dict().items() if not isinstance(v, dict)}
    return {m: float(numbers[m]) for m in (*METRICS, *STREAM_METRICS)}


def relative_errors(real: Summary, sim: Summary) -> dict[str, float]:
    """(sim - real) / real of each metric; NaN where real is 0 or missing."""
    r, s = values(real), values(sim)
    return {m: relative_error(r[m], s[m]) for m in (*METRICS, *STREAM_METRICS)}


def relative_error(real: float, sim: float) -> float:
    """(sim - real) / real; NaN where real is 0 or missing."""
    return (sim - real) / real if real and not math.isnan(real) else math.nan


@dataclass(frozen=True, slots=True)
class Comparison:
    """One policy's real run, its twin on the bare profile, and its twin at the speed and with the
    serving overheads the server measured (``speeds``, one per worker: compute and overhead per
    iteration; ``frontend_s`` per request);
    ``paths`` compares the server's path per request with the adjusted twin's; ``profile_ratio``
    is the run's compute over the profile's prediction for its iterations (overheads.profile_ratio);
    ``hit_rate`` the share of prompt tokens the server's prefix cache held (its ``cached_tokens``;
    NaN where it reported none), beside the adjusted twin's ``sim_hit_rate``."""

    policy: str
    real: Summary
    profile_only: Summary
    adjusted: Summary
    speeds: tuple[AdjustedModel, ...]
    frontend_s: float
    goodput_rps: float
    sim_goodput_rps: float
    paths: PathComparison
    drift_ttft_p90_s: tuple[float, ...] = ()
    profile_ratio: float = math.nan
    hit_rate: float = math.nan

    @property
    def sim_hit_rate(self) -> float:
        return self.adjusted.prefix_hit_rate

    @property
    def drift_width(self) -> float:
        """(max - min) / the twin's P90 TTFT over the twins at ``DRIFT`` speeds and the twin:
        how far repeats of this run would scatter from speed alone, with no other noise."""
        p90s = (*self.drift_ttft_p90_s, self.adjusted.ttft.p90)
        return (max(p90s) - min(p90s)) / self.adjusted.ttft.p90 if self.adjusted.ttft.p90 else math.nan

    def as_dict(self) -> dict[str, object]:
        a = self.speeds
        return {"policy": self.policy, "real": values(self.real), "sim": values(self.adjusted),
                "relative_error": relative_errors(self.real, self.adjusted),
                "sim_profile_only": values(self.profile_only),
                "relative_error_profile_only": relative_errors(self.real, self.profile_only),
                "adjustment": {"compute_scale": [s.scale for s in a],
                               "iteration_overhead_s": [s.overhead for s in a],
                               "transfer_scale": a[0].transfer_scale,
                               "frontend_s": self.frontend_s, "speed": _coefficients(a[0].base),
                               "profile_ratio": nullable(self.profile_ratio)},
                "real_goodput_rps": self.goodput_rps, "sim_goodput_rps": self.sim_goodput_rps,
                "real_prefix_hit_rate": nullable(self.hit_rate), "sim_prefix_hit_rate": self.sim_hit_rate,
                "sim_ttft_p90_s_at_drift": dict(zip(map(str, DRIFT), self.drift_ttft_p90_s, strict=False)),
                "paths": self.paths.as_dict(), "real_completed": self.real.completed,
                "real_failed": self.real.failed, "sim_paths": self.adjusted.paths}


def nullable(x: float) -> float | None:
    """``x`` for JSON: None where it is NaN (no value)."""
    return None if math.isnan(x) else x


def _coefficients(model: LatencyModel) -> dict[str, object] | None:
    """The twin's speed model when it is a fitted one (refitted to the run's iterations; every
    worker shares it, each with its own scale), so the run can be re-simulated from its JSON."""
    return model.to_dict() if isinstance(model, FittedModel) else None
