"""One simulated experiment: a trace through a cluster under a policy, summarized."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from tropical.core.gaps import GapHistogram
from tropical.core.metrics import Summary, summarize
from tropical.core.request import Request
from tropical.core.slo import SLO, SLOMix, SLOSpec
from tropical.native import running
from tropical.sched.registry import PolicyParams, make_policy
from tropical.sched.rules import Role
from tropical.sim.cluster import ClusterSpec
from tropical.sim.collection import collection_held
from tropical.sim.simulator import Simulator, WorkerStats
from tropical.workload.trace import PREFIX_BLOCK_TOKENS, Trace
from tropical.workload.transform import scale_rate

HOST_TIERS = ("per-worker", "shared")
"""Whose host memory a worker's prefix cache loads from (``--host-tier``)."""


@dataclass(frozen=True)
class Experiment:
    """Everything a run depends on; runs of one Experiment are identical."""

    trace: Trace
    cluster: ClusterSpec
    policy: str
    params: PolicyParams = field(default_factory=PolicyParams)
    slo: SLOSpec = field(default_factory=SLOSpec)
    rate_scale: float = 1.0
    predictor_noise: float = 0.0
    seed: int = 0
    slo_mix: SLOMix | None = None
    predictor_bias: float = 0.0
    prefix_cache: bool = True
    host_kv: float = 0.0
    """Host memory for each worker's prefix cache, as a multiple of its KV pool (0: none)."""
    host_tier: str = "per-worker"
    """Whose host memory a worker loads from: its own (per-worker) or all of it (shared)."""

    def at_rate(self, rate_scale: float) -> Experiment:
        return replace(self, rate_scale=rate_scale)

    def with_policy(self, policy: str) -> Experiment:
        return replace(self, policy=policy)

    def with_prefix_cache(self, on: bool) -> Experiment:
        """The same run with the prefix cache on or off (off takes its host tier with it)."""
        return replace(self, prefix_cache=on, host_kv=self.host_kv if on else 0.0)

    def with_host_kv(self, host_kv: float, tier: str | None = None) -> Experiment:
        """The same run with ``host_kv`` times each worker's KV pool in host memory, each
        worker's own or shared (``tier``; default: as it was)."""
        tier = self.host_tier if tier is None else tier
        if host_kv < 0:
            raise ValueError(f"--host-kv {host_kv:g}: host memory is a multiple of each worker's KV "
                             "pool, at least 0")
        if host_kv and not self.prefix_cache:
            raise ValueError(f"--host-kv {host_kv:g} needs --prefix-cache on: host memory keeps the "
                             "prefix cache's blocks")
        if tier not in HOST_TIERS:
            raise ValueError(f"--host-tier {tier!r}: one of {', '.join(HOST_TIERS)}")
        return replace(self, host_kv=host_kv, host_tier=tier)


@dataclass
class SimResult:
    """A finished run: its summary, its requests (with their timestamps) and per-worker stats."""

    experiment: Experiment
    summary: Summary
    requests: list[Request]
    roles: list[Role]
    worker_stats: list[WorkerStats]
    sim_wall_s: float
    decision_us: tuple[float, float] = (0.0, 0.0)
    """P50 and P99 of the wall time of one decision (an arrival or an iteration's end)."""

    def as_dict(self) -> dict:
        """The CLI's JSON object."""
        span = max(self.span, 1e-12)  # over every request: once, not once per worker
        return {
            "policy": self.experiment.policy,
            "trace": self.experiment.trace.name,
            "cluster": self.experiment.cluster.name,
            "rate_scale": self.experiment.rate_scale,
            "rate_rps": self.experiment.rate_scale * self.experiment.trace.mean_rate,
            **self.summary.as_dict(),
            "kv_migrated_bytes_per_request": self.kv_migrated_bytes_per_request,
            "prefix_cache": self.experiment.prefix_cache,
            "host_kv": self.experiment.host_kv,
            "host_tier": self.experiment.host_tier,
            "host_load_rate": self.host_load_rate,
            "prefix_note": prefix_note(self.experiment),
            "workers": [
                {"role": role.value, "busy_fraction": s.busy / span,
                 "prefill_busy_fraction": s.prefill_busy / span,
                 "iterations": s.iterations, "prefill_tokens": s.prefill_tokens,
                 "prefix_hit_rate": s.prefix_hit_rate}
                for role, s in zip(self.roles, self.worker_stats, strict=True)
            ],
            "sim_wall_s": self.sim_wall_s,
            "decision_p50_us": self.decision_us[0],
            "decision_p99_us": self.decision_us[1],
            "native": running(),
        }

    @property
    def host_load_rate(self) -> float:
        """Tokens of KV loaded from host memory over prompt tokens prefilled (the part of the
        prefix hit rate the host tier gave; loads for migrations count too)."""
        prompts = sum(s.prompt_tokens for s in self.worker_stats)
        return sum(s.loaded_tokens for s in self.worker_stats) / prompts if prompts else 0.0

    @property
    def hits(self) -> list[int]:
        """Each request's prompt tokens found cached where it was prefilled that other requests
        computed, in trace order: the reuse this run's caches gave, for bounds priced at it."""
        return [r.reused for r in sorted(self.requests, key=lambda r: r.id)]

    @property
    def kv_migrated_bytes_per_request(self) -> float:
        """Bytes of KV moved between workers, per request (what prefix caching saves)."""
        return self.summary.migrated_tokens * self.experiment.cluster.kv_bytes_per_token

    @property
    def span(self) -> float:
        finishes = [r.finish for r in self.requests if r.finish is not None]
        return max(finishes) - self.requests[0].arrival if finishes else 0.0


