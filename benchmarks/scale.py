"""How the simulator and the policies scale with the cluster: the same per-worker load at every size.

Usage: python benchmarks/scale.py [--sizes 4,16,64,256,1024] [--policies a,b] [--limit 12000]
                                  [--rate-per-worker 0.1] [--out DIR] [--json]
Each cell simulates the conversation trace's lengths with Poisson arrivals at ``--rate-per-worker``
times the number of workers (the preset cluster's workers, ``tropical sim``'s defaults), in a
process of its own (so its peak memory is its own). A cell's cost is the CPU time of the
simulation alone (start-up and building the workers left out; a shared machine stretches the
wall, not the CPU time), reported two ways:
- per request, which is what the issue's target measures;
- per event, an event being one arrival or one iteration a worker runs (decode iterations
  included, though the simulator books a run of them at once). A short run at a thousand
  workers is a transient of tiny batches, each request costing more iterations than in a long
  overloaded run at four, so the per-request growth mixes the decisions' cost with the work per
  request; the per-event growth does not.
Also: events per request, simulated requests per wall second, the decision latency P50/P99 (one
arrival or iteration end, as a live router would spend it), attainment, the share of the offered
rate served (``kept up``: near 1 when the cluster sustains the load) and peak resident memory.
The growth columns are each policy's ratio from the smallest size to the largest, measured in
this one run. The default load (0.1 req/s per worker, 12,000 requests) is one every policy
sustains at every size; the issue's setting is ``--rate-per-worker 0.35 --limit 8000``. With
``--out`` it also draws the CPU time per request and per event against the workers (scale.png).
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


@dataclass(frozen=True)
class Cell:
    """One policy at one size."""

    policy: str
    workers: int
    sim_cpu_s: float
    sim_wall_s: float
    requests: int
    events: int
    decision_p50_us: float
    decision_p99_us: float
    attainment: float
    kept_up: float
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
    def events_per_request(self) -> float:
        return self.events / self.requests


def child(policy: str, workers: int, limit: int, rate: float) -> None:
    """One cell in this process: ``tropical sim``'s experiment, its simulation's CPU time and events."""
    from tropical.config import SimConfig
    from tropical.sim.build import experiment
    from tropical.sim.run import simulate

    cfg = SimConfig().with_preset().updated(
        {"policy": policy, "trace": "conversation", "workers": workers, "arrivals": "poisson",
         "rate": rate, "limit": limit}, "benchmarks/scale.py")
    exp = experiment(cfg)
    started = time.process_time()
    result = simulate(exp)
    cpu = time.process_time() - started
    data = result.as_dict()
    iterations = sum(s.iterations for s in result.worker_stats)
    print(json.dumps({"sim_cpu_s": cpu, "sim_wall_s": result.sim_wall_s, "requests": data["requests"],
                      "events": iterations + data["requests"], "decision_p50_us": data["decision_p50_us"],
                      "decision_p99_us": data["decision_p99_us"], "attainment": data["attainment"],
                      "kept_up": data["throughput_rps"] / data["rate_rps"]}))


def run_cell(policy: str, workers: int, limit: int, rate_per_worker: float) -> Cell:
    """``child`` in a process of its own, its peak RSS from wait4."""
    rate = rate_per_worker * workers
    args = [sys.executable, __file__, "--child", policy, str(workers), str(limit), str(rate)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"{policy} at {workers} workers failed: {err.read().decode()[-400:]}")
        data = json.loads(out.read().splitlines()[-1])
    return Cell(policy, workers, peak_mb=usage.ru_maxrss / 1024, **data)


def table(cells: list[Cell]) -> str:
    by_policy: dict[str, list[Cell]] = {}
    for cell in cells:
        by_policy.setdefault(cell.policy, []).append(cell)
    rows = []
    for policy, runs in by_policy.items():
        first, last = runs[0], runs[-1]
        for cell in runs:
            growth = cell is last and len(runs) > 1
            rows.append([policy, str(cell.workers), f"{cell.sim_cpu_s:.2f}", f"{cell.per_request_ms:.3f}",
                         f"{cell.events_per_request:.0f}", f"{cell.per_event_us:.2f}",
                         f"{cell.requests / cell.sim_wall_s:,.0f}", f"{cell.decision_p50_us:.0f}",
                         f"{cell.decision_p99_us:.0f}", f"{cell.attainment:.3f}", f"{cell.kept_up:.3f}",
                         f"{cell.peak_mb:.0f}",
                         f"{last.per_request_ms / first.per_request_ms:.2f}x" if growth else "",
                         f"{last.per_event_us / first.per_event_us:.2f}x" if growth else ""])
    return render(["policy", "workers", "sim CPU s", "CPU ms/request", "events/request", "CPU us/event",
                   "sim req/s", "decision P50 us", "decision P99 us", "attainment", "kept up", "peak MB",
                   "growth/request", "growth/event"], rows)


def plot(cells: list[Cell], out: Path) -> Path:
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


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        policy, workers, limit, rate = sys.argv[2:6]
        child(policy, int(workers), int(limit), float(rate))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16,64,256,1024")
    parser.add_argument("--policies", default=",".join(policy_names()))
    parser.add_argument("--limit", type=int, default=12000)
    parser.add_argument("--rate-per-worker", type=float, default=0.1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    cells = [run_cell(policy, n, args.limit, args.rate_per_worker)
             for policy in args.policies.split(",") for n in sizes]
    if args.json:
        print(json.dumps([{**c.__dict__, "per_request_ms": c.per_request_ms, "per_event_us": c.per_event_us}
                          for c in cells]))
        return
    print(f"{args.limit} requests, {args.rate_per_worker:g} req/s per worker")
    print(table(cells))
    if args.out is not None:
        print(f"plot: {plot(cells, args.out)}")


if __name__ == "__main__":
    main()
