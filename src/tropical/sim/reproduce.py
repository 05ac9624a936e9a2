"""The paper's evaluation on the paper cluster, plus the sensitivity studies, as data.

Capacities of every policy on the full trace; latency distributions at a common rate (the best
baseline's capacity); attainment against rate; and capacity ratios under predictor noise,
other role splits, other traces and other SLO scales (on a slice of each trace, for time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape
from tropical.core.slo import SLOSpec
from tropical.sched.registry import PolicyParams
from tropical.sched.slack import SlackRule
from tropical.sim.run import Experiment, SimResult
from tropical.sim.sweep import PolicyCapacity, capacities, simulations
from tropical.workload.trace import Trace

POLICIES = ("colocated", "chunked", "disagg", "tropical", "tropical+")
BASELINES = ("colocated", "chunked", "disagg")
TOGGLES = ("tropical", "tropical+")
CURVE_POINTS = 7
CURVE_FLOOR = 0.05


@dataclass
class Study:
    """Capacities (req/s) of some policies under named variants of one setting."""

    title: str
    capacity: dict[str, dict[str, float]] = field(default_factory=dict)

    def ratios(self) -> dict[str, dict[str, float]]:
        """Each policy's capacity over the best baseline's in the same variant."""
        out = {}
        for variant, caps in self.capacity.items():
            best = max((caps[b] for b in BASELINES if b in caps), default=0.0)
            out[variant] = {p: (c / best if best else float("nan")) for p, c in caps.items()}
        return out


@dataclass
class Reproduction:
    """Everything the report shows."""

    base: Experiment
    capacity: dict[str, PolicyCapacity]
    common_scale: float
    at_common: dict[str, SimResult]
    curve: dict[str, list[tuple[float, float]]]
    studies: list[Study]
    slack: dict[str, float]

    @property
    def best_baseline(self) -> str:
        return max(BASELINES, key=lambda p: self.capacity[p].capacity_rps)

    def ratio_vs_best_baseline(self) -> dict[str, float]:
        best = self.capacity[self.best_baseline].capacity_rps
        return {p: c.capacity_rps / best if best else float("nan") for p, c in self.capacity.items()}

    def as_dict(self) -> dict:
        return {
            "trace": self.base.trace.name,
            "requests": len(self.base.trace),
            "capacity_rps": {p: c.capacity_rps for p, c in self.capacity.items()},
            "ratio_vs_best_baseline": self.ratio_vs_best_baseline(),
            "best_baseline": self.best_baseline,
            "common_rate_rps": self.common_scale * self.base.trace.mean_rate,
            "at_common_rate": {p: r.summary.as_dict() for p, r in self.at_common.items()},
            "sensitivity": {s.title: s.capacity for s in self.studies},
            "slack": self.slack,
        }


def reproduce(base: Experiment, slice_of: Callable[[str], Trace], processes: int = 2,
              sensitivity: bool = True, progress: bool = True) -> Reproduction:
    """Run the whole evaluation; ``slice_of(trace name)`` gives the sensitivity workloads."""
    label = "reproduce" if progress else None
    caps = capacities({p: base.with_policy(p) for p in POLICIES}, processes=processes, progress=label)
    best = max(BASELINES, key=lambda p: caps[p].capacity_rps)
    common = caps[best].result.rate_scale
    at_common = simulations({p: base.with_policy(p).at_rate(common) for p in POLICIES},
                            processes=processes, progress=label)
    curve = attainment_curves(base, caps, processes, label)
    studies = _studies(base, caps, slice_of, processes, label) if sensitivity else []
    return Reproduction(base, caps, common, at_common, curve, studies, slack_budget(base))


def attainment_curves(base: Experiment, caps: dict[str, PolicyCapacity], processes: int,
                      label: str | None) -> dict[str, list[tuple[float, float]]]:
    """Attainment of every policy on one grid of rates reaching past the largest capacity.

    Runs stop once attainment is certain to stay under ``CURVE_FLOOR`` (deep overload), so the
    points under it are lower bounds; the rest are exact.
    """
    top = 1.3 * max(c.result.rate_scale for c in caps.values())
    scales = [top * (i + 1) / CURVE_POINTS for i in range(CURVE_POINTS)]
    grid = {(p, s): base.with_policy(p).at_rate(s) for p in POLICIES for s in scales}
    runs = simulations(grid, processes=processes, progress=label, stop_below=CURVE_FLOOR)
    return {p: [(s * base.trace.mean_rate, runs[(p, s)].summary.attainment) for s in scales]
            for p in POLICIES}


def _studies(base: Experiment, caps: dict[str, PolicyCapacity], slice_of: Callable[[str], Trace],
             processes: int, label: str | None) -> list[Study]:
    """Every sensitivity variant as one batch of capacity searches."""
    small = replace(base, trace=slice_of(base.trace.name))
    jobs: dict[tuple[str, str, str], Experiment] = {}
    jobs[("slack rule", "full trace", "tropical (banked slack)")] = replace(
        base.with_policy("tropical"), params=_with_toggle(base.params, slack=SlackRule.BANKED))
    for noise in (0.0, 0.1, 0.25):
        for p in (*BASELINES, *TOGGLES) if noise == 0.0 else TOGGLES:
            noisy = replace(small.with_policy(p), predictor_noise=noise)
            jobs[("predictor noise", f"±{noise:.0%}", p)] = noisy
    workers = len(base.cluster.workers)
    for prefill in range(1, workers):
        for p in (*BASELINES, *TOGGLES):
            if p in ("disagg", *TOGGLES) or prefill == workers // 2:
                params = _with_toggle(small.params, num_prefill=prefill)
                split = f"{prefill}:{workers - prefill}"
                jobs[("role split", split, p)] = replace(small.with_policy(p), params=params)
    for trace in ("synthetic", "azure-code"):
        for p in POLICIES:
            jobs[("trace", trace, p)] = replace(small.with_policy(p), trace=slice_of(trace))
    for scale in (3.0, 10.0):
        for p in POLICIES:
            jobs[("SLO scale", f"{scale:g}x", p)] = replace(small.with_policy(p),
                                                           slo=SLOSpec(ttft_scale=scale, tpot_scale=scale))
    starts = {key: exp.at_rate(caps[_policy_of(key[2])].result.rate_scale) for key, exp in jobs.items()}
    found = capacities(starts, rel_tol=0.05, processes=processes, progress=label)
    studies: dict[str, Study] = {}
    for (title, variant, policy), cap in found.items():
        studies.setdefault(title, Study(title)).capacity.setdefault(variant, {})[policy] = cap.capacity_rps
    studies["slack rule"].capacity["full trace"].update(
        {p: caps[p].capacity_rps for p in POLICIES})
    _share_baselines(studies["predictor noise"], "±0%", BASELINES)
    _share_baselines(studies["role split"], f"{workers // 2}:{workers - workers // 2}",
                     ("colocated", "chunked"))
    return list(studies.values())


def _with_toggle(params: PolicyParams, **changes: object) -> PolicyParams:
    return replace(params, toggle=replace(params.toggle, **changes))


def _policy_of(label: str) -> str:
    """The registered policy behind a study's column label ('tropical (banked slack)')."""
    return label.split(" ")[0]


