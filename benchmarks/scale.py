"""How the simulator and the policies scale with the cluster: the same per-worker load at every size.

Usage: python benchmarks/scale.py [--sizes 4,16,64,256,1024] [--policies a,b] [--limit 12000]
                                  [--rate-per-worker 0.1] [--tree LABEL=SRC[:NATIVE_DIR]]...
                                  [--out DIR] [--json]
Each cell simulates the conversation trace's lengths with Poisson arrivals at ``--rate-per-worker``
times the number of workers (the preset cluster's workers, ``tropical sim``'s defaults), in a
process of its own (so its peak memory is its own). A cell's cost is the CPU time of the
simulation alone (start-up and building the workers left out; a shared machine stretches the
wall, not the CPU time), reported three ways:
- per request, which is what the issue's target measures;
- per event, an event being one arrival or one iteration a worker runs (decode iterations
  included): what a live router would see. A short run at a thousand workers is a transient of
  tiny batches, each request costing more iterations than in a long overloaded run at four, so
  the per-request growth mixes the decisions' cost with the work per request; the per-event
  growth does not;
- per booking, a booking being an arrival, an iteration's end, or a decode run booked in part
  to bring a worker up to date for a decision: what the simulator itself processes. A run of
  decode iterations between two decisions is booked at once, so at a few workers one booking
  covers many iterations; at a thousand, decisions come faster than any one worker's
  iterations and every iteration is booked on its own.
Also: events and bookings per request, simulated requests per wall second, the decision latency
P50/P99 (one arrival or iteration end, as a live router would spend it), attainment, the mean
time a request queued before its prefill (near zero when the cluster sustains the load) and
peak resident memory. The growth columns are each policy's ratio from the smallest size to the
largest, measured in this one run. ``--tree`` (repeatable) runs every cell in each of several
source trees (``SRC`` on ``PYTHONPATH``, its compiled build in ``NATIVE_DIR``), one after the
other per cell, to compare them side by side. The default load (0.1 req/s per worker, 12,000
requests) is one every policy sustains at every size; the issue's setting is
``--rate-per-worker 0.35 --limit 8000``. With ``--out`` it also draws the CPU time per request
and per event against the workers (scale.png; the last tree's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tropical.report.tables import render
from tropical.sched.registry import policy_names


@dataclass(frozen=True)
class Tree:
    """Source tree to run the cells in: its ``src`` folder and the folder of its compiled build
    (None: this process's own)."""

    label: str
    src: str | None = None
    native_dir: str | None = None

    @classmethod
    def parse(cls, text: str) -> Tree:
        label, sep, where = text.partition("=")
        if not sep or not label or not where:
            raise SystemExit(f"--tree {text!r}: expected LABEL=SRC[:NATIVE_DIR]")
        src, _, native = where.partition(":")
        return cls(label, src, native or None)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.src is not None:
            env["PYTHONPATH"] = self.src
        if self.native_dir is not None:
            env["TROPICAL_NATIVE_DIR"] = self.native_dir
        return env


@dataclass(frozen=True)
class Cell:
    """One policy at one size in one tree."""

    tree: str
    policy: str
    workers: int
    native: bool
    sim_cpu_s: float
    sim_wall_s: float
    requests: int
    events: int
    bookings: int
    decision_p50_us: float
    decision_p99_us: float
    attainment: float
    queue_mean_s: float
    peak_mb: float

    @property
    def per_request_ms(self) -> float:
        """Simulation CPU time per request."""
        return self.sim_cpu_s / self.requests * 1e3

    @property
    def per_event_us(self) -> float:
        """Simulation CPU time per event (arrival or iteration)."""
        return self.sim_cpu_s / self.events * 1e6

    @property
    def per_booking_us(self) -> float:
        """Simulation CPU time per booking (arrival, iteration end or partly booked decode run)."""
        return self.sim_cpu_s / self.bookings * 1e6


def simulated(policy: str, workers: int, limit: int, rate: float, source: str) -> tuple[Any, Any, float]:
    """``tropical sim``'s experiment on the conversation trace's lengths with Poisson arrivals at
    ``rate``, run here: its result, its simulator (caught as ``simulate`` builds it, to read its
    counts) and the simulation's CPU time."""
    from tropical.config import SimConfig
    from tropical.sim import run
    from tropical.sim.build import experiment

    built = []

    def caught(*args: object, **kwargs: object) -> object:
        built.append(simulator(*args, **kwargs))
        return built[-1]

    simulator, run.Simulator = run.Simulator, caught
    cfg = SimConfig().with_preset().updated(
        {"policy": policy, "trace": "conversation", "workers": workers, "arrivals": "poisson",
         "rate": rate, "limit": limit}, source)
    exp = experiment(cfg)
    started = time.process_time()
    result = run.simulate(exp)
    return result, built[0], time.process_time() - started


def child(policy: str, workers: int, limit: int, rate: float) -> None:
    """One cell in this process: its simulation's CPU time, events and bookings."""
    from tropical import native

    result, sim, cpu = simulated(policy, workers, limit, rate, "benchmarks/scale.py")
    data = result.as_dict()
    iterations = sum(s.iterations for s in result.worker_stats)
    print(json.dumps({"native": native.running(), "sim_cpu_s": cpu, "sim_wall_s": result.sim_wall_s,
                      "requests": data["requests"], "events": iterations + data["requests"],
                      "bookings": len(sim.decision_s) + sim.settled,
                      "decision_p50_us": data["decision_p50_us"], "decision_p99_us": data["decision_p99_us"],
                      "attainment": data["attainment"], "queue_mean_s": data["queue_mean_s"]}))


def run_cell(tree: Tree, policy: str, workers: int, limit: int, rate_per_worker: float) -> Cell:
    """``child`` in a process of its own, its peak RSS from wait4."""
    rate = rate_per_worker * workers
    args = [sys.executable, __file__, "--child", policy, str(workers), str(limit), str(rate)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, stdout=out, stderr=err, env=tree.env())
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"{policy} at {workers} workers ({tree.label}) failed: "
                             f"{err.read().decode()[-400:]}")
        data = json.loads(out.read().splitlines()[-1])
    return Cell(tree.label, policy, workers, peak_mb=usage.ru_maxrss / 1024, **data)


