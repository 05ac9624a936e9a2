"""What admission costs below capacity, and what it buys there: each policy's goodput capacity
with each admission mode, as a ratio to its capacity without admission, and the run at each
capacity (requests refused, TTFT tail of those served), measured side by side in one run.

Usage: python benchmarks/admission_capacity.py [--limit N] [--policies a,b] [--jobs N] [--json]
The issue's target: no policy loses more than 2% of its capacity (90% attainment, the paper's
metric) to admission. Capacities come from the same bisection ``tropical sweep`` runs, on the
first N requests of the conversation trace on the paper cluster (``--limit 0``: all of them).
Without admission a policy that serves by deadline can reach its capacity by leaving the requests
it cannot serve in time queued for as long as the trace lasts; the TTFT tail at capacity shows
it, and admission turns that wait into a refusal at arrival.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from tropical.config import SimConfig
from tropical.report.tables import render
from tropical.sched.rejection import AdmissionMode
from tropical.sim.build import experiment
from tropical.sim.overload import MODES, admitting
from tropical.sim.run import Experiment, simulate
from tropical.sim.sweep import PolicyCapacity, capacities

TAIL = ("attainment", "rejection_rate", "ttft_p50_s", "ttft_p99_s", "ttft_max_s")
"""What the run at a capacity reports (``Summary.as_dict``'s keys)."""


def at_capacity(exp: Experiment, found: PolicyCapacity) -> dict[str, float]:
    """``TAIL`` of ``exp`` run at its capacity."""
    summary = simulate(exp.at_rate(found.result.rate_scale)).summary.as_dict()
    return {key: summary[key] for key in TAIL}


Cell = tuple[str, str]
"""A policy and an admission mode."""


def rows(rps: dict[Cell, float], tails: dict[Cell, dict[str, float]]) -> list[list[str]]:
    """One row per policy and admission mode: capacity, its ratio to none's, and the tail there."""
    out = []
    for (policy, mode), cap in rps.items():
        none, tail = rps[(policy, AdmissionMode.NONE.value)], tails[(policy, mode)]
        out.append([policy, mode, f"{cap:.3f}", f"{cap / none:.3f}" if none else "nan",
                    f"{tail['rejection_rate']:.1%}", f"{tail['ttft_p50_s']:.2f}",
                    f"{tail['ttft_p99_s']:,.1f}", f"{tail['ttft_max_s']:,.0f}"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=3000, help="first N requests of the trace (0: all)")
    parser.add_argument("--policies", default="chunked-512,kv-router,disagg,tropical,tropical+")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = experiment(replace(SimConfig().with_preset(), limit=args.limit or None))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    jobs = {(p, mode): admitting(base.with_policy(p), mode) for p in policies for mode in MODES}
    found = capacities(jobs, processes=args.jobs, progress=None if args.json else "capacity search")
    rps = {key: found[key].capacity_rps for key in jobs}
    tails = {key: at_capacity(jobs[key], found[key]) for key in jobs}
    if args.json:
        print(json.dumps({"limit": args.limit, "capacity_rps": {f"{p} {m}": c for (p, m), c in rps.items()},
                          "ratio_to_none": {p: {m: rps[(p, m)] / rps[(p, "none")]
                                                if rps[(p, "none")] else float("nan") for m in MODES}
                                            for p in policies},
                          "at_capacity": {f"{p} {m}": t for (p, m), t in tails.items()}}))
        return
    print(render(["policy", "admission", "capacity (req/s)", "of none's", "refused there", "TTFT P50 (s)",
                  "TTFT P99 (s)", "TTFT max (s)"], rows(rps, tails)))


if __name__ == "__main__":
    main()
