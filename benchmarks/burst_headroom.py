"""Where a bursty trace's headroom lies: policies against ideal clusters on the same requests.

For each rate, the share of requests that meet their TTFT SLO (and, for the simulated policies,
their whole SLO) under:

- each policy, simulated (``tropical sim``'s attainment);
- the pooled bound's server: every worker pooled into one, preemptive, earliest deadline first,
  a prompt that can no longer make it yielding (``tropical.sim.pooled_bound``);
- the workers as separate servers sharing one global queue in deadline order, each prompt on one
  server without preemption, with and without hopeless prompts yielding.

Every ideal prices a prompt at its prefill alone on the reference worker and charges decodes as a
steady tax at the work bound's cost, as the bounds do. Where an ideal attains more than a policy,
the columns say by which mechanism a policy could still win: the gap between the two
separate-server columns is yielding, the gap from them down to a policy is dispatch and
interference. The separate servers neither preempt nor chunk, so a policy that does may attain
more than they do (long prompts); they bound nothing.

    .venv/bin/python benchmarks/burst_headroom.py --trace azure-code --limit 3000 --rates 1.35,2,3,4.3
"""

from __future__ import annotations

import argparse
import heapq
from collections.abc import Sequence

from tropical.config import SimConfig
from tropical.report.tables import render
from tropical.sim.build import experiment
from tropical.sim.pooled_bound import PooledCluster, deadline_attainment
from tropical.sim.run import simulate


def separate_attainment(jobs: Sequence[tuple[float, float, float]], servers: int, speed: float,
                        yields: bool) -> float:
    """Share of ``jobs`` (arrival, work, deadline) done by their deadline on ``servers`` servers of
    ``speed`` each, one global queue in deadline order, no preemption; with ``yields`` a job that
    would finish late when its turn comes is left for idle time (it misses either way)."""
    order = sorted(jobs)
    free = [0.0] * servers
    queue: list[tuple[float, int]] = []
    met = k = 0
    while k < len(order) or queue:
        now = free[0] if queue else max(free[0], order[k][0])
        while k < len(order) and order[k][0] <= now:
            heapq.heappush(queue, (order[k][2], k))
            k += 1
        deadline, i = heapq.heappop(queue)
        done = now + order[i][1] / speed
        if yields and done > deadline:
            continue
        heapq.heapreplace(free, done)
        met += done <= deadline
    return met / len(order)


def ideals(pooled: PooledCluster, rate: float) -> dict[str, float]:
    """TTFT attainment of the three ideal clusters at ``rate`` req/s."""
    jobs, speed = pooled.jobs(rate), pooled.prefill_speed(rate)
    servers = len(pooled.exp.cluster.workers)
    return {"pooled": deadline_attainment(jobs, speed),
            "separate, yielding": separate_attainment(jobs, servers, speed / servers, True),
            "separate, no yielding": separate_attainment(jobs, servers, speed / servers, False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="azure-code")
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--rates", default="1,2,3", help="request rates in req/s")
    parser.add_argument("--policies", default="chunked-512,tropical+")
    args = parser.parse_args()
    base = experiment(SimConfig(trace=args.trace, limit=args.limit).with_preset())
    policies = args.policies.split(",")
    pooled = PooledCluster.of(base)
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        simulated = [simulate(base.with_policy(p).at_rate(rate / base.trace.mean_rate)).summary.attainment
                     for p in policies]
        rows.append([f"{rate:g}", *(f"{a:.1%}" for a in simulated),
                     *(f"{a:.1%}" for a in ideals(pooled, rate).values())])
    print(render(["rate (req/s)", *policies, "pooled (TTFT)", "separate, yielding (TTFT)",
                  "separate, no yielding (TTFT)"], rows))


if __name__ == "__main__":
    main()
