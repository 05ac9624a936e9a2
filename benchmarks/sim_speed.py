"""Simulated requests per wall-clock second, per policy, on the conversation trace.

Usage: python benchmarks/sim_speed.py [--limit N] [--rate-scales 0.25,0.5,1.0] [--policies a,b] [--json]
Runs every policy on the paper cluster (4 workers of InternLM2-20B, TP=2, A100) side by side
in one process, so the numbers compare with each other on this machine.
"""

from __future__ import annotations

import argparse
import json

from tropical.config import SimConfig
from tropical.report.tables import render
from tropical.sched.registry import policy_names
from tropical.sim.build import experiment
from tropical.sim.run import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N requests (default all)")
    parser.add_argument("--rate-scales", default="0.25,0.5,1.0")
    parser.add_argument("--repeats", type=int, default=3, help="best of N runs per cell")
    parser.add_argument("--policies", default=",".join(policy_names()))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scales = [float(s) for s in args.rate_scales.split(",")]
    base = experiment(SimConfig(limit=args.limit).with_preset())
    rows, out = [], {}
    for policy in args.policies.split(","):
        for scale in scales:
            runs = [simulate(base.with_policy(policy).at_rate(scale)) for _ in range(args.repeats)]
            wall = min(r.sim_wall_s for r in runs)
            speed = len(base.trace) / wall
            out[f"{policy}@{scale:g}"] = speed
            rows.append([policy, f"{scale:g}", str(len(base.trace)), f"{wall:.3f}", f"{speed:,.0f}",
                         f"{runs[0].summary.attainment:.3f}"])
    if args.json:
        print(json.dumps({"requests_per_s": out}))
    else:
        print(render(["policy", "rate scale", "requests", "wall s", "req/s", "attainment"], rows))


if __name__ == "__main__":
    main()
