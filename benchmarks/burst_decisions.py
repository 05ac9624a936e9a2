"""Decision latency under a burst: every request at once on a large fleet, trees side by side.

Usage: python benchmarks/burst_decisions.py [--policies tropical+,tropical] [--workers 1024]
                                            [--limit 12000] [--rate 100000] [--repeats 3]
                                            [--tree LABEL=SRC[:NATIVE_DIR]]... [--json]
Each run is ``tropical sim --policy P --trace conversation --workers W --arrivals poisson --rate R
--limit N`` (issue 38's burst: 12,000 requests within about a tenth of a second, so about 10,000
are queued at 1,024 workers), in a process of its own, compiled where the tree's build is. It
reports the simulation's CPU time, the decision latency P50/P99 over every decision, over
arrivals and over iteration ends apart (where the tree's simulator times them apart), the
attainment, and a hash of every request's path, workers, hit and times, so that trees that must
decide alike can be seen to. Runs alternate between the trees (``--tree``, as in
``benchmarks/scale.py``), ``--repeats`` times each, so that a host's drift falls on all of them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scale import Tree, ran_as_child, simulated  # noqa: E402
from tropical.report.tables import render  # noqa: E402


def percentiles(seconds: list[float]) -> list[float] | None:
    """P50 and P99 in microseconds, as ``tropical sim`` reports them (None: no such decisions,
    as in a tree whose simulator does not time them apart)."""
    from tropical.sim.run import decision_percentiles

    return list(decision_percentiles(seconds)) if seconds else None


def child(policy: str, workers: int, limit: int, rate: float) -> None:
    """One run in this process; prints its numbers as JSON."""
    from tropical import native

    result, sim, cpu = simulated(policy, workers, limit, rate, "benchmarks/burst_decisions.py")
    digest = hashlib.sha256()
    for r in result.requests:
        digest.update(repr((r.id, r.path, r.prefill_worker, r.decode_worker, r.cached, r.first_token,
                            r.finish)).encode())
    print(json.dumps({"native": native.running(), "cpu_s": cpu, "all_us": list(result.decision_us),
                      "arrivals_us": percentiles(getattr(sim, "arrival_s", [])),
                      "ends_us": percentiles(getattr(sim, "end_s", [])),
                      "attainment": result.summary.attainment, "requests": digest.hexdigest()[:16]}))


def run_one(tree: Tree, policy: str, args: argparse.Namespace) -> dict:
    """``child`` in a process of its own."""
    sizes = (str(args.workers), str(args.limit), str(args.rate))
    command = [sys.executable, __file__, "--child", policy, *sizes]
    done = subprocess.run(command, env=tree.env(), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{policy} in {tree.label} failed: {done.stderr[-400:]}")
    return {"tree": tree.label, "policy": policy, **json.loads(done.stdout.splitlines()[-1])}


def cell(pair: list[float] | None) -> str:
    return "-" if pair is None else f"{pair[0]:.0f} / {pair[1]:.0f}"


def main() -> None:
    if ran_as_child(child):
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="tropical+,tropical")
    parser.add_argument("--workers", type=int, default=1024)
    parser.add_argument("--limit", type=int, default=12_000)
    parser.add_argument("--rate", type=float, default=100_000.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tree", action="append", type=Tree.parse, default=[])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trees = args.tree or [Tree("this")]
    runs = [run_one(tree, policy, args) for _ in range(args.repeats)
            for policy in args.policies.split(",") for tree in trees]
    if args.json:
        print(json.dumps(runs, indent=2))
        return
    print(f"{args.limit} requests at {args.rate:g} req/s on {args.workers} workers")
    print(render(["policy", "tree", "compiled", "CPU s", "P50 / P99 us", "arrivals P50 / P99 us",
                  "ends P50 / P99 us", "attainment", "requests"],
                 [[r["policy"], r["tree"], "yes" if r["native"] else "no", f"{r['cpu_s']:.1f}",
                   cell(r["all_us"]), cell(r["arrivals_us"]), cell(r["ends_us"]), f"{r['attainment']:.4f}",
                   r["requests"]] for r in runs]))


if __name__ == "__main__":
    main()
