"""Path 2's shortlist size side by side: decision time under a burst, attainment near capacity.

Usage: python benchmarks/shortlist.py [--sizes 16,8,4] [--policy tropical+] [--repeats 1] [--json]
                                      [--cells TRACE:WORKERS:RATE[:LIMIT],...]
Each cell is ``tropical sim --trace TRACE --workers WORKERS --arrivals poisson --rate RATE``
with ``--shortlist`` set to each size in turn, runs alternating between the sizes (``--repeats``
rounds), in this process, compiled where ``tropical native build`` built these sources. The
default cells are the 12,000-request burst at 1,024 workers (issue 38's decision P99) and
fleets of 64, 256 and 1,024 workers near their capacity on the conversation and synthetic
traces (where Path 2 chooses among more workers than any shortlist holds). It reports, per
cell and size, the attainment, the prefix hit rate, the decision P50/P99 and the simulator's
wall time, and each size's attainment less the first size's.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from tropical import native
from tropical.config import SimConfig
from tropical.report.tables import render
from tropical.sim.build import experiment
from tropical.sim.run import simulate

CELLS = ("conversation:1024:100000:12000,conversation:64:32,conversation:64:36,conversation:64:44,"
         "conversation:256:170,synthetic:64:70,conversation:1024:700")
"""The burst, then fleets near capacity (rates per fleet, req/s)."""


@dataclass(frozen=True)
class Cell:
    """One workload: a trace at a Poisson rate on a fleet, its first ``limit`` requests (all)."""

    trace: str
    workers: int
    rate: float
    limit: int | None

    @classmethod
    def parse(cls, text: str) -> Cell:
        parts = text.split(":")
        if len(parts) not in (3, 4):
            raise SystemExit(f"--cells {text!r}: expected TRACE:WORKERS:RATE[:LIMIT]")
        return cls(parts[0], int(parts[1]), float(parts[2]), int(parts[3]) if len(parts) == 4 else None)

    def label(self) -> str:
        return f"{self.trace} x{self.workers} @{self.rate:g}"


def run(cell: Cell, policy: str, size: int) -> dict:
    """One simulation of ``cell`` with shortlists of ``size``."""
    cfg = SimConfig().with_preset().updated(
        {"policy": policy, "trace": cell.trace, "workers": cell.workers, "arrivals": "poisson",
         "rate": cell.rate, "limit": cell.limit, "shortlist": size}, "benchmarks/shortlist.py")
    result = simulate(experiment(cfg))
    p50, p99 = result.decision_us
    return {"attainment": result.summary.attainment, "prefix_hit_rate": result.summary.prefix_hit_rate,
            "decision_p50_us": p50, "decision_p99_us": p99, "wall_s": result.sim_wall_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,8,4")
    parser.add_argument("--policy", default="tropical+")
    parser.add_argument("--cells", default=CELLS)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    cells = [Cell.parse(c) for c in args.cells.split(",")]
    runs: dict[tuple[Cell, int], list[dict]] = {}
    for cell in cells:
        for _ in range(args.repeats):
            for size in sizes:
                runs.setdefault((cell, size), []).append(run(cell, args.policy, size))
    out, rows = [], []
    for cell in cells:
        first = runs[cell, sizes[0]][0]["attainment"]
        for size in sizes:
            for r in runs[cell, size]:
                out.append({"cell": cell.label(), "shortlist": size, **r})
                rows.append([cell.label(), str(size), f"{r['attainment']:.4f}",
                             f"{100 * (r['attainment'] - first):+.2f}", f"{r['prefix_hit_rate']:.3f}",
                             f"{r['decision_p50_us']:.0f} / {r['decision_p99_us']:.0f}",
                             f"{r['wall_s']:.2f}"])
    if args.json:
        print(json.dumps({"native": native.running(), "policy": args.policy, "runs": out}, indent=1))
        return
    print(f"{args.policy}, {'compiled' if native.running() else 'plain Python'}")
    print(render(["cell", "shortlist", "attainment", "vs first (points)", "hit rate",
                  "decision P50 / P99 us", "wall s"], rows))


if __name__ == "__main__":
    main()
