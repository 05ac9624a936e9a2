"""How fast this host runs the model against the profile a study decides with, and the study's
load matched to it.

A study's rate and SLOs are absolute. On a host slower than its profile's, the same rate is a
heavier load: queues grow, attainment falls and repeats scatter, so the published tables do not
come back (a host 2-4x slower at SmolLM2 got 52-71% attainment where the published study got
97-99%). A quick profile of the engine, taken before the first live run, says so in under a
minute rather than after an hour; matching then runs the same study in the host's time units:
the rate divided by the host's ratio, the SLOs and the profile's times multiplied by it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tropical.core.latency.fitted import FittedModel

if TYPE_CHECKING:
    from tropical.engine.profiler import ProfileResult, Sample
    from tropical.fidelity.run import FidelityConfig

TOLERANCE = 1.25  # a ratio beyond this (or below its inverse) changes the study's queues


@dataclass(frozen=True, slots=True)
class HostSpeed:
    """Seconds this host took over the seconds the profile predicts for the same iterations:
    in all (``ratio``; above 1, this host is slower) and per kind of iteration."""

    ratio: float
    by_kind: dict[str, float]

    @classmethod
    def of(cls, samples: Sequence[Sample], profile: FittedModel) -> HostSpeed:
        if not samples:
            raise ValueError("host speed needs at least one measured iteration")
        kinds = dict.fromkeys(s.kind for s in samples)
        return cls(_ratio(samples, profile),
                   {k: _ratio([s for s in samples if s.kind == k], profile) for k in kinds})

    @property
    def far(self) -> bool:
        return far(self.ratio)

    def describe(self) -> str:
        kinds = per_kind(self.by_kind)
        return f"this host runs the engine at {self.ratio:.2f}x the profile's times ({kinds})"

    def as_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "by_kind": self.by_kind}


def far(ratio: float) -> bool:
    """Is a host at ``ratio`` times the profile's times far enough from it to change a study's queues?"""
    return not 1 / TOLERANCE <= ratio <= TOLERANCE


def per_kind(by_kind: dict[str, float]) -> str:
    """Ratios per kind of iteration, as the check prints and the report states them."""
    return ", ".join(f"{k} {v:.2f}x" for k, v in by_kind.items())


def _ratio(samples: Sequence[Sample], profile: FittedModel) -> float:
    predicted = sum(profile.iteration_time(s.shape) for s in samples)
    return sum(s.seconds for s in samples) / predicted if predicted > 0 else float("nan")


def profile_here(model: str, threads: int, grid: str) -> ProfileResult:
    """The engine profiled in this process at the workers' thread count."""
    import torch

    from tropical.engine.profiler import GRIDS, profile_model

    torch.set_num_threads(threads)
    return profile_model(model, GRIDS[grid])


def measure_profile(model: str, threads: int, grid: str, path: Path) -> Path:
    """A study's profile measured on this host, written to ``path``."""
    from tropical.engine.profiler import write_profile

    write_profile(profile_here(model, threads, grid), path)
    return path


def measure_host(model: str, threads: int, profile: FittedModel) -> HostSpeed:
    """This host's speed against ``profile`` on the profiler's quick grid (seconds to a minute)."""
    return HostSpeed.of(profile_here(model, threads, "quick").samples, profile)


def matched(cfg: FidelityConfig, speed: HostSpeed,
            profile: FittedModel) -> tuple[FidelityConfig, FittedModel]:
    """``cfg`` in this host's time units: its rate divided by the host's ratio, its SLOs and
    ``profile``'s compute times multiplied by it (KV moves keep their measured speed), so queues,
    decisions and attainment are those of the profile's host. The caller writes the profile
    returned and points the config at it."""
    r = speed.ratio
    return (replace(cfg, rate_scale=cfg.rate_scale / r, slo_ttft_ms=cfg.slo_ttft_ms * r,
                    slo_tpot_ms=cfg.slo_tpot_ms * r), profile.slowed(r))
