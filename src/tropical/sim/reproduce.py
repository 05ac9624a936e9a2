"""The paper's evaluation on the paper cluster, plus the ablation and sensitivity studies.

Capacities of every policy on the full trace under both attainments (the paper's mean TPOT,
and stream attainment, which also bounds every gap between two tokens) against the work bound
and the pooled bound (the work bound with the trace's bursts kept);
each policy at its own capacity (work left queued at the last arrival, tail TTFT); latency
distributions at a common rate (the best baseline's capacity); attainment against rate; goodput
past capacity under each admission mode and each policy's capacity with admission
(``sim/overload.py``); and
capacity ratios for the toggle's mechanisms one by one, under predictor noise, other role
splits, other traces, SLO settings and shorter requests (on a slice of each trace, for time).
The best baseline is the best of all baseline variants (chunk sizes included) in each setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape
from tropical.core.metrics import miss_cause
from tropical.core.slo import SLOSpec
from tropical.sched.registry import (
    PLUS_DEFAULTS,
    PLUS_MECHANISMS,
    PLUS_PREFILL_BUDGET,
    PLUS_PREFILL_PIECE,
    PLUS_SIZE_WEIGHT,
    PolicyParams,
)
from tropical.sched.rejection import AdmissionMode
from tropical.sched.rules import LATEST_START
from tropical.sched.slack import SlackRule
from tropical.sim.bound import WorkBound, queued_work, unwaited_work, work_bound
from tropical.sim.ideal_cache import FURTHEST, LRU
from tropical.sim.overload import Overload, admission_capacities, overload
from tropical.sim.pooled_bound import PooledCluster, cache_hits, hit_share
from tropical.sim.run import Experiment, SimResult, prefix_note, request_slos
from tropical.sim.sweep import PolicyCapacity, capacities, simulations
from tropical.workload.trace import Trace
from tropical.workload.transform import scale_lengths

PAPER_BASELINES = ("colocated", "chunked-512", "chunked-1024", "chunked-2048", "disagg")
CACHE_ROUTERS = ("kv-router", "kv-router-1024", "kv-router-2048", "kv-router-disagg")
"""Cache-aware router baselines: they differ from the paper's only where prompts share prefixes."""
BASELINES = (*PAPER_BASELINES, *CACHE_ROUTERS)
TOGGLES = ("tropical", "tropical+")
CURVE_POINTS = 7
CURVE_FLOOR = 0.05
_PLUS_BEFORE: dict[str, object] = {**PLUS_MECHANISMS, **PLUS_DEFAULTS, "shorter_first": False,
                                   "iteration_cap": False, "joining_decodes": False}