def prefix_note(exp: Experiment) -> str:
    """Why some prompts cannot reuse cached prefixes in this run ('' when all may)."""
    if not exp.prefix_cache:
        return "prefix caching is off (--prefix-cache off)"
    if exp.trace.prefix_note or any(e.prefix_blocks for e in exp.trace.entries):
        return exp.trace.prefix_note
    return (f"trace {exp.trace.name} records no prefix hashes (hash_ids): every prompt is computed "
            "whole, so every hit rate is 0")


def request_slos(exp: Experiment) -> list[SLO]:
    """Each trace entry's SLO, priced on the cluster's reference replica (its class's spec when
    the experiment mixes SLO classes)."""
    ref = exp.cluster.reference
    entries = exp.trace.entries
    specs = exp.slo_mix.assign(len(entries)) if exp.slo_mix else [exp.slo] * len(entries)
    return [spec.resolve(e.input_len, ref) for spec, e in zip(specs, entries, strict=True)]


def make_requests(exp: Experiment) -> list[Request]:
    trace = scale_rate(exp.trace, exp.rate_scale)
    return [Request(i, e.arrival, e.input_len, e.output_len, slo, prefix=e.prefix_blocks,
                    prefix_block=PREFIX_BLOCK_TOKENS)
            for i, (e, slo) in enumerate(zip(trace.entries, request_slos(exp), strict=True))]


def simulate(exp: Experiment, stop_below: float | None = None) -> SimResult:
    """Run ``exp`` once and summarize it.

    ``stop_below``: end early once attainment can no longer reach this fraction; requests not
    simulated then count as failed, so the summary's attainment is a lower bound below it.
    """
    policy = make_policy(exp.policy, exp.params)
    workers = exp.cluster.build(policy, exp.predictor_noise, exp.seed, exp.predictor_bias, exp.prefix_cache,
                                exp.host_kv, exp.host_tier == "shared")
    requests = make_requests(exp)
    budget = None if stop_below is None else int((1 - stop_below) * len(requests))
    started = time.perf_counter()
    sim = Simulator(workers, policy, requests, exp.cluster.max_context, budget, exp.cluster.truth)
    with collection_held():
        sim.run()
    wall = time.perf_counter() - started
    gaps = GapHistogram.merged(w.gaps.histogram for w in workers)
    return SimResult(exp, summarize(requests, gaps), requests, [w.role for w in workers],
                     sim.stats, wall, decision_percentiles(sim.decision_s))


def decision_percentiles(seconds: list[float]) -> tuple[float, float]:
    """P50 and P99 of decision times, in microseconds (zeros when none was made)."""
    if not seconds:
        return 0.0, 0.0
    ranked = sorted(seconds)
    p50, p99 = (ranked[min(len(ranked) - 1, int(q * len(ranked)))] * 1e6 for q in (0.50, 0.99))
    return p50, p99
