"""A bench run's numbers: the simulator's summary of the same requests, plus ITL and goodput."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tropical.bench.record import Measurement
from tropical.core.metrics import Distribution, Summary, attains, span, summarize
from tropical.core.request import Request


@dataclass(frozen=True, slots=True)
class BenchSummary:
    """``core`` as ``tropical sim`` reports it; ITL, goodput and failures only HTTP can show."""

    core: Summary
    itl: Distribution
    goodput_rps: float
    duration_s: float
    failures: dict[str, int]

    def as_dict(self) -> dict[str, object]:
        """Flat JSON-ready keys; queueing and paths are left out (a client cannot see them)."""
        flat = {k: v for k, v in self.core.as_dict().items() if k != "paths" and not k.startswith("queue")}
        for stat in ("p50", "p90", "p99", "mean"):
            flat[f"itl_{stat}_s"] = getattr(self.itl, stat)
        flat.update(goodput_rps=self.goodput_rps, duration_s=self.duration_s, failures=self.failures)
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in flat.items()}


def summarize_bench(measurements: Sequence[Measurement], requests: Sequence[Request]) -> BenchSummary:
    """Goodput is requests attaining both SLOs per second from the first send to the last answer."""
    duration = span(requests)
    attained = sum(map(attains, requests))
    return BenchSummary(
        core=summarize(requests),
        itl=Distribution.of([gap for m in measurements if m.error is None for gap in m.itls()]),
        goodput_rps=attained / duration if duration > 0 else 0.0,
        duration_s=duration,
        failures=dict(Counter(m.error for m in measurements if m.error is not None)),
    )