"""``tropical+`` before Path 2 at arrival waited for shorter prompts at risk (and before its
multiplexing iterations kept within the tightest TTFT SLO's room, and before Path 2 priced
chunks beside the decodes its queued prompts become): the ablation's rows up to it take away one
mechanism more each."""
ABLATION: dict[str, dict[str, object]] = {
    "paper toggle (per-iteration slack)": {},
    "banked slack": {"slack": SlackRule.BANKED},
    "banked slack + demotion": {"slack": SlackRule.BANKED, "demote_doomed": True},
    "chunked multiplexing": {"chunked": True},
    "chunked multiplexing + demotion": {"chunked": True, "demote_doomed": True},
    "chunked multiplexing + laxity order": {"chunked": True, "laxity": True},
    "chunked multiplexing + laxity order, baselines' dispatch": PLUS_MECHANISMS,
    "the same + roles both ways": {**PLUS_MECHANISMS, "flex": True},
    "the same + demotion": {**PLUS_MECHANISMS, "demote_doomed": True},
    f"the same + demotion + {PLUS_PREFILL_BUDGET:,}-token prefill batches": {
        **_PLUS_BEFORE, "spare_finishing": False, "placed_dispatch": False, "size_weight": LATEST_START,
        "prefill_piece": 0},
    "the same + finishing prompts spared the prompts queued behind them": {
        **_PLUS_BEFORE, "placed_dispatch": False, "size_weight": LATEST_START, "prefill_piece": 0},
    "the same, cache-blind Path 1 dispatch": {**_PLUS_BEFORE, "placed_dispatch": False, "cache_aware": False,
                                              "size_weight": LATEST_START, "prefill_piece": 0},
    "the same + Path 1 by place in the queue": {**_PLUS_BEFORE, "size_weight": LATEST_START,
                                                "prefill_piece": 0},
    f"the same + queues by deadline + {PLUS_SIZE_WEIGHT:g}x the prompt's prefill": {
        **_PLUS_BEFORE, "prefill_piece": 0},
    f"the same + long prompts in {PLUS_PREFILL_PIECE:,}-token pieces, each rest queued again by its key":
        _PLUS_BEFORE,
    "the same + Path 2 at arrival only where no shorter prompt at risk waits": {
        **PLUS_MECHANISMS, **PLUS_DEFAULTS, "iteration_cap": False, "joining_decodes": False},
    "the same + multiplexing iterations within the room the tightest TTFT SLO leaves": {
        **PLUS_MECHANISMS, **PLUS_DEFAULTS, "joining_decodes": False},
    "the same + Path 2 priced beside the decodes its queued prompts become (tropical+)": {
        **PLUS_MECHANISMS, **PLUS_DEFAULTS},
}
"""Toggle variants of the paper's toggle, one mechanism at a time, up to ``tropical+`` (the
registry's ``PLUS_MECHANISMS`` and ``PLUS_DEFAULTS``) and beyond it."""
PREDICTOR_BIAS = -0.2
"""Every prediction 20% short, as from a profile taken on a faster machine: the case that online
correction exists for."""
TPOT_SCALES = (1.5, 2.0, 3.0)
SHORT_PROMPTS = 0.25


@dataclass
class Study:
    """Capacities (req/s) of some policies under named variants of one setting, under the
    paper's attainment (``capacity``) and stream attainment (``stream``), and each variant's
    work bound (``bound``), pooled bound (``pooled``) and k-server bound (``kserver``), in req/s;
    ``notes`` says why a variant's prompts reuse no cached prefix (see ``prefix_note``)."""

    title: str
    capacity: dict[str, dict[str, float]] = field(default_factory=dict)
    stream: dict[str, dict[str, float]] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    pooled: dict[str, float] = field(default_factory=dict)
    kserver: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def ratios(self, stream: bool = False) -> dict[str, dict[str, float]]:
        """Each policy's capacity over the best baseline's in the same variant."""
        out = {}
        for variant, caps in (self.stream if stream else self.capacity).items():
            out[variant] = {p: ratio(c, best_of(caps)) for p, c in caps.items()}
        return out

    def headroom(self, variant: str, stream: bool = False, pooled: bool = False) -> float:
        """The work bound (or the pooled bound) over the variant's best baseline: the largest
        ratio any policy could reach without deferring work past the trace's end (on a cluster
        as ideal as the pooled one)."""
        bound = (self.pooled if pooled else self.bound)[variant]
        return ratio(bound, best_of((self.stream if stream else self.capacity)[variant]))

    def add(self, variant: str, policy: str, found: PolicyCapacity) -> None:
        self.capacity.setdefault(variant, {})[policy] = found.capacity_rps
        self.stream.setdefault(variant, {})[policy] = found.stream_capacity_rps

    def as_dict(self) -> dict[str, Any]:
        return {"capacity_rps": self.capacity, "stream_capacity_rps": self.stream,
                "bound_rps": self.bound, "pooled_bound_rps": self.pooled, "kserver_bound_rps": self.kserver}

    def add_bounds(self, variant: str, cluster: PooledCluster) -> None:
        """The variant's work, pooled and k-server bounds, all priced on ``cluster``."""
        self.bound[variant], self.pooled[variant] = cluster.bound.rate_rps, cluster.capacity()
        self.kserver[variant] = cluster.kserver_capacity()


