"""How the simulator and the policies scale with the cluster: the same per-worker load at every size.

Usage: python benchmarks/scale.py [--sizes 4,16,64,256,1024] [--policies a,b] [--limit 8000]
                                  [--rate-per-worker 0.35] [--out DIR] [--json]
Each cell runs ``tropical sim`` on the conversation trace's lengths with Poisson arrivals at
``--rate-per-worker`` times the number of workers, in a process of its own (so its peak memory
is its own), and reports the process wall and CPU time (start-up included; the CPU time per
request is the measure, as a shared machine stretches the wall), simulated requests per wall
second of simulation, the decision latency P50/P99 (one arrival or iteration end, as a live
router would spend it), attainment and peak resident memory. The last column is each policy's
growth in CPU time per request from the smallest size to the largest, measured in this one run.
With ``--out`` it also draws the CPU time per request against the workers (scale.png).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tropical.report.tables import render
from tropical.sched.registry import policy_names

SIM = [sys.executable, "-c", "import sys; from tropical.cli import main; sys.exit(main())"]


@dataclass(frozen=True)
class Cell:
    """One policy at one size."""

    policy: str
    workers: int
    wall_s: float
    cpu_s: float
    sim_wall_s: float
    requests: int
    decision_p50_us: float
    decision_p99_us: float
    attainment: float
    peak_mb: float

    @property
    def per_request_ms(self) -> float:
        """Process CPU time per request: what the wall would be on an idle core (a shared
        machine stretches the wall, not the CPU time)."""
        return self.cpu_s / self.requests * 1e3


def run_cell(policy: str, workers: int, limit: int, rate_per_worker: float) -> Cell:
    """``tropical sim`` in a child process, timed from outside, its peak RSS from wait4."""
    args = [*SIM, "sim", "--policy", policy, "--trace", "conversation", "--workers", str(workers),
            "--arrivals", "poisson", "--rate", str(rate_per_worker * workers), "--limit", str(limit),
            "--json"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        child = subprocess.Popen(args, stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if child.returncode:
            raise SystemExit(f"tropical sim --policy {policy} --workers {workers} failed: "
                             f"{err.read().decode()[-400:]}")
        data = json.loads(out.read())
    return Cell(policy, workers, wall, usage.ru_utime + usage.ru_stime, data["sim_wall_s"], data["requests"],
                data["decision_p50_us"],
                data["decision_p99_us"], data["attainment"], usage.ru_maxrss / 1024)


def table(cells: list[Cell]) -> str:
    by_policy: dict[str, list[Cell]] = {}
    for cell in cells:
        by_policy.setdefault(cell.policy, []).append(cell)
    rows = []
    for policy, runs in by_policy.items():
        growth = runs[-1].per_request_ms / runs[0].per_request_ms
        for cell in runs:
            rows.append([policy, str(cell.workers), f"{cell.wall_s:.2f}", f"{cell.cpu_s:.2f}",
                         f"{cell.per_request_ms:.3f}",
                         f"{cell.requests / cell.sim_wall_s:,.0f}", f"{cell.decision_p50_us:.0f}",
                         f"{cell.decision_p99_us:.0f}", f"{cell.attainment:.3f}", f"{cell.peak_mb:.0f}",
                         f"{growth:.2f}x" if cell is runs[-1] else ""])
    return render(["policy", "workers", "wall s", "CPU s", "CPU ms/request", "sim req/s", "decision P50 us",
                   "decision P99 us", "attainment", "peak MB", "growth"], rows)


def plot(cells: list[Cell], out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in dict.fromkeys(c.policy for c in cells):
        runs = [c for c in cells if c.policy == policy]
        ax.plot([c.workers for c in runs], [c.per_request_ms for c in runs], marker="o", label=policy)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers (same load per worker)")
    ax.set_ylabel("process CPU time per request (ms)")
    ax.legend(fontsize=7)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "scale.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16,64,256,1024")
    parser.add_argument("--policies", default=",".join(policy_names()))
    parser.add_argument("--limit", type=int, default=8000)
    parser.add_argument("--rate-per-worker", type=float, default=0.35)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    cells = [run_cell(policy, n, args.limit, args.rate_per_worker)
             for policy in args.policies.split(",") for n in sizes]
    if args.json:
        print(json.dumps([{**c.__dict__, "per_request_ms": c.per_request_ms} for c in cells]))
        return
    print(table(cells))
    if args.out is not None:
        print(f"plot: {plot(cells, args.out)}")


if __name__ == "__main__":
    main()
