"""Goodput past capacity: every policy under every admission mode, offered more than the work bound;
and each policy's capacity under each mode that refuses.

Attainment's denominator is every arrival and goodput is the requests attained per second of the
run, so a refusal is a miss like any other: admission pays off only where it lets the cluster
serve more requests in time than admitting everything does. The rates are multiples of the work
bound (the rate no policy passes in steady state), so each goodput reads as a share of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from tropical.core.metrics import goodput
from tropical.sched.rejection import AdmissionMode
from tropical.sim.run import Experiment
from tropical.sim.sweep import PolicyCapacity, capacities, run_all, simulate_and_tick

MULTIPLES = (1.5, 2.0)
"""Offered rates as multiples of the work bound (six full runs per policy: a reproduction's
budget; ``overload`` takes others)."""
MODES = tuple(m.value for m in AdmissionMode)
ADMITTING = tuple(m for m in MODES if m != AdmissionMode.NONE.value)
"""The modes that refuse: a policy's capacity without admission is its plain capacity."""


@dataclass(frozen=True, slots=True)
class OverloadPoint:
    """One run past capacity: goodput (req/s), attainment, and refusals per arrival by reason."""

    goodput_rps: float
    attainment: float
    rejected: dict[str, float] = field(default_factory=dict)


@dataclass
class Overload:
    """Every policy's runs past capacity, by admission mode and multiple of the work bound."""

    bound_rps: float
    points: dict[str, dict[str, dict[float, OverloadPoint]]]

    def shares(self, multiples: Sequence[float] = MULTIPLES) -> dict[str, dict[str, dict[str, float]]]:
        """Goodput as a share of the work bound: {policy: {mode: {"1.5": share}}} (the JSON's)."""
        return {policy: {mode: {f"{m:.1f}": runs[m].goodput_rps / self.bound_rps
                                for m in multiples}
                         for mode, runs in modes.items()}
                for policy, modes in self.points.items()}

    def as_dict(self) -> dict:
        return {"bound_rps": self.bound_rps,
                "runs": {policy: {mode: {f"{m:.1f}": asdict(p) for m, p in runs.items()}
                                  for mode, runs in modes.items()}
                         for policy, modes in self.points.items()}}


def overload_point(exp: Experiment) -> OverloadPoint:
    """Run ``exp`` whole (goodput needs every attained request) and keep what the report shows."""
    run = simulate_and_tick(exp)
    arrivals = len(run.requests)
    return OverloadPoint(goodput(run.requests), run.summary.attainment,
                         {reason: n / arrivals for reason, n in run.summary.rejected.items()})


def overload(base: Experiment, policies: Sequence[str], bound_rps: float, processes: int = 2,
             progress: str | None = "overload", multiples: Sequence[float] = MULTIPLES) -> Overload:
    """Each policy at each multiple of ``bound_rps`` under each admission mode."""
    jobs = {(policy, mode, m): (admitting(base.with_policy(policy), mode).at_rate(
                m * bound_rps / base.trace.mean_rate),)
            for policy in policies for mode in MODES for m in multiples}
    found = run_all(overload_point, jobs, processes, progress)
    points: dict[str, dict[str, dict[float, OverloadPoint]]] = {}
    for (policy, mode, m), point in found.items():
        points.setdefault(policy, {}).setdefault(mode, {})[m] = point
    return Overload(bound_rps, points)


def admitting(exp: Experiment, mode: str) -> Experiment:
    """``exp`` under admission ``mode`` (an ``AdmissionMode`` value)."""
    return replace(exp, params=replace(exp.params, admission=AdmissionMode(mode)))


def admission_capacities(base: Experiment, policies: Sequence[str], processes: int = 2,
                         progress: str | None = "admission") -> dict[str, dict[str, PolicyCapacity]]:
    """Each policy's goodput capacity (the paper's metric, a refusal counted as a miss) under each
    admitting mode: {policy: {mode: capacity}}. Admitting everything, a policy can reach its
    capacity by leaving the requests it cannot serve in time queued; refusing them at arrival, it
    cannot."""
    jobs = {(p, mode): admitting(base.with_policy(p), mode) for p in policies for mode in ADMITTING}
    out: dict[str, dict[str, PolicyCapacity]] = {}
    for (policy, mode), found in capacities(jobs, processes=processes, progress=progress).items():
        out.setdefault(policy, {})[mode] = found
    return out
