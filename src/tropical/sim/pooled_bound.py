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

from tropical.core.capacity import find_capacity
from tropical.sim.bound import bound_from, worker_works
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


def pooled_bound(exp: Experiment, target: float = 0.9, rel_tol: float = 0.02) -> float:
    """The pooled bound of an experiment's trace, cluster and SLOs, in requests per second."""
    slos = request_slos(exp)
    parts = [worker_works(exp.trace, spec, exp.params.max_seqs, slos) for spec in exp.cluster.workers]
    bound = bound_from(parts)
    reference = parts[0][0]
    total = sum(w.total for w in reference)
    speed = sum(total / sum(w.total for w in works) for works, _ in parts)
    decode = sum(w.decode for w in reference) / len(reference)

    def attainment(scale: float) -> float:
        rate = scale * exp.trace.mean_rate
        if rate >= bound.rate_rps:
            return 0.0
        jobs = [(e.arrival / scale, w.prefill, e.arrival / scale + slo.ttft)
                for e, w, slo in zip(exp.trace.entries, reference, slos, strict=True)]
        return deadline_attainment(jobs, speed - rate * decode)

    found = find_capacity(attainment, target=target, rel_tol=rel_tol,
                          start=bound.rate_rps / exp.trace.mean_rate / 2)
    return found.rate_scale * exp.trace.mean_rate
