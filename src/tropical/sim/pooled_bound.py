"""The pooled bound: the work bound with the trace's bursts kept.

The work bound spreads the trace's work evenly over time; a bursty trace queues prompts however
well a cluster is run, so on such a trace no policy comes near it. The pooled bound replays the
trace at each rate on an ideal cluster: every worker pooled into one server that many times as
fast (one prompt may use all of them at once), no interference and no migration, decodes as a
steady tax at the work bound's cost, and prompts served preemptively, earliest TTFT deadline
first, a prompt that can no longer meet its deadline yielding to every other (it still runs, in
time nobody else wants). Its capacity is the highest rate at which the target share of requests
meets its TTFT SLO, never above the work bound. The k-server bound is the same with one server
per worker at a worker's speed, each prompt on one server at a time (``core.kserver``): the ideal
for policies that run each prompt on one worker. Both are ideals to measure policies against
rather than proofs: deadline order does not always meet the most deadlines.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tropical.core.capacity import find_capacity
from tropical.core.kserver import Job, bound_attainment, deadline_attainment
from tropical.core.slo import SLO
from tropical.sim.bound import Work, WorkBound, bound_from, cluster_works
from tropical.sim.ideal_cache import FURTHEST, ideal_hits
from tropical.sim.run import Experiment, request_slos


def cache_hits(exp: Experiment, kv_limited: bool = False, eviction: str = FURTHEST) -> list[int] | None:
    """Each request's prompt tokens an ideal cluster-wide cache holds (None: the cache is off)."""
    if not exp.prefix_cache:
        return None
    cluster = exp.cluster
    size = sum(w.kv_capacity_tokens for w in cluster.workers) if kv_limited else None
    return ideal_hits(exp.trace.entries, cluster.block_size, size, eviction)


def hit_share(exp: Experiment, hits: Sequence[int]) -> float:
    """The share of ``exp``'s prompt tokens that ``hits`` (one per request) cover."""
    return sum(hits) / sum(e.input_len for e in exp.trace.entries)


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
    def of(cls, exp: Experiment, hits: Sequence[int] | None = None) -> PooledCluster:
        """With the experiment's prefix cache on, every prompt is priced less its hit on one
        unbounded cluster-wide cache (see ``ideal_cache``), or less ``hits`` (each request's
        cached prompt tokens, in trace order: a policy's own reuse, ``SimResult.hits``)."""
        slos = request_slos(exp)
        parts = cluster_works(exp.trace, exp.cluster, exp.params.max_seqs, slos,
                              cache_hits(exp) if hits is None else hits)
        reference = parts[0][0]
        total = sum(w.total for w in reference)
        return cls(exp, slos, reference, bound_from(parts),
                   sum(total / sum(w.total for w in works) for works, _ in parts),
                   sum(w.decode for w in reference) / len(reference))

    @property
    def workers(self) -> int:
        """How many servers the k-server bound has: one per worker."""
        return len(self.exp.cluster.workers)

    def jobs(self, rate: float) -> list[Job]:
        """Every prompt at ``rate`` req/s: (arrival, prefill work alone, TTFT deadline)."""
        scale = rate / self.exp.trace.mean_rate
        return [(e.arrival / scale, w.prefill, e.arrival / scale + slo.ttft)
                for e, w, slo in zip(self.exp.trace.entries, self.works, self.slos, strict=True)]

    def prefill_speed(self, rate: float) -> float:
        """What the pooled server has left for prompts at ``rate`` req/s, decodes paid."""
        return self.speed - rate * self.decode

    def attainment(self, rate: float, servers: int = 1) -> float:
        """Share of prompts served within their TTFT SLO at ``rate`` (none at or past the work
        bound) by the pooled server, or with ``servers`` > 1 by that many servers sharing its
        speed, each prompt on one at a time (see ``core.kserver``)."""
        if rate >= self.bound.rate_rps:
            return 0.0
        return deadline_attainment(self.jobs(rate), self.prefill_speed(rate) / servers, servers)

    def servers_attainment(self, rate: float, servers: int, quantum: float = 0.0) -> float:
        """Share of prompts served within their TTFT SLO at ``rate`` by ``servers`` ideal servers
        at one worker's speed each (fewer than the workers: what part of the fleet would do as
        the ideal; ``quantum``: see ``core.kserver``)."""
        if rate >= self.bound.rate_rps:
            return 0.0
        return deadline_attainment(self.jobs(rate), self.prefill_speed(rate) / self.workers, servers, quantum)

    def bound_attainment(self, rate: float, preemptive: bool = True, soonest: bool = False,
                         shares: Sequence[float] | None = None) -> float:
        """``servers_attainment`` of the k servers with each prompt bound at its arrival to the
        one with the least work left, or where it would start soonest, each server at its share
        of one worker's speed (see ``core.kserver.bound_attainment``)."""
        if rate >= self.bound.rate_rps:
            return 0.0
        return bound_attainment(self.jobs(rate), self.prefill_speed(rate) / self.workers, self.workers,
                                preemptive, soonest, shares)

    def capacity(self, target: float = 0.9, rel_tol: float = 0.02, servers: int = 1) -> float:
        """The pooled bound (one server), or with ``servers`` the k-server bound, in req/s."""
        return self._capacity_of(lambda rate: self.attainment(rate, servers), target, rel_tol)

    def ideal_capacities(self, target: float = 0.9, rel_tol: float = 0.02) -> dict[str, float]:
        """The highest rate (req/s) at which each variant of the k-server ideal meets ``target``
        of TTFT SLOs: the bound itself, its servers never preempting, and each prompt bound at
        its arrival to one server, preempting or not (what a router that binds a prompt to a
        worker's queue could reach, and one whose workers run each prompt to its end), and bound
        where it would start soonest, never preempted (``tropical+``'s Path 1 placement)."""
        servers = self.workers
        return {"k servers": self.kserver_capacity(target, rel_tol),
                "k servers, never preempted": self._capacity_of(
                    lambda rate: self.servers_attainment(rate, servers, math.inf), target, rel_tol),
                "k servers, bound at arrival": self._capacity_of(self.bound_attainment, target, rel_tol),
                "k servers, bound at arrival, never preempted": self._capacity_of(
                    lambda rate: self.bound_attainment(rate, preemptive=False), target, rel_tol),
                "k servers, bound where it starts soonest, never preempted": self._capacity_of(
                    lambda rate: self.bound_attainment(rate, False, soonest=True), target, rel_tol)}

    def _capacity_of(self, attained: Callable[[float], float], target: float, rel_tol: float) -> float:
        """The highest rate (req/s) at which ``attained(rate)`` meets ``target``, never past the
        work bound."""
        mean = self.exp.trace.mean_rate
        found = find_capacity(lambda scale: attained(scale * mean), target=target, rel_tol=rel_tol,
                              start=self.bound.rate_rps / mean / 2)
        return found.rate_scale * mean

    def kserver_capacity(self, target: float = 0.9, rel_tol: float = 0.02) -> float:
        """The k-server bound: one server per worker at the worker's share of the pooled speed."""
        return self.capacity(target, rel_tol, self.workers)