def baselines(workers: int, cache: bool = True) -> tuple[str, ...]:
    """Every baseline variant on ``workers`` workers: chunk sizes, and disagg at a quarter and at
    three quarters of them prefilling besides half (a tight TPOT SLO favours more prefill workers:
    fewer decodes per iteration, so each keeps its TPOT), and with a prefix cache the cache-aware
    routers."""
    splits = sorted({max(1, round(workers / 4)), min(workers - 1, round(3 * workers / 4))}
                    - {max(1, workers // 2)})
    return (*(BASELINES if cache else PAPER_BASELINES), *(f"disagg-{k}p" for k in splits if 1 <= k < workers))


def policies(workers: int, cache: bool = True) -> tuple[str, ...]:
    """The policies a reproduction runs: every baseline variant, then the toggles."""
    return (*baselines(workers, cache), *TOGGLES)


def is_baseline(policy: str) -> bool:
    return policy not in TOGGLES


def best_of(caps: dict[str, float]) -> float:
    """The best baseline variant's capacity among ``caps`` (0 when none ran)."""
    return max((c for p, c in caps.items() if is_baseline(p)), default=0.0)


def ratio(value: float, best: float) -> float:
    """``value`` over ``best`` (NaN when there is no ``best``: nothing to compare with)."""
    return value / best if best else float("nan")


@dataclass
class AtRate:
    """One policy run at a rate: is anything deferred past the trace's end? ``missed_s`` is
    the part of the queued work whose requests go on to miss their SLOs (the rest is work
    delayed within its slack, as laxity order delays long prompts with long TTFT SLOs);
    ``unwaited_s`` what would be queued had no request waited at all: in flight, not deferred."""

    result: SimResult
    queued_s: float
    total_s: float
    missed_s: float
    unwaited_s: float

    @property
    def queued_share(self) -> float:
        return self.queued_s / self.total_s if self.total_s else float("nan")

    @property
    def unwaited_share(self) -> float:
        return self.unwaited_s / self.total_s if self.total_s else float("nan")

    def as_dict(self) -> dict:
        run = self.result
        return {**run.summary.as_dict(), "queued_work_s": self.queued_s,
                "queued_missed_work_s": self.missed_s, "queued_work_share": self.queued_share,
                "unwaited_work_s": self.unwaited_s,
                "worker_prefix_hit_rate": [s.prefix_hit_rate for s in run.worker_stats],
                "kv_migrated_bytes_per_request": run.kv_migrated_bytes_per_request}


@dataclass
class Reproduction:
    """Everything the report shows."""

    base: Experiment
    capacity: dict[str, PolicyCapacity]
    common_scale: float
    at_common: dict[str, AtRate]
    curve: dict[str, list[tuple[float, float, float]]]
    studies: list[Study]
    slack: dict[str, float]
    bound: WorkBound
    at_own: dict[str, AtRate]
    pooled_rps: float
    paper: Study | None = None
    ideal_hit_rate: dict[str, float] = field(default_factory=dict)
    ideal_bound: dict[str, float] = field(default_factory=dict)
    reuse_bound: dict[str, float] = field(default_factory=dict)
    overload: Overload | None = None
    kserver_rps: float = 0.0
    admitted: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def best_baseline(self) -> str:
        return max(filter(is_baseline, self.capacity), key=lambda p: self.capacity[p].capacity_rps)

    @property
    def best_stream_baseline(self) -> str:
        return max(filter(is_baseline, self.capacity), key=lambda p: self.capacity[p].stream_capacity_rps)

    def ratio_vs_best_baseline(self) -> dict[str, float]:
        best = self.capacity[self.best_baseline].capacity_rps
        return {p: ratio(c.capacity_rps, best) for p, c in self.capacity.items()}

    def stream_ratio_vs_best_baseline(self) -> dict[str, float]:
        best = self.capacity[self.best_stream_baseline].stream_capacity_rps
        return {p: ratio(c.stream_capacity_rps, best) for p, c in self.capacity.items()}

    def by_admission(self, policy: str) -> dict[str, float]:
        """``policy``'s capacity under each admission mode, ``none`` first."""
        return {AdmissionMode.NONE.value: self.capacity[policy].capacity_rps, **self.admitted.get(policy, {})}

    def with_admission(self, policy: str) -> tuple[str, float]:
        """``policy``'s highest capacity over the admission modes (``none`` on a tie), and the mode."""
        modes = self.by_admission(policy)
        mode = max(modes, key=lambda m: (modes[m], m == AdmissionMode.NONE.value))
        return mode, modes[mode]

    @property
    def best_admitting_baseline(self) -> str:
        """The baseline with the highest capacity in its best admission mode."""
        return max(filter(is_baseline, self.capacity), key=lambda p: self.with_admission(p)[1])

    def admission_ratio_vs_best_baseline(self) -> dict[str, float]:
        """Each policy's capacity in its best admission mode over the best baseline's in its own."""
        best = self.with_admission(self.best_admitting_baseline)[1]
        return {p: ratio(self.with_admission(p)[1], best) for p in self.capacity}

    def headline(self) -> dict:
        """The ``--json`` line: capacities and ratios under both attainments, and the bound."""
        return {
            "capacity_rps": {p: c.capacity_rps for p, c in self.capacity.items()},
            "ratio_vs_best_baseline": self.ratio_vs_best_baseline(),
            "stream_capacity_rps": {p: c.stream_capacity_rps for p, c in self.capacity.items()},
            "stream_ratio_vs_best_baseline": self.stream_ratio_vs_best_baseline(),
            "bound_rps": self.bound.rate_rps,
            "pooled_bound_rps": self.pooled_rps,
            "kserver_bound_rps": self.kserver_rps,
            "prefix_cache": self.base.prefix_cache,
            "host_kv": self.base.host_kv,
            "host_tier": self.base.host_tier,
            "prefix_hit_rate": {p: a.result.summary.prefix_hit_rate for p, a in self.at_own.items()},
            "ideal_prefix_hit_rate": self.ideal_hit_rate,
            "ideal_cache_bound_rps": self.ideal_bound,
            "bound_at_own_reuse_rps": self.reuse_bound,
            **({} if self.paper is None else {"paper_setting": self.paper.as_dict()}),
            **({} if self.overload is None else {"overload": self.overload.shares()}),
            **({} if not self.admitted else {
                "capacity_with_admission_rps": {p: self.by_admission(p) for p in self.capacity},
                "ratio_vs_best_baseline_with_admission": self.admission_ratio_vs_best_baseline()}),
        }

    def as_dict(self) -> dict:
        return {
            "trace": self.base.trace.name,
            "requests": len(self.base.trace),
            **self.headline(),
            "best_baseline": self.best_baseline,
            "best_stream_baseline": self.best_stream_baseline,
            "bound": asdict(self.bound),
            "at_own_capacity": {p: a.as_dict() for p, a in self.at_own.items()},
            "common_rate_rps": self.common_scale * self.base.trace.mean_rate,
            "at_common_rate": {p: a.as_dict() for p, a in self.at_common.items()},
            "sensitivity": {s.title: s.as_dict() for s in self.studies},
            "slack": self.slack,
            **({} if self.overload is None else {"overload_runs": self.overload.as_dict()}),
        }


def reproduce(base: Experiment, slice_of: Callable[[str], Trace], processes: int = 2,
              sensitivity: bool = True, progress: bool = True) -> Reproduction:
    """Run the whole evaluation; ``slice_of(trace name)`` gives the sensitivity workloads."""
    label = "reproduce" if progress else None
    names = policies(len(base.cluster.workers))
    caps = capacities({p: base.with_policy(p) for p in names}, processes=processes, progress=label)
    best = max(filter(is_baseline, names), key=lambda p: caps[p].capacity_rps)
    common = caps[best].result.rate_scale
    runs = simulations({**{(p, "common"): base.with_policy(p).at_rate(common) for p in names},
                        **{(p, "own"): base.with_policy(p).at_rate(caps[p].result.rate_scale)
                           for p in names}},
                       processes=processes, progress=label)
    pooled = PooledCluster.of(base)
    bound = pooled.bound
    curve = attainment_curves(base, caps, processes, label)
    studies = _studies(base, caps, slice_of, processes, label) if sensitivity else []
    cached = base.prefix_cache
    past = overload(base, names, bound.rate_rps, processes, label)
    admitted = admission_capacities(base, names, processes, label)
    return Reproduction(base, caps, common, {p: _at_rate(runs[(p, "common")], bound) for p in names},
                        curve, studies, slack_budget(base), bound,
                        {p: _at_rate(runs[(p, "own")], bound) for p in names}, pooled.capacity(),
                        paper_setting(base, processes, label) if cached else None,
                        *(ideal_caches(base) if cached else ({}, {})),
                        {p: bound_at_reuse(runs[(p, "own")]) for p in names} if cached else {}, past,
                        pooled.kserver_capacity(),
                        {p: {m: c.capacity_rps for m, c in modes.items()} for p, modes in admitted.items()})


def bound_at_reuse(run: SimResult) -> float:
    """The work bound had every request the prefix hit it had in ``run``: what the policy could
    reach with the reuse its caches gave it (the gap to the ideal cache's bound is reuse)."""
    exp = run.experiment
    return work_bound(exp.trace, exp.cluster, exp.params.max_seqs, request_slos(exp), run.hits).rate_rps


IDEAL_CACHES = {"infinite": (False, FURTHEST), "kv": (True, FURTHEST), "kv_lru": (True, LRU)}
"""One cluster-wide cache: unbounded, or the size of the cluster's KV evicting furthest next use
first or least recently used first (as the engines' caches evict)."""


def ideal_caches(base: Experiment) -> tuple[dict[str, float], dict[str, float]]:
    """Each of ``IDEAL_CACHES``: the share of the trace's prompt tokens it holds, and the work
    bound had every request that hit."""
    slos = request_slos(base)
    rates, bounds = {}, {}
    for name, (limited, eviction) in IDEAL_CACHES.items():
        hits = cache_hits(base, limited, eviction) or [0] * len(base.trace)
        rates[name] = hit_share(base, hits)
        bounds[name] = work_bound(base.trace, base.cluster, base.params.max_seqs, slos, hits).rate_rps
    return rates, bounds


PAPER_SETTING = "no prefix cache"


def paper_setting(base: Experiment, processes: int, label: str | None) -> Study:
    """The paper's setting beside a run with the cache: its policies' capacities with every
    prompt computed whole, and the bounds without reuse."""
    plain = base.with_prefix_cache(False)
    names = policies(len(base.cluster.workers), cache=False)
    study = Study("the paper's setting")
    found = capacities({p: plain.with_policy(p) for p in names}, processes=processes, progress=label)
    for p, cap in found.items():
        study.add(PAPER_SETTING, p, cap)
    study.add_bounds(PAPER_SETTING, PooledCluster.of(plain))
    return study


def _at_rate(run: SimResult, bound: WorkBound) -> AtRate:
    """The work left when the last request arrives, priced like the bound."""
    last = max(r.arrival for r in run.requests)
    latency = run.experiment.cluster.reference
    left, total = queued_work(run.requests, latency, bound.batch, last)
    missed, _ = queued_work([r for r in run.requests if miss_cause(r)], latency, bound.batch, last)
    return AtRate(run, left, total, missed, unwaited_work(run.requests, latency, bound.batch, last))


def attainment_curves(base: Experiment, caps: dict[str, PolicyCapacity], processes: int,
                      label: str | None) -> dict[str, list[tuple[float, float, float]]]:
    """(rate, attainment, stream attainment) of every policy on one grid of rates reaching
    past the largest capacity.

    Runs stop once attainment is certain to stay under ``CURVE_FLOOR`` (deep overload), so the
    points under it are lower bounds; the rest are exact.
    """
    top = 1.3 * max(c.result.rate_scale for c in caps.values())
    scales = [top * (i + 1) / CURVE_POINTS for i in range(CURVE_POINTS)]
    grid = {(p, s): base.with_policy(p).at_rate(s) for p in caps for s in scales}
    runs = simulations(grid, processes=processes, progress=label, stop_below=CURVE_FLOOR)
    return {p: [(s * base.trace.mean_rate, runs[(p, s)].summary.attainment,
                 runs[(p, s)].summary.stream_attainment) for s in scales]
            for p in caps}


def _studies(base: Experiment, caps: dict[str, PolicyCapacity], slice_of: Callable[[str], Trace],
             processes: int, label: str | None) -> list[Study]:
    """Every sensitivity variant as one batch of capacity searches (on trace slices)."""
    small = replace(base, trace=slice_of(base.trace.name))
    workers = len(base.cluster.workers)
    names, fixed = policies(workers), baselines(workers)
    jobs: dict[tuple[str, str, str], Experiment] = {}
    for variant, changes in ABLATION.items():
        jobs[("ablation", variant, "tropical")] = replace(
            small.with_policy("tropical"), params=_with_toggle(small.params, **changes))
    for noise in (0.0, 0.1, 0.25):
        for p in names if noise == 0.0 else TOGGLES:
            jobs[("predictor noise", f"±{noise:.0%}", p)] = replace(small.with_policy(p),
                                                                  predictor_noise=noise)
    for p in TOGGLES:
        biased = replace(small.with_policy(p), predictor_bias=PREDICTOR_BIAS)
        jobs[("predictor noise", f"bias {PREDICTOR_BIAS:+.0%}", p)] = biased
        jobs[("predictor noise", f"bias {PREDICTOR_BIAS:+.0%}, corrected online", p)] = replace(
            biased, params=_with_toggle(small.params, correct=True))
    for prefill in range(1, workers):
        for p in ("disagg", *TOGGLES):
            params = _with_toggle(small.params, num_prefill=prefill)
            jobs[("role split", f"{prefill}:{workers - prefill}", p)] = replace(
                small.with_policy(p), params=params)
    for trace in ("synthetic", "azure-code"):
        for p in names:
            jobs[("trace", trace, p)] = replace(small.with_policy(p), trace=slice_of(trace))
    for name, slo in _slo_settings(base.slo).items():
        for p in names:
            jobs[("SLO", name, p)] = replace(small.with_policy(p), slo=slo)
    for p in names:
        jobs[("lengths", f"x{SHORT_PROMPTS:g}", p)] = replace(
            small.with_policy(p), trace=scale_lengths(small.trace, SHORT_PROMPTS))
    starts = {key: exp.at_rate(caps[_policy_of(key[2])].result.rate_scale) for key, exp in jobs.items()}
    found = capacities(starts, rel_tol=0.05, processes=processes, progress=label)
    studies: dict[str, Study] = {}
    for (title, variant, policy), cap in found.items():
        study = studies.setdefault(title, Study(title))
        study.add(variant, policy, cap)
        if variant not in study.bound:
            exp = jobs[(title, variant, policy)]
            study.add_bounds(variant, PooledCluster.of(exp))
            if exp.prefix_cache and (note := prefix_note(exp)):
                study.notes[variant] = note
    reference = f"±{0:.0%}"
    _share_baselines(studies["ablation"], studies["predictor noise"], reference, fixed)
    _share_baselines(studies["predictor noise"], studies["predictor noise"], reference, fixed)
    _share_baselines(studies["role split"], studies["predictor noise"], reference,
                     tuple(b for b in fixed if "disagg" not in b))
    return list(studies.values())


def _slo_settings(slo: SLOSpec) -> dict[str, SLOSpec]:
    """TPOT SLO tightened with TTFT kept, and both scales moved together."""
    out = {f"TPOT {t:g}x, TTFT {slo.ttft_scale:g}x": replace(slo, tpot_scale=t) for t in TPOT_SCALES}
    out.update({f"both {s:g}x": replace(slo, ttft_scale=s, tpot_scale=s) for s in (3.0, 10.0)})
    return out


def _with_toggle(params: PolicyParams, **changes: Any) -> PolicyParams:
    return replace(params, toggle=replace(params.toggle, **changes))


def _policy_of(label: str) -> str:
    """The registered policy behind a study's column label."""
    return label.split(" ")[0]


def _share_baselines(study: Study, source: Study, variant: str, policies: tuple[str, ...]) -> None:
    """Copy capacities that a variant cannot change (baselines ignore predictions and the
    toggle's knobs; colocated workers have no roles) from ``source``'s ``variant`` into every
    variant of ``study``, so each row has its own best baseline."""
    for table, origin in ((study.capacity, source.capacity), (study.stream, source.stream)):
        for caps in table.values():
            for p in policies:
                caps.setdefault(p, origin[variant][p])


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
