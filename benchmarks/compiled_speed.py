"""How much faster the simulator runs compiled with mypyc, and whether it decides alike.

Usage: python benchmarks/compiled_speed.py [--limit 3000] [--policies colocated,tropical,tropical+]
       [--rate-scales 0.35,1.0] [--rounds 2] [--json]
Copies ``src/`` to a scratch folder, compiles there with mypyc the modules a simulation runs
(``COMPILED`` less ``LEFT_PURE``), then runs each policy and rate scale from the plain tree and
from the compiled one, each run in a fresh process, alternating the two trees (the host's speed
drifts), and reports each cell's best wall time both ways, their ratio, and whether every
request's first token, finish, path and longest gap came out identical. Nothing in the project
runs compiled: this measures what compiling would buy. Needs mypy (the test extra) and a C
compiler; the build takes a minute or two.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tropical.report.tables import render

ROOT = Path(__file__).resolve().parents[1]
COMPILED = ("tropical/core", "tropical/sched", "tropical/sim/simulator.py", "tropical/sim/decode_run.py",
            "tropical/sim/cluster.py")
"""What a simulation runs once the trace is loaded: the pure layers and the simulator's own loop."""
LEFT_PURE = {
    "tropical/core/latency/model.py": "a runtime-checkable Protocol",
    "tropical/sched/rules.py": "an Enum whose members set attributes in __init__",
    "tropical/sched/risk.py": "a generic class (mypyc's native classes cannot be generic)",
}
"""Modules mypyc cannot compile as written, and why; they run as Python beside the others."""


def sources(src: Path) -> list[str]:
    """The files to compile under ``src``, relative to it."""
    files = []
    for entry in COMPILED:
        path = src / entry
        files += [str(p.relative_to(src)) for p in sorted(path.rglob("*.py"))] if path.is_dir() else [entry]
    return [f for f in files if f not in LEFT_PURE]


def build(scratch: Path) -> Path:
    """A copy of ``src/`` with ``sources`` compiled in place; returns its ``src``."""
    src = scratch / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    done = subprocess.run([sys.executable, "-m", "mypyc", *sources(src)], cwd=src, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"mypyc failed:\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    return src


def child(policy: str, scale: float, limit: int) -> None:
    """One simulation, in this process: its wall time and its requests' fingerprint as JSON."""
    from tropical.config import SimConfig
    from tropical.sim.build import experiment
    from tropical.sim.run import simulate

    exp = experiment(SimConfig(limit=limit or None).with_preset())
    result = simulate(exp.with_policy(policy).at_rate(scale))
    decided = repr([(r.id, r.first_token, r.finish, r.path.value, r.max_gap) for r in result.requests])
    compiled = Path(sys.modules["tropical.sched.worker"].__file__ or "").suffix == ".so"
    print(json.dumps({"wall_s": result.sim_wall_s, "compiled": compiled,
                      "fingerprint": hashlib.sha256(decided.encode()).hexdigest()}))


def run(src: Path, policy: str, scale: float, limit: int) -> dict:
    """``child`` in a fresh process importing tropical from ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
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
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"plain": ROOT / "src", "compiled": build(Path(scratch))}
        runs: dict[tuple[str, tuple[str, float]], list[dict]] = {}
        for cell in cells:
            for _ in range(args.rounds):
                for tree, src in trees.items():
                    runs.setdefault((tree, cell), []).append(run(src, *cell, args.limit))
    out, rows = {}, []
    for policy, scale in cells:
        plain, compiled = runs["plain", (policy, scale)], runs["compiled", (policy, scale)]
        best = {name: min(r["wall_s"] for r in rs) for name, rs in (("plain", plain), ("compiled", compiled))}
        alike = len({r["fingerprint"] for r in plain + compiled}) == 1
        if not all(r["compiled"] for r in compiled) or any(r["compiled"] for r in plain):
            raise SystemExit("a run imported the other tree's modules: check PYTHONPATH and the install")
        out[f"{policy}@{scale:g}"] = {**{f"{k}_wall_s": v for k, v in best.items()},
                                      "speedup": best["plain"] / best["compiled"], "identical": alike}
        rows.append([policy, f"{scale:g}", f"{best['plain']:.3f}", f"{best['compiled']:.3f}",
                     f"{best['plain'] / best['compiled']:.2f}x", "yes" if alike else "NO"])
    if args.json:
        print(json.dumps({"requests": args.limit, "left_pure": sorted(LEFT_PURE), "cells": out}))
        return
    requests = f"first {args.limit}" if args.limit else "all"
    pure = ", ".join(f"{m} ({why})" for m, why in LEFT_PURE.items())
    print(f"{requests} requests, best of {args.rounds} runs per tree; left as Python: {pure}")
    print(render(["policy", "rate scale", "plain s", "compiled s", "speedup", "identical"], rows))


if __name__ == "__main__":
    main()
