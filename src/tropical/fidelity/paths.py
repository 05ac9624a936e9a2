"""Request by request: did the live server and the twin send each request down the same path?

The toggle's path is a threshold decision, so an aggregate gap (say TTFT P50) can come from a
few requests that went the other way; comparing paths per request shows whether they did, and
the first request (by arrival) that diverged is where the two runs' states first differed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tropical.bench.record import Measurement
from tropical.core.request import Request


@dataclass(frozen=True, slots=True)
class Divergence:
    """One request whose real and simulated paths differ, with each side's reason for its choice
    (the toggle's reasons carry its predicted TTFT, so they show how far the two states had drifted)."""

    id: int
    arrival_s: float
    real_path: str
    sim_path: str
    real_prefill_worker: str | None
    sim_prefill_worker: int | None
    real_reason: str | None
    sim_reason: str


@dataclass(frozen=True, slots=True)
class PathComparison:
    """``same`` of ``compared`` requests took the same path; the earliest that did not, if any."""

    compared: int
    same: int
    first_divergence: Divergence | None

    @property
    def agreement(self) -> float:
        return self.same / self.compared if self.compared else math.nan

    def as_dict(self) -> dict[str, object]:
        first = self.first_divergence
        return {"compared": self.compared, "same": self.same,
                "path_agreement": None if math.isnan(self.agreement) else self.agreement,
                "first_divergence": None if first is None else asdict(first)}


def compare_paths(measured: Sequence[Measurement], twin: Sequence[Request]) -> PathComparison:
    """Compare each request the server named a path for (its ``x-tropical-path`` header) with the
    twin's request of the same id; requests without the header (failed early, or another server)
    are left out of the share."""
    simulated = {r.id: r for r in twin}
    pairs = [(m, simulated[m.id]) for m in measured if m.path is not None and m.id in simulated]
    differ = [(m, r) for m, r in pairs if m.path != r.path.value]
    first = None
    if differ:
        m, r = min(differ, key=lambda pair: (pair[1].arrival, pair[1].id))
        first = Divergence(r.id, r.arrival, str(m.path), r.path.value, m.prefill_worker, r.prefill_worker,
                           m.reason, r.reason)
    return PathComparison(len(pairs), len(pairs) - len(differ), first)


def merge(comparisons: Sequence[PathComparison]) -> PathComparison:
    """Several runs' comparisons as one: counts summed, the earliest divergence by arrival."""
    firsts = [c.first_divergence for c in comparisons if c.first_divergence is not None]
    first = min(firsts, key=lambda d: (d.arrival_s, d.id), default=None)
    return PathComparison(sum(c.compared for c in comparisons), sum(c.same for c in comparisons), first)
