"""Goodput past capacity on the full trace: the "overload" section of ``tropical reproduce`` alone.

Usage: python benchmarks/overload.py [--policies a,b] [--trace conversation] [--jobs N] [--json]
Each policy under each admission mode (none, early-reject, predictive) at 1.5x and 2x the trace's
work bound on the paper cluster, run whole by ``sim.overload.overload`` as the reproduction runs
it: goodput (requests attained per second of the run) as a share of the bound, and the requests
refused per arrival. A reproduction spends most of its time elsewhere; this reruns only this part.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from tropical.config import SimConfig
from tropical.report.tables import render
from tropical.sim.build import experiment
from tropical.sim.overload import MODES, MULTIPLES, overload
from tropical.sim.pooled_bound import PooledCluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="chunked-512,kv-router,disagg,tropical,tropical+")
    parser.add_argument("--trace", default="conversation")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = experiment(replace(SimConfig().with_preset(), trace=args.trace))
    bound = PooledCluster.of(base).bound.rate_rps
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    past = overload(base, policies, bound, args.jobs, None if args.json else "overload")
    if args.json:
        print(json.dumps({"trace": args.trace, "bound_rps": bound, "overload": past.shares(),
                          "runs": past.as_dict()["runs"]}))
        return
    shares = past.shares()
    rows = [[p, *(f"{shares[p][mode][f'{m:.1f}']:.0%}" for mode in MODES for m in MULTIPLES)]
            for p in policies]
    print(f"work bound {bound:.3f} req/s; goodput as a share of it")
    print(render(["policy", *(f"{mode} {m:g}x" for mode in MODES for m in MULTIPLES)], rows))


if __name__ == "__main__":
    main()