def table(cells: list[Cell]) -> str:
    runs_of: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        runs_of.setdefault((cell.policy, cell.tree), []).append(cell)
    rows = []
    for (policy, tree), runs in runs_of.items():
        first, last = runs[0], runs[-1]
        for cell in runs:
            growth = cell is last and len(runs) > 1
            rows.append([policy, tree, str(cell.workers), "yes" if cell.native else "no",
                         f"{cell.sim_cpu_s:.2f}", f"{cell.per_request_ms:.3f}",
                         f"{cell.events / cell.requests:.0f}", f"{cell.per_event_us:.2f}",
                         f"{cell.bookings / cell.requests:.0f}", f"{cell.per_booking_us:.2f}",
                         f"{cell.requests / cell.sim_wall_s:,.0f}", f"{cell.decision_p50_us:.0f}",
                         f"{cell.decision_p99_us:.0f}", f"{cell.attainment:.3f}", f"{cell.queue_mean_s:.2f}",
                         f"{cell.peak_mb:.0f}",
                         f"{last.per_request_ms / first.per_request_ms:.2f}x" if growth else "",
                         f"{last.per_event_us / first.per_event_us:.2f}x" if growth else "",
                         f"{last.per_booking_us / first.per_booking_us:.2f}x" if growth else ""])
    return render(["policy", "tree", "workers", "compiled", "sim CPU s", "CPU ms/request", "events/request",
                   "CPU us/event", "bookings/request", "CPU us/booking", "sim req/s", "decision P50 us",
                   "decision P99 us", "attainment", "queue mean s", "peak MB", "growth/request",
                   "growth/event", "growth/booking"], rows)


def plot(cells: list[Cell], out: Path) -> Path:
    cells = [c for c in cells if c.tree == cells[-1].tree]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (per_request, per_event) = plt.subplots(1, 2, figsize=(10, 4))
    for policy in dict.fromkeys(c.policy for c in cells):
        runs = [c for c in cells if c.policy == policy]
        sizes = [c.workers for c in runs]
        per_request.plot(sizes, [c.per_request_ms for c in runs], marker="o", label=policy)
        per_event.plot(sizes, [c.per_event_us for c in runs], marker="o", label=policy)
    for ax, label in ((per_request, "simulation CPU time per request (ms)"),
                      (per_event, "simulation CPU time per event (us)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers (same load per worker)")
        ax.set_ylabel(label)
    per_request.legend(fontsize=7)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "scale.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def ran_as_child(run: Callable[[str, int, int, float], None]) -> bool:
    """Is this process a cell's (``--child POLICY WORKERS LIMIT RATE``)? If so, run it here."""
    if sys.argv[1:2] != ["--child"]:
        return False
    policy, workers, limit, rate = sys.argv[2:6]
    run(policy, int(workers), int(limit), float(rate))
    return True


def main() -> None:
    if ran_as_child(child):
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16,64,256,1024")
    parser.add_argument("--policies", default=",".join(policy_names()))
    parser.add_argument("--limit", type=int, default=12000)
    parser.add_argument("--rate-per-worker", type=float, default=0.1)
    parser.add_argument("--tree", action="append", type=Tree.parse, default=[],
                        help="LABEL=SRC[:NATIVE_DIR], repeatable: run every cell in each tree")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    trees = args.tree or [Tree("this")]
    cells = [run_cell(tree, policy, n, args.limit, args.rate_per_worker)
             for policy in args.policies.split(",") for n in sizes for tree in trees]
    cells.sort(key=lambda c: [t.label for t in trees].index(c.tree))
    if args.json:
        print(json.dumps([{**c.__dict__, "per_request_ms": c.per_request_ms, "per_event_us": c.per_event_us,
                           "per_booking_us": c.per_booking_us} for c in cells]))
        return
    print(f"{args.limit} requests, {args.rate_per_worker:g} req/s per worker")
    print(table(cells))
    if args.out is not None:
        print(f"plot: {plot(cells, args.out)}")


if __name__ == "__main__":
    main()