def _share_baselines(study: Study, source: str, policies: tuple[str, ...]) -> None:
    """Copy capacities that a variant cannot change (baselines ignore predictions; colocated
    workers have no roles) from ``source`` into every other variant, so each row has its own
    best baseline."""
    for caps in study.capacity.values():
        for p in policies:
            caps.setdefault(p, study.capacity[source][p])


def slack_budget(base: Experiment) -> dict[str, float]:
    """DESIGN.md's back-of-envelope, measured on the reference model: how many prompt tokens
    one decode iteration's TPOT slack admits, against the trace's median prompt."""
    model = base.cluster.reference
    prompts = sorted(e.input_len for e in base.trace.entries)
    median = prompts[len(prompts) // 2]
    tpot_slo = base.slo.resolve(median, model).tpot
    out = {"median_prompt_tokens": float(median), "tpot_slo_s": tpot_slo,
           "prefill_ms_per_token": 1e3 * model.iteration_time(BatchShape.prefill(4096)) / 4096}
    for batch in (8, 32):
        decode = BatchShape.decode(batch, batch * 8192)
        out[f"decode_iteration_s_batch{batch}"] = model.iteration_time(decode)
        tokens = _max_admissible(model, decode, tpot_slo)
        out[f"admissible_prefill_tokens_batch{batch}"] = float(tokens)
        out[f"requests_within_batch{batch}_budget"] = sum(p <= tokens for p in prompts) / len(prompts)
    return out


def _max_admissible(model: LatencyModel, decode: BatchShape, limit: float) -> int:
    """Largest prompt whose prefill fits beside ``decode`` in one iteration of at most ``limit``."""
    def fits(n: int) -> bool:
        mixed = replace(BatchShape.prefill(n), decode_count=decode.decode_count,
                        decode_context=decode.decode_context)
        return model.iteration_time(mixed) <= limit
    if not fits(1):
        return 0
    lo, hi = 1, 1
    while fits(hi * 2) and hi < 1 << 22:
        hi *= 2
    lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
