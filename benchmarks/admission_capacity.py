"""What admission costs below capacity: each policy's goodput capacity with each admission mode,
as a ratio to its capacity without admission, measured side by side in one run.

Usage: python benchmarks/admission_capacity.py [--limit N] [--policies a,b] [--jobs N] [--json]
The issue's target: no policy loses more than 2% of its capacity (90% attainment, the paper's
metric) to admission. Capacities come from the same bisection ``tropical sweep`` runs, on the
first N requests of the conversation trace on the paper cluster.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from tropical.config import SimConfig
from tropical.report.tables import render
from tropical.sched.rejection import AdmissionMode
from tropical.sim.build import experiment
from tropical.sim.sweep import capacities


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=3000, help="first N requests of the trace")
    parser.add_argument("--policies", default="chunked-512,kv-router,disagg,tropical,tropical+")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = experiment(replace(SimConfig().with_preset(), limit=args.limit))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    jobs = {(p, mode.value): replace(base.with_policy(p), params=replace(base.params, admission=mode))
            for p in policies for mode in AdmissionMode}
    found = capacities(jobs, processes=args.jobs, progress=None if args.json else "capacity search")
    rps = {key: cap.capacity_rps for key, cap in found.items()}
    table = {p: {m.value: rps[(p, m.value)] / rps[(p, "none")] if rps[(p, "none")] else float("nan")
                 for m in AdmissionMode} for p in policies}
    if args.json:
        print(json.dumps({"limit": args.limit, "capacity_rps": {f"{p} {m}": c for (p, m), c in rps.items()},
                          "ratio_to_none": table}))
        return
    rows = [[p, f"{rps[(p, 'none')]:.3f}", *(f"{table[p][m.value]:.3f}" for m in AdmissionMode)]
            for p in policies]
    print(render(["policy", "capacity, none (req/s)", *(f"{m.value} / none" for m in AdmissionMode)], rows))


if __name__ == "__main__":
    main()
