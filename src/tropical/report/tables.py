"""Plain-text tables for the terminal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tropical.sim.run import SimResult
from tropical.sim.sweep import PolicyCapacity


def render(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, numbers right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    body = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


def summary_table(result: SimResult) -> str:
    """Latency percentiles and attainment of one simulated run."""
    s = result.summary
    exp = result.experiment
    rows = [[name, *(f"{getattr(dist, p):.3f}" for p in ("p50", "p90", "p99"))]
            for name, dist in (("TTFT (s)", s.ttft), ("TPOT (s)", s.tpot),
                               ("queueing (s)", s.queueing), ("E2E (s)", s.e2e))]
    head = (f"{exp.policy} on {exp.cluster.name} cluster, trace {exp.trace.name} "
            f"({s.requests} requests at {exp.rate_scale:g}x = "
            f"{exp.rate_scale * exp.trace.mean_rate:.2f} req/s)")
    tail = (f"SLO attainment {s.attainment:.1%}   completed {s.completed}   failed {s.failed}   "
            f"throughput {s.throughput_rps:.2f} req/s, {s.output_tokens_per_s:.0f} tok/s   "
            f"paths {s.paths}   simulated in {result.sim_wall_s:.2f} s")
    return "\n".join([head, render(["metric", "p50", "p90", "p99"], rows), tail])


def capacity_table(found: Mapping[str, PolicyCapacity], target: float) -> str:
    """Each policy's goodput capacity and its ratio to the best of the others."""
    best = max((c.capacity_rps for c in found.values()), default=0.0)
    rows = [[p, f"{c.capacity_rps:.3f}", f"{c.result.rate_scale:.3f}",
             f"{c.capacity_rps / best:.2f}" if best else "-", str(len(c.result.probes)), f"{c.wall_s:.1f}"]
            for p, c in found.items()]
    return (f"goodput capacity at {target:.0%} SLO attainment\n"
            + render(["policy", "req/s", "rate scale", "vs best", "sims", "search s"], rows))
