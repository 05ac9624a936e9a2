"""Simulated requests per wall-clock second, per policy, on the conversation trace.

Usage: python benchmarks/sim_speed.py [--limit N] [--rate-scales 0.25,0.5,1.0] [--policies a,b]
                                      [--prefix-cache on|off|on,off] [--json]
Runs every policy on the paper cluster (4 workers of InternLM2-20B, TP=2, A100) side by side
in one process, so the numbers compare with each other on this machine; each is also given as
a share of colocated's speed at the same rate (colocated runs too if not asked for), a ratio
that carries from one host to another where req/s do not. Runs compiled where ``tropical native
build`` built the simulator for these sources (``TROPICAL_NATIVE=0``: plain), and says which.
"""

from __future__ import annotations

import argparse
import json

from tropical import native
from tropical.config import SimConfig
from tropical.report.tables import render
from tropical.sched.registry import policy_names
from tropical.sim.build import experiment
from tropical.sim.run import simulate

REFERENCE = "colocated"
"""The simplest policy: its speed is the simulator's own, the yardstick for the others."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N requests (default all)")
    parser.add_argument("--rate-scales", default="0.25,0.5,1.0")
    parser.add_argument("--repeats", type=int, default=3, help="best of N runs per cell")
    parser.add_argument("--policies", default=",".join(policy_names()))
    parser.add_argument("--prefix-cache", default="on",
                        help="on, off, or on,off: each policy with and without the prefix cache, runs "
                             "alternating, so the two compare side by side")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scales = [float(s) for s in args.rate_scales.split(",")]
    caches = [c.strip() for c in args.prefix_cache.split(",")]
    if not caches or set(caches) - {"on", "off"}:
        parser.error(f"--prefix-cache takes on, off or on,off, got {args.prefix_cache!r}")
    base = experiment(SimConfig(limit=args.limit).with_preset())
    policies = args.policies.split(",")
    rows, out, shares, walls, attained = [], {}, {}, {}, {}
    for policy in ([REFERENCE] if REFERENCE not in policies else []) + policies:
        for scale in scales:
            for _ in range(args.repeats):
                for cache in caches:
                    run = simulate(base.with_policy(policy).at_rate(scale).with_prefix_cache(cache == "on"))
                    cell = (policy, scale, cache)
                    walls[cell] = min(walls.get(cell, run.sim_wall_s), run.sim_wall_s)
                    attained[cell] = run.summary.attainment
    for policy in policies:
        for scale in scales:
            for cache in caches:
                key, wall = f"{policy}@{scale:g}/{cache}", walls[policy, scale, cache]
                out[key], shares[key] = len(base.trace) / wall, walls[REFERENCE, scale, cache] / wall
                rows.append([policy, f"{scale:g}", cache, str(len(base.trace)), f"{wall:.3f}",
                             f"{out[key]:,.0f}", f"{shares[key]:.2f}",
                             f"{attained[policy, scale, cache]:.3f}"])
    if args.json:
        print(json.dumps({"requests_per_s": out, "share_of_colocated": shares, "compiled": native.running()}))
    else:
        print("compiled (tropical native)" if native.running() else "plain Python")
        print(render(["policy", "rate scale", "prefix cache", "requests", "wall s", "req/s", "of colocated",
                      "attainment"], rows))


if __name__ == "__main__":
    main()
