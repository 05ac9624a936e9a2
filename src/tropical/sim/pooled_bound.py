"""The pooled bound: the work bound with the trace's bursts kept.

The work bound spreads the trace's work evenly over time; a bursty trace queues prompts however
well a cluster is run, so on such a trace no policy comes near it. The pooled bound replays the
trace at each rate on an ideal cluster: every worker pooled into one server that many times as
fast (one prompt may use all of them at once), no interference and no migration, decodes as a
steady tax at the work bound's cost, and prompts served preemptively, earliest TTFT deadline
first, a prompt that can no longer meet its deadline yielding to every other (it still runs, in
time nobody else wants). Its capacity is the highest rate at which the target share of requests
meets its TTFT SLO, never above the work bound. It is an ideal to measure policies against
rather than a proof: deadline order does not always meet the most deadlines.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from tropical.core.capacity import find_capacity
from tropical.core.slo import SLO
from tropical.sim.bound import Work, WorkBound, bound_from, cluster_works
from tropical.sim.ideal_cache import FURTHEST, ideal_hits
from tropical.sim.run import Experiment, request_slos


def deadline_attainment(jobs: Sequence[tuple[float, float, float]], speed: float) -> float:
    """Share of ``jobs`` (arrival, work in seconds of one worker, deadline) done by their deadline
    on one preemptive server doing ``speed`` seconds of work per second, earliest deadline
    first, a job that can no longer make it yielding to every other."""
    if not jobs:
        raise ValueError("deadline attainment needs at least one job")
    if speed <= 0:
        return 0.0
    order = sorted(jobs)
    left = [work for _, work, _ in order]
    queue: list[tuple[float, int]] = []
    now, met, k = 0.0, 0, 0
    while k < len(order) or queue:
        if not queue:
            now = max(now, order[k][0])
        while k < len(order) and order[k][0] <= now:
            heapq.heappush(queue, (order[k][2], k))
            k += 1
        deadline, i = queue[0]
        done = now + left[i] / speed
        following = order[k][0] if k < len(order) else math.inf
        if done > deadline:                    # it yields: it counts as missed either way
            heapq.heappop(queue)
        elif done <= following:
            heapq.heappop(queue)
            met, now = met + 1, done
        else:
            left[i] -= (following - now) * speed
            now = following
    return met / len(order)


def cache_hits(exp: Experiment, kv_limited: bool = False, eviction: str = FURTHEST) -> list[int] | None:
    """Each request's prompt tokens an ideal cluster-wide cache holds (None: the cache is off)."""
    if not exp.prefix_cache:
        return None
    cluster = exp.cluster
    size = sum(w.kv_capacity_tokens for w in cluster.workers) if kv_limited else None
    return ideal_hits(exp.trace.entries, cluster.block_size, size, eviction)


@dataclass(frozen=True, slots=True)
class PooledCluster:
    """An experiment's prompts priced once on its reference worker (``works``, with their SLOs),
    its work bound, and the pooled server: the workers' speeds summed in reference seconds per
    second (``speed``), less ``decode`` seconds of decode tax per request per second of rate."""

    exp: Experiment
    slos: list[SLO]
    works: list[Work]
    bound: WorkBound
    speed: float
    decode: float

    @classmethod
    def of(cls, exp: Experiment) -> PooledCluster:
        """With the experiment's prefix cache on, every prompt is priced less its hit on one
        unbounded cluster-wide cache (see ``ideal_cache``)."""
        slos = request_slos(exp)
        parts = cluster_works(exp.trace, exp.cluster, exp.params.max_seqs, slos, cache_hits(exp))
        reference = parts[0][0]
        total = sum(w.total for w in reference)
        return cls(exp, slos, reference, bound_from(parts),
                   sum(total / sum(w.total for w in works) for works, _ in parts),
                   sum(w.decode for w in reference) / len(reference))

    def jobs(self, rate: float) -> list[tuple[float, float, float]]:
        """Every prompt at ``rate`` req/s: (arrival, prefill work alone, TTFT deadline)."""
        scale = rate / self.exp.trace.mean_rate
        return [(e.arrival / scale, w.prefill, e.arrival / scale + slo.ttft)
                for e, w, slo in zip(self.exp.trace.entries, self.works, self.slos, strict=True)]

    def prefill_speed(self, rate: float) -> float:
        """What the pooled server has left for prompts at ``rate`` req/s, decodes paid."""
        return self.speed - rate * self.decode

    def attainment(self, rate: float) -> float:
        """Share of prompts the pooled server serves within their TTFT SLO at ``rate`` (none at
        or past the work bound)."""
        if rate >= self.bound.rate_rps:
            return 0.0
        return deadline_attainment(self.jobs(rate), self.prefill_speed(rate))

    def capacity(self, target: float = 0.9, rel_tol: float = 0.02) -> float:
        """The pooled bound, in requests per second."""
        mean = self.exp.trace.mean_rate
        found = find_capacity(lambda scale: self.attainment(scale * mean), target=target,
                              rel_tol=rel_tol, start=self.bound.rate_rps / mean / 2)
        return found.rate_scale * mean
