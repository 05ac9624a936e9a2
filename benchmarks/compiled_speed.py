"""How much faster the simulator runs compiled with mypyc, and whether it decides alike.

Usage: python benchmarks/compiled_speed.py [--limit 3000] [--policies colocated,tropical,tropical+]
       [--rate-scales 0.35,1.0] [--rounds 2] [--json]
Builds the compiled simulator for these sources (``tropical native build``) unless it exists,
then runs each policy and rate scale compiled and plain (``TROPICAL_NATIVE=0``), each run in a
fresh process, alternating the two (the host's speed drifts), and reports each cell's best wall
time both ways, their ratio, and whether every request's first token, finish, path and longest
gap came out identical. Needs mypy (the test or native extra) and a C compiler; a build takes a
minute or two.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys

from tropical import native
from tropical.report.tables import render


def child(policy: str, scale: float, limit: int) -> None:
    """One simulation, in this process: its wall time and its requests' fingerprint as JSON."""
    from tropical.config import SimConfig
    from tropical.sim.build import experiment
    from tropical.sim.run import simulate

    exp = experiment(SimConfig(limit=limit or None).with_preset())
    result = simulate(exp.with_policy(policy).at_rate(scale))
    decided = repr([(r.id, r.first_token, r.finish, r.path.value, r.max_gap) for r in result.requests])
    print(json.dumps({"wall_s": result.sim_wall_s, "compiled": native.running(),
                      "fingerprint": hashlib.sha256(decided.encode()).hexdigest()}))


def run(compiled: bool, policy: str, scale: float, limit: int) -> dict:
    """``child`` in a fresh process, compiled or plain."""
    env = {k: v for k, v in os.environ.items() if k != "TROPICAL_NATIVE"}
    if not compiled:
        env["TROPICAL_NATIVE"] = "0"
    done = subprocess.run([sys.executable, __file__, "--child", policy, str(scale), str(limit)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=3000, help="first N requests of the trace (0: all)")
    parser.add_argument("--policies", default="colocated,tropical,tropical+")
    parser.add_argument("--rate-scales", default="0.35,1.0")
    parser.add_argument("--rounds", type=int, default=2, help="runs per tree and cell (best is kept)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], float(args.child[1]), int(args.child[2]))
        return
    cells = [(p, float(s)) for p in args.policies.split(",") for s in args.rate_scales.split(",")]
    native.build()
    runs: dict[tuple[str, tuple[str, float]], list[dict]] = {}
    for cell in cells:
        for _ in range(args.rounds):
            for tree in ("plain", "compiled"):
                runs.setdefault((tree, cell), []).append(run(tree == "compiled", *cell, args.limit))
    out, rows = {}, []
    for policy, scale in cells:
        plain, compiled = runs["plain", (policy, scale)], runs["compiled", (policy, scale)]
        best = {name: min(r["wall_s"] for r in rs) for name, rs in (("plain", plain), ("compiled", compiled))}
        alike = len({r["fingerprint"] for r in plain + compiled}) == 1
        if not all(r["compiled"] for r in compiled) or any(r["compiled"] for r in plain):
            raise SystemExit("a run did not run as asked: check TROPICAL_NATIVE and `tropical native status`")
        out[f"{policy}@{scale:g}"] = {**{f"{k}_wall_s": v for k, v in best.items()},
                                      "speedup": best["plain"] / best["compiled"], "identical": alike}
        rows.append([policy, f"{scale:g}", f"{best['plain']:.3f}", f"{best['compiled']:.3f}",
                     f"{best['plain'] / best['compiled']:.2f}x", "yes" if alike else "NO"])
    if args.json:
        print(json.dumps({"requests": args.limit, "left_pure": sorted(native.LEFT_PURE), "cells": out}))
        return
    requests = f"first {args.limit}" if args.limit else "all"
    pure = ", ".join(f"{m} ({why})" for m, why in native.LEFT_PURE.items())
    print(f"{requests} requests, best of {args.rounds} runs per tree; left as Python: {pure}")
    print(render(["policy", "rate scale", "plain s", "compiled s", "speedup", "identical"], rows))


if __name__ == "__main__":
    main()
